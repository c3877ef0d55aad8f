"""Stage 1: tokenizers and what is derived from them (special tokens, byte tables), probing, token chips."""
