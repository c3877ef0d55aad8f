"""The one redaction of the API key from anything ``collect`` stores or prints.

What is redacted (``[REDACTED]`` in its place):

- **the whole key** in every form an upstream body can echo it in -- as is, with any of its characters
  JSON-escaped (``\\u0073``, ``\\/``, the backslash itself doubled by nested JSON), percent-encoded (``%73``,
  either case), or a mix of these;
- **any run of ``MIN_PREFIX`` (6) or more consecutive characters of the key's secret part**, where the
  *secret part* is the key after its public prefix (``sk-or-v1-``, ``sk-proj-``, ``sk-ant-api03-``: 2-3 lowercase
  letters and up to two short lowercase segments, each ended by ``-``; a key without such a prefix is secret
  whole). A run is found in each of these forms, mixed character by character: literal, ``\\u00XX`` (any number
  of backslashes), ``\\xXX``, ``%XX`` and double/triple percent (``%2573``), HTML entities (``&#115;``,
  ``&#x73;``, ``&amp;#115;``); and inside base64 (standard or URL-safe, any alignment), hex (``736b...``, also
  with ``:`` or space between bytes) runs, which are replaced whole;
- **provider-style masks**: the public prefix followed by 2+ leading secret characters (``sk-or-v1-Q7vX2``),
  2+ leading secret characters followed by a mask (``Q7vX2***``), and a mask (``***``, ``...``, ``…``, ``•``)
  followed by 3+ trailing secret characters (``***3hYd``);
- in a whole record (:meth:`Redactor.record`): strings that lie at the same place in the record (the same path,
  list positions aside: every ``logprobs.content[].token``, the ``content`` of every choice, every alternative of
  one ``top_logprobs`` rank) are read joined, in order, so a key split into pieces shorter than 6 characters
  across tokens, chunks or choices is still found (and each piece redacted); lists of byte values (logprob
  ``bytes``) are read the same way, the key's bytes set to ``*`` (42).

:meth:`Redactor.cut` redacts *before* it truncates, then replaces any prefix of the key of ``MIN_PREFIX`` or more
characters (in any of those forms, a half-written escape included) that the cut left at the end. Keys shorter
than ``MIN_PREFIX`` characters are still redacted whole. Nothing here recurses: records are walked with a stack.
"""
from __future__ import annotations

import base64
import binascii
import bisect
import itertools
import json
import re
from functools import lru_cache
from typing import Any

REDACTED = "[REDACTED]"
MIN_PREFIX = 6
_PARTIAL_ESCAPE = r"(?:\\+(?:u[0-9A-Fa-f]{0,3})?|%[0-9A-Fa-f]?)?"
_PUBLIC_PREFIX = re.compile(r"[a-z]{2,3}-(?:[a-z0-9]{1,6}-){0,2}")
_ESCAPES = (r"\\+u00[0-7][0-9a-fA-F]", r"\\+x[0-9a-fA-F]{2}", r"%(?:25)*[0-9a-fA-F]{2}",
            r"&(?:amp;)*#(?:[0-9]{2,3}|[xX][0-9a-fA-F]{1,2});?")
_MASK = r"(?:\*+|•+|\.{2,}|…)"
_ESCAPE = re.compile("|".join(_ESCAPES))
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{8,}={0,2}")
_HEX_RUN = re.compile(r"(?<![0-9a-fA-F])(?:[0-9a-fA-F]{12,}|[0-9a-fA-F]{2}(?:[ :][0-9a-fA-F]{2}){5,})(?![0-9a-fA-F])")
_B64_ALT = str.maketrans("-_", "+/")
BYTE_MASK = 42  # ``*``: what a key's byte becomes in a list of byte values


def split_key(key: str) -> tuple[str, str]:
    """``(public prefix, secret part)`` of an API key (see the module docstring)."""
    m = _PUBLIC_PREFIX.match(key)
    if m and len(key) - m.end() >= 16:
        return key[:m.end()], key[m.end():]
    return "", key


