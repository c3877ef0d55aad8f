"""The one redaction of the API key (moved to the core module :mod:`kimi_eagle.redact`, so that the library's
readers redact a key found in a data field too); these names are kept here for the apps and tests that import them."""
from kimi_eagle.redact import BYTE_MASK, MIN_PREFIX, REDACTED, Redactor, split_key

__all__ = ["BYTE_MASK", "MIN_PREFIX", "REDACTED", "Redactor", "split_key"]
