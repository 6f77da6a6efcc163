"""L2 prefetch of a tensor's bytes: `reference.py` (a prefetch changes no value, so nothing to do),
`triton.py` (one launch of `prefetch.global.L2` per 128-byte line, or of bulk prefetches by the
copy engine of each SM)."""
