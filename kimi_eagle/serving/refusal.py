"""A server's refusal of a request, as its request checks raise it (:mod:`~kimi_eagle.serving.vllm_request`,
:mod:`~kimi_eagle.serving.sglang_request`; :func:`~kimi_eagle.serving.request.serve_request` turns it into the row's
``<profile> would answer <status>: <reason>``), and the lone surrogates a request may hold (valid JSON, not valid
Unicode)."""
from __future__ import annotations

import re

LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class Refusal(ValueError):
    """A server's refusal of a request (its request checks: :mod:`~kimi_eagle.serving.vllm_request`,
    :mod:`~kimi_eagle.serving.sglang_request`): ``status`` and the reason, in the kit's words."""

    def __init__(self, reason: str, status: int = 400):
        super().__init__(reason)
        self.status = status
