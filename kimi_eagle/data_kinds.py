"""One data-kind vocabulary for every ``metrics.json`` ``data`` field, page title, banner and chart tag (#35).

Shared module (issue #35): reports, notebooks and commands import these names instead of spelling kinds
themselves. A data kind says what the reader is looking at, first:

- ``real``: the thing studied: Kimi's tokenizer, a provider's answers for Kimi, a user's own SDK logs.
- ``simulated``: a labelled benchmark with injected effects (``kimi-eagle simulate``); its rates measure the
  classifier, or the injection rate a notebook set, never a provider.
- ``toy``: a small model that is not Kimi (stories260K, tiny-kimi) run through the real engine and API path;
  the kit works end to end, but its rates and tau say nothing about Kimi or any provider.
- ``stand-in: <what>``: local models standing in for providers (``stand-in: stories260K served locally``):
  the audit's machinery is real, its "providers" are not.

>>> stand_in("stories260K served locally")
'stand-in: stories260K served locally'
>>> base_kind(stand_in("stories260K served locally")), base_kind("toy")
('stand-in', 'toy')
>>> data_tag("simulated"), data_tag(STORIES_STAND_IN)
('[SIMULATED data]', '[STAND-IN data: stories260K served locally]')
>>> provider_kind("http://127.0.0.1:8000/v1", "stories260K"), provider_kind("https://openrouter.ai/api/v1", "k")
('stand-in: stories260K served locally', 'real')
"""

from __future__ import annotations

REAL = "real"
SIMULATED = "simulated"
TOY = "toy"
STAND_IN = "stand-in"
KINDS = (REAL, SIMULATED, TOY, STAND_IN)
STORIES_STAND_IN = "stand-in: stories260K served locally"  # the provider audit's local "providers"

WHAT = {
    REAL: "real data: Kimi's tokenizer, a provider's answers or your own logs",
    SIMULATED: "simulated data: a labelled benchmark with injected effects; its rates are set by the injection",
    TOY: ("toy model (not Kimi): a small model (stories260K or tiny-kimi) on the real engine and API path; "
          "its rates say nothing about Kimi or any provider"),
    STAND_IN: "stand-in: local models standing in for providers; the machinery is real, the providers are not",
}
TAGS = {REAL: "[REAL data]", SIMULATED: "[SIMULATED data]", TOY: "[REAL engine, toy model (not Kimi's rates)]"}
TOY_MODELS = {"stories260k": "stories260K", "tiny-kimi": "tiny-kimi", "tiny_kimi": "tiny-kimi"}
NOT_RECORDED = "[kind not recorded]"  # the tag of outputs whose inputs state no kind: never read as real (#46)


def stand_in(what: str) -> str:
    """The data label for local models standing in for providers: ``stand-in: <what>``."""
    return f"{STAND_IN}: {what}"


def base_kind(label: str) -> str:
    """The kind of ``label`` (one of :data:`KINDS`); ``ValueError`` naming the vocabulary for anything else."""
    kind = label.split(":", 1)[0].strip() if isinstance(label, str) else ""
    if kind not in KINDS or (kind == STAND_IN) != (":" in label and label.split(":", 1)[1].strip() != ""):
        raise ValueError(f"data kind must be one of {', '.join(KINDS[:3])} or 'stand-in: <what>', not {label!r}")
    return kind


def check(label: str) -> str:
    """``label`` itself once :func:`base_kind` accepts it (for ``data`` arguments and ``metrics.json``)."""
    base_kind(label)
    return label


def data_tag(label: str) -> str:
    """The tag a chart title of ``label`` starts with: ``[REAL data]``, ``[SIMULATED data]``,
    ``[TOY model, not Kimi]`` or ``[STAND-IN data: <what>]``."""
    kind = base_kind(label)
    return TAGS.get(kind) or f"[STAND-IN data: {label.split(':', 1)[1].strip()}]"


def describe(label: str) -> str:
    """One sentence for a banner: what ``label`` data is (and, for a stand-in, what stands in)."""
    kind = base_kind(label)
    return WHAT[kind] if kind != STAND_IN else f"{WHAT[STAND_IN]} ({label.split(':', 1)[1].strip()})"


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0")


def provider_kind(base_url: str, model: str) -> str:
    """The data kind of answers from ``base_url``: a server on this machine stands in for providers
    (``stand-in: <model> served locally``); anything else is :data:`REAL`."""
    from urllib.parse import urlsplit

    host = (urlsplit(str(base_url)).hostname or "").lower()
    return stand_in(f"{model or 'a local model'} served locally") if host in LOCAL_HOSTS or host.startswith("127.") else REAL


def model_kind(model: str) -> str:
    """The data kind of generations from ``model`` (a name or path): :data:`TOY` for stories260K and tiny-kimi,
    else :data:`REAL`."""
    low = str(model).lower()
    return TOY if any(name in low for name in TOY_MODELS) else REAL


def settle(stated: str | None, inferred: str, why: str, option: str = "--data") -> tuple[str, str | None]:
    """``(kind, note)``: the data kind to state, from the inputs (``inferred``, because ``why``) unless ``stated``
    (an option such as ``--data``) overrides it. An override never calls data real that the inputs say are not
    (ValueError naming both); a more cautious override is kept and ``note`` says what it overrode.

    >>> settle(None, "simulated", "labels.parquet beside it")
    ('simulated', None)
    >>> settle("toy", "real", "no labels")
    ('toy', "--data toy overrides the inputs' real (no labels)")
    >>> settle("real", "simulated", "labels.parquet beside it")
    Traceback (most recent call last):
    ValueError: --data real: the inputs are simulated data (labels.parquet beside it); leave --data out or give --data simulated
    """
    check(inferred)
    if stated is None or stated == inferred:
        return inferred, None
    check(stated)
    if base_kind(stated) == REAL:
        raise ValueError(f"{option} real: the inputs are {inferred} data ({why}); leave {option} out or give "
                         f"{option} {inferred}")
    return stated, f"{option} {stated} overrides the inputs' {inferred} ({why})"


def meta_kind(meta: object) -> str | None:
    """The data kind a run folder's ``meta.json`` states (its ``data``), or None when it states none (or no kind of
    the vocabulary)."""
    label = meta.get("data") if isinstance(meta, dict) else None
    try:
        return check(label) if isinstance(label, str) else None
    except ValueError:
        return None
