"""The Kimi chat formats: native renderers, completion segments, the piece encoder, tool declarations and the completion parser."""
