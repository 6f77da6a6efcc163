"""`hybridspec serve`: an OpenAI-compatible HTTP server on the HybridSpec engine (DESIGN B.1).

    api.py      request bodies, the chat template, RequestError
    metrics.py  the /metrics counters, their Prometheus text and its parser
    service.py  the model, its policies, the FIFO queue and one request's decoding
    app.py      the routes, the app factory and `serve` (what the CLI runs)
"""
