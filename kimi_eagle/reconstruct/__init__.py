"""Stage 2: API text -> token IDs in the model's native chat format (formats, renderers, the batch job, converters)."""
