"""Training of the embedded default pair (DESIGN B.6): corpus, tokenizer, target, drafter, prompts."""
