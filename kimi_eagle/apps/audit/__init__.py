"""Provider audit: do API providers return what the model itself produces? (``kimi-eagle audit``)."""
