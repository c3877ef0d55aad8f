"""What a server's detokenizer makes of engine IDs: the text its parsers read.

Servers do not hand their Kimi parsers the token bytes: they decode the IDs with the slow HF tokenizer
(Moonshot's ``tokenization_kimi.py``), and that decode has two conventions that change the text:

- **added tokens stand apart**: the tokenizer's added tokens (the named specials of
  ``tokenizer_config.json``: ``<think>``, the tool markers, ``<|im_end|>``...) are decoded on their own
  and, with ``spaces_between_special_tokens`` on (vLLM's and SGLang's default), joined to the text
  around them with a space: ``<think> I look. </think> Sure.``. The prompt's last token seeds the
  decode, so a completion after K2.5's generation prompt (which ends in ``<think>``) starts with a space;
- **incremental decoding** (vLLM): text is released token by token over a short window; a window whose
  text ends in U+FFFD (a character cut inside its bytes) is held back until it completes, so a character
  cut by the end of the output is never released.

:func:`served_pieces` returns the text released per output ID (what a stream carries), and
:func:`served_text` their concatenation. The server's stop token is left out by the caller (servers
drop the token that stopped generation).

>>> from kimi_eagle.assets import kimi_dir
>>> from kimi_eagle.tokenize.tokenizer import load_tokenizer
>>> tok = load_tokenizer(kimi_dir())
>>> ids = tok.encode("I look.</think>Sure.", allow_special="all")
>>> served_text(ids, tok, DetokOptions(spaces=True), prompt_tail=[163606])
' I look. </think> Sure.'
>>> served_text(ids, tok, DetokOptions(spaces=False), prompt_tail=[163606])
'I look.</think>Sure.'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kimi_eagle.tokenize.tokenizer import Tokenizer

PREFIX_WINDOW = 5  # tokens of context before the read offset (vLLM's initial incremental offset)
PROMPT_SEED = PREFIX_WINDOW + 2  # prompt tokens the first window is seeded with


@dataclass(frozen=True)
class DetokOptions:
    """A server's decode: ``spaces`` (``spaces_between_special_tokens``), ``skip_special`` (drop the
    tokenizer's special tokens: ``skip_special_tokens``) and ``incremental`` (vLLM's windowed release; off:
    one decode of all IDs, the replacement character kept)."""

    spaces: bool = True
    skip_special: bool = False
    incremental: bool = True


def _join(ids: Sequence[int], tok: Tokenizer, opts: DetokOptions) -> str:
    """The text of ``ids`` as one decode: runs of ordinary tokens as UTF-8 (invalid bytes replaced),
    added tokens as their text, the sub-texts joined by a space when ``opts.spaces``."""
    added, skipped = tok.named_special_ids, tok.skipped_special_ids if opts.skip_special else frozenset()
    subs: list[str] = []
    run: list[bytes] = []
    for i in ids:
        if i in skipped:
            continue
        if i in added:
            if run:
                subs.append(b"".join(run).decode("utf-8", "replace"))
                run = []
            subs.append(tok.token_bytes(i).decode("utf-8"))
        else:
            run.append(tok.token_bytes(i))
    if run:
        subs.append(b"".join(run).decode("utf-8", "replace"))
    return (" " if opts.spaces else "").join(subs)


def served_pieces(ids: Sequence[int], tok: Tokenizer, opts: DetokOptions = DetokOptions(),
                  prompt_tail: Sequence[int] = ()) -> list[str]:
    """The text a server releases for each of ``ids`` (``""`` while a character is incomplete).

    ``prompt_tail``: the last prompt IDs (seed the first window: a completion after an added token starts
    with a space when ``opts.spaces``).
    """
    if not opts.incremental:
        return [_join(ids, tok, opts)] + [""] * (len(ids) - 1) if ids else []
    window = list(prompt_tail[-PROMPT_SEED:])
    prefix, read = max(len(window) - PREFIX_WINDOW, 0), len(window)
    out: list[str] = []
    for i in ids:
        window.append(int(i))
        before = _join(window[prefix:read], tok, opts)
        after = _join(window[prefix:], tok, opts)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            out.append("")  # nothing new, or a character still incomplete: held back
        else:
            out.append(after[len(before):])
            prefix, read = read, len(window)
        window, read, prefix = window[prefix:], read - prefix, 0
    return out


def served_text(ids: Sequence[int], tok: Tokenizer, opts: DetokOptions = DetokOptions(),
                prompt_tail: Sequence[int] = ()) -> str:
    """The decoded text of ``ids`` as the server's detokenizer releases it (see :func:`served_pieces`)."""
    return "".join(served_pieces(ids, tok, opts, prompt_tail))


def _hf_special_ids(tok: Tokenizer) -> frozenset[int]:
    """The IDs ``skip_special_tokens`` removes (the tokenizer's ``skipped_special_ids``)."""
    return tok.skipped_special_ids
