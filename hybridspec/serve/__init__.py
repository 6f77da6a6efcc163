"""`hybridspec serve`: an OpenAI-compatible HTTP server on the HybridSpec engine (DESIGN B.1).

    api.py      request bodies, the refused sampling fields, RequestError
    metrics.py  the Prometheus metrics (prometheus_client) and the demo's reader of /metrics
    service.py  the model, its policies, the FIFO queue and one request's decoding
    app.py      the routes, the gate middleware (auth, body cap, status counts, access log), `serve`
"""
