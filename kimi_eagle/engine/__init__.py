"""A local engine with true token IDs: sampling, an OpenRouter-compatible server, fault injection, the API collector."""
