"""kimi-eagle."""
