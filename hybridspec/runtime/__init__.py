"""The HybridSpec runtime: target model, drafter, caches, length policies and the decoding round."""