def _char_pattern(c: str) -> str:
    """A regex for one character of the key in any of its forms."""
    forms = [re.escape(c)]
    units = c.encode("utf-16-be")
    hex_units = [units[i:i + 2].hex() for i in range(0, len(units), 2)]
    forms.append("".join(r"\\+u" + "".join(f"[{h.lower()}{h.upper()}]" if h.isalpha() else h for h in unit)
                         for unit in hex_units))
    forms.append("".join("%" + "".join(f"[{h.lower()}{h.upper()}]" if h.isalpha() else h for h in f"{b:02x}")
                         for b in c.encode("utf-8")))
    if c == "/":
        forms.append(r"\\+/")
    elif c in '"\\':
        forms.append(r"\\+" + re.escape(c))
    return "(?:" + "|".join(forms) + ")"


@lru_cache(maxsize=8)
def _patterns(secret: str) -> tuple[re.Pattern, re.Pattern | None]:
    chars = [_char_pattern(c) for c in secret]
    whole = re.compile("".join(chars))
    if len(secret) <= MIN_PREFIX:
        return whole, None
    # a prefix of MIN_PREFIX+ characters at the very end: the first MIN_PREFIX, then each further one optional
    tail = "".join(chars[:MIN_PREFIX]) + "".join("(?:" + c for c in chars[MIN_PREFIX:-1]) + ")?" * (len(chars) - 1 - MIN_PREFIX)
    return whole, re.compile(f"(?:{tail}){_PARTIAL_ESCAPE}\\Z")


def _nested(chars: str, least: int) -> str:
    """A regex for the first ``least`` to ``len(chars)`` characters of ``chars``, literally."""
    head = re.escape(chars[:least])
    rest = chars[least:]
    return head + "".join("(?:" + re.escape(c) for c in rest) + ")?" * len(rest)


class _Fragments:
    """Finds runs of the secret part (``MIN_PREFIX``+ characters) and masks in a text (see the module).

    Linear and mostly in C: escapes are decoded in one pass (a map keeps where each came from), the 6-character
    windows of the secret are searched in the decoded text with one regex, and every base64 run of the text is
    decoded at each alignment in one call; Python runs per escape, run and hit, not per character."""

    def __init__(self, key: str) -> None:
        prefix, secret = split_key(key)
        self.grams = {secret[i:i + MIN_PREFIX] for i in range(len(secret) - MIN_PREFIX + 1)}
        self.gram_re = re.compile("|".join(map(re.escape, sorted(self.grams))))
        head = _nested(secret[:5], 2)
        self.mask_tail = re.compile(f"{_tail(secret)}(?![A-Za-z0-9])")  # kept when a mask comes before it
        # every 3 secret bytes in base64 (either alphabet): a base64 run holding 6+ of them holds one of these
        groups = {base64.b64encode(secret[j:j + 3].encode("latin-1", "replace")).decode() for j in range(len(secret) - 2)}
        groups |= {g.replace("+", "-").replace("/", "_") for g in groups}
        self.base64_hint = re.compile("|".join(map(re.escape, sorted(groups))))
        self.mask_head = re.compile(f"{head}(?={_MASK})")
        # the public prefix and 2+ leading secret characters (any form), with whatever of the key follows
        forms = [_char_pattern(c) for c in prefix + secret[:5]]
        unit = "(?:[" + "".join(re.escape(c) for c in sorted(set(secret) - set("\\%&"))) + "]|" + "|".join(_ESCAPES) + ")"
        self.key_head = re.compile("".join(forms[:len(prefix) + 2]) + "".join("(?:" + f for f in forms[len(prefix) + 2:])
                                   + ")?" * (len(forms) - len(prefix) - 2) + f"{unit}*") if prefix else None

    def covered(self, decoded: str) -> list[tuple[int, int]]:
        """Merged ``[start, end)`` ranges of ``decoded`` covered by a run of the secret part."""
        spans: list[tuple[int, int]] = []
        pos = 0
        while m := self.gram_re.search(decoded, pos):
            start, end = m.start(), m.end()
            while decoded[end - MIN_PREFIX + 1:end + 1] in self.grams and end < len(decoded):
                end += 1  # the run goes on, one character at a time
            if spans and start <= spans[-1][1]:
                spans[-1] = (spans[-1][0], end)
            else:
                spans.append((start, end))
            pos = max(start + 1, end - MIN_PREFIX + 1)
        return spans

    def text(self, text: str) -> str:
        if not self.grams:
            return text
        if self.key_head is not None:
            text = self.key_head.sub(REDACTED, text)
        text = self._runs(text)
        text = self._base64(text)
        text = _HEX_RUN.sub(lambda m: REDACTED if self._in_hex(m.group()) else m.group(), text)
        return self.masks(text)

    def masks(self, text: str) -> str:
        """``text`` with provider-style masks of the key (a head or tail beside ``***``, ``...``, ``…``) redacted."""
        text = self.mask_tail.sub(self._tail_of_mask, text)
        return self.mask_head.sub(lambda m: m.group() if m.start() and text[m.start() - 1].isalnum() else REDACTED, text)

    @staticmethod
    def _tail_of_mask(m: re.Match) -> str:
        """A tail of the key after a mask (``***3hYd``): redacted with its mask; anything else kept."""
        mask = re.search(f"{_MASK}\\Z", m.string[max(0, m.start() - 64):m.start()])
        return REDACTED if mask else m.group()

    def _runs(self, text: str) -> str:
        """``text`` with every run of the secret part, literal or escaped character by character, redacted."""
        starts: list[int] = []  # per escape: where it begins in the decoded text, and its span in ``text``
        spans_in: list[tuple[int, int]] = []
        pieces, at, shift = [], 0, 0
        for m in _ESCAPE.finditer(text):
            pieces += [text[at:m.start()], _unit_char(m.group())]
            starts.append(m.start() - shift)
            spans_in.append(m.span())
            shift += m.end() - m.start() - 1
            at = m.end()
        decoded = "".join(pieces) + text[at:] if starts else text
        found = self.covered(decoded)
        if not found:
            return text
        out, at = [], 0
        for a, b in found:
            a, b = _origin(a, starts, spans_in, False), _origin(b - 1, starts, spans_in, True)
            out += [text[at:a], REDACTED]
            at = b
        return "".join(out) + text[at:]

    def _base64(self, text: str) -> str:
        """``text`` with every base64 run holding 6+ secret bytes (any alignment, either alphabet) redacted whole."""
        if not self.base64_hint.search(text):
            return text
        runs = list(_BASE64_RUN.finditer(text))
        hit: set[int] = set()
        for off in range(4):
            parts = [r.group().rstrip("=")[off:] for r in runs]
            parts = [p[:len(p) // 4 * 4] for p in parts]
            ends = list(itertools.accumulate(len(p) // 4 * 3 for p in parts))
            try:
                decoded = binascii.a2b_base64("".join(parts).translate(_B64_ALT)).decode("latin-1")
            except (binascii.Error, ValueError):
                continue
            for a, b in self.covered(decoded):
                k = bisect.bisect_right(ends, a)
                if k < len(ends) and b <= ends[k]:
                    hit.add(k)
        if not hit:
            return text
        out, at = [], 0
        for k in sorted(hit):
            out += [text[at:runs[k].start()], REDACTED]
            at = runs[k].end()
        return "".join(out) + text[at:]

    def _in_hex(self, run: str) -> bool:
        digits = re.sub("[ :]", "", run)
        return any(self.gram_re.search(bytes.fromhex(digits[off:off + (len(digits) - off) // 2 * 2]).decode("latin-1"))
                   for off in (0, 1))


def _origin(p: int, starts: list[int], spans: list[tuple[int, int]], end: bool) -> int:
    """Where decoded position ``p`` lies in the text (its start; ``end``: just after it)."""
    k = bisect.bisect_right(starts, p) - 1
    if k >= 0 and starts[k] == p:
        return spans[k][1] if end else spans[k][0]
    at = p if k < 0 else spans[k][1] + (p - starts[k] - 1)
    return at + 1 if end else at


def _tail(secret: str) -> str:
    """A regex for the last 3 to 5 characters of ``secret`` (longest first)."""
    return "(?:" + "|".join(re.escape(secret[-k:]) for k in range(min(5, len(secret)), 2, -1)) + ")"


def _unit_char(unit: str) -> str:
    """The character one unit of a run stands for (a literal character or one escape)."""
    if unit[0] == "\\":
        return chr(int(unit.lstrip("\\")[1:], 16))
    if unit[0] == "%":
        return chr(int(unit[-2:], 16))
    if unit[0] == "&":
        num = unit.rstrip(";").rsplit("#", 1)[1]
        return chr(int(num[1:], 16) if num[:1] in "xX" else int(num))
    return unit


@lru_cache(maxsize=8)
def _fragments(key: str) -> _Fragments:
    return _Fragments(key)


class Redactor:
    """Redacts one secret (None or empty: a no-op)."""

    def __init__(self, secret: str | None) -> None:
        self.secret = secret or None

    def __call__(self, text: str) -> str:
        if not self.secret or not isinstance(text, str):
            return text
        if len(text) < MIN_PREFIX:  # too short for 6 secret characters in any form: only a mask can be here
            return _fragments(self.secret).masks(text) if any(c in text for c in "*•.…") else text
        return _fragments(self.secret).text(_patterns(self.secret)[0].sub(REDACTED, text))

    def whole(self, text: str) -> str:
        """``text`` with the whole key redacted in any of its escaped forms only (for serialised JSON, whose strings
        :meth:`record` has already cleared of fragments: a fragment rule could match outside a string)."""
        if not self.secret or not isinstance(text, str):
            return text
        return _patterns(self.secret)[0].sub(REDACTED, text)

    def cut(self, text: str, limit: int) -> str:
        """``text`` redacted, then cut to ``limit`` characters, with a key prefix left at the end replaced too (the
        cut, or the upstream's own, may have split an echoed key)."""
        text = self(text)[:limit]
        prefix = _patterns(self.secret)[1] if self.secret else None
        if prefix is not None:
            m = prefix.search(text[-(len(self.secret) * 12 + 16):])
            if m:
                text = text[:len(text) - (m.end() - m.start())] + REDACTED
        return text

    def value(self, value: Any) -> Any:
        """``value`` (JSON-like) with the secret redacted from every string and key, and from strings split across
        one place of the record (see :meth:`record`)."""
        return self.record(value)

    def record(self, value: Any) -> Any:
        """A copy of ``value`` (JSON-like, any depth: walked without recursion) with the key redacted from every
        string and key, and from the joined strings (and byte lists) that share one place of the record."""
        if not self.secret:
            return value
        root, leaves = _copy_with_leaves(value)
        alone = self._may_hold_key(value)  # else no string or key can hold it alone: only the joined places are read
        if alone:
            for holder, key, _ in (leaf for group in leaves.values() for leaf in group):
                if isinstance(holder[key], str):
                    holder[key] = self(holder[key])
        frag = _fragments(self.secret)
        for group in leaves.values():
            _redact_joined(group, frag)
        return _rename_keys(root[0], self) if alone else root[0]

    def _may_hold_key(self, value: Any) -> bool:
        """Whether any string of ``value`` may hold the key: the whole record serialised and scanned once (a superset
        of what each string alone shows); a record too deep to serialise is read string by string."""
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (ValueError, TypeError, RecursionError):
            return True
        return self(text) != text

    def bytes_cut(self, data: bytes, limit: int) -> str:
        """An upstream body's first ``limit`` characters as text (invalid UTF-8 replaced), redacted before the cut."""
        window = data[:(limit + 12 * len(self.secret or "") + 16) * 4]  # any key crossing the cut lies inside
        return self.cut(window.decode("utf-8", errors="replace"), limit)


def _is_bytes_list(value: Any) -> bool:
    return bool(value) and all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255 for b in value)


def _copy_with_leaves(value: Any) -> tuple[list, dict[str, list]]:
    """A copy of ``value`` (in ``root[0]``) and its string leaves and byte lists, ``(holder, key, path)`` grouped by
    their place (the path, list positions aside, but a ``top_logprobs`` rank kept), in document order."""
    root: list = [None]
    leaves: dict[str, list] = {}
    stack = [(value, root, 0, "$")]
    while stack:
        v, holder, key, path = stack.pop()
        if isinstance(v, dict):
            holder[key] = copy = dict(v)
            stack.extend((item, copy, k, f"{path}.{k}") for k, item in reversed(list(v.items())))
        elif isinstance(v, list):
            holder[key] = copy = list(v)
            if _is_bytes_list(v):
                leaves.setdefault(path + "[]", []).append((holder, key, path))
                continue
            rank = path.endswith(".top_logprobs")
            stack.extend((item, copy, i, f"{path}[{i if rank else ''}]") for i, item in reversed(list(enumerate(v))))
        else:
            holder[key] = v
            if isinstance(v, str):
                leaves.setdefault(path, []).append((holder, key, path))
    return root, leaves


def _redact_joined(group: list, frag: _Fragments) -> None:
    """Find the secret in the joined leaves of one place; redact each leaf's share (strings) or mask its bytes."""
    if not frag.grams:
        return
    texts = [h[k] if isinstance(h[k], str) else bytes(h[k]).decode("latin-1") for h, k, _ in group]
    spans = frag.covered("".join(texts))
    if not spans:
        return
    start = 0
    for (holder, key, _), text in zip(group, texts):
        end = start + len(text)
        cuts = [(max(a, start) - start, min(b, end) - start) for a, b in spans if a < end and b > start]
        if cuts:
            if isinstance(holder[key], str):
                out, at = [], 0
                for a, b in cuts:
                    out += [text[at:a], REDACTED]
                    at = b
                holder[key] = "".join(out) + text[at:]
            else:
                masked = list(holder[key])
                for a, b in cuts:
                    masked[a:b] = [BYTE_MASK] * (b - a)
                holder[key] = masked
        start = end


def _rename_keys(value: Any, redactor: Redactor) -> Any:
    """``value`` with every dict key redacted (keys holding the key: rare, but an echo may put it there)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if any(redactor(k) != k for k in v if isinstance(k, str)):
                items = [(redactor(k) if isinstance(k, str) else k, item) for k, item in v.items()]
                v.clear()
                v.update(items)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return value


# --------------------------------------------------------------------------------------------
# data fields: a key inside a provider or model name (a logged answer, a converted log) never travels on

KEY_ENV = "OPENROUTER_API_KEY"  # the one place the kit reads a key from
KEY_FIELDS = (("response", "provider"), ("response", "model"), ("request", "model"))
KEY_FLAG = "api_key_redacted"  # the flag of a record whose data field held the key


@lru_cache(maxsize=4)
def _env_redactor(key: str) -> Redactor:
    return Redactor(key)


def env_redactor() -> Redactor | None:
    """The redactor of the key in ``OPENROUTER_API_KEY`` (None when it is unset or empty)."""
    import os

    key = os.environ.get(KEY_ENV) or ""
    return _env_redactor(key) if key.strip() else None


def redact_key_fields(record: Any) -> Any:
    """``record`` (an API record) with each of :data:`KEY_FIELDS` that holds the API key (any form or fragment,
    :class:`Redactor`) replaced by :data:`REDACTED`; the fields replaced are listed in ``record["key_redacted"]``
    (reconstruct flags the row :data:`KEY_FLAG`). ``record`` itself when no key is set or none holds it."""
    redactor = env_redactor()
    if redactor is None or not isinstance(record, dict):
        return record
    hits = [(part, name) for part, name in KEY_FIELDS if isinstance(record.get(part), dict)
            and isinstance(record[part].get(name), str) and redactor(record[part][name]) != record[part][name]]
    if not hits:
        return record
    record = dict(record)
    for part, name in hits:
        record[part] = {**record[part], name: REDACTED}
    record["key_redacted"] = sorted({*record.get("key_redacted", []), *(f"{p}.{n}" for p, n in hits)})
    return record
