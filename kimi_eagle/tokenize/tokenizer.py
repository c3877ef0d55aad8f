"""Tokenizers behind one small interface: Kimi's tiktoken BPE, and any HF ``tokenizer.json``.

Everything downstream (reconstruction, alignment, probing) works on token *bytes*, so every
tokenizer exposes ``token_bytes(id)`` exactly, including partial UTF-8 tokens.
"""
from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import AbstractSet, Literal, Protocol, Sequence, runtime_checkable

import numpy as np
import tiktoken

from kimi_eagle.assets import KIMI_TIKTOKEN_SHA256, AssetError, sha256_bytes

# Kimi's split regex (a fact from the model's tokenizer files).
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
N_RESERVED_SPECIALS = 256
MAX_ENCODE_CHARS = 400_000  # the reference encodes at most this many characters at a time
MAX_RUN_CHARS = 25_000  # ... and cuts runs of whitespace / non-whitespace longer than this

AllowSpecial = bool | AbstractSet[str] | Literal["all"]


class TokenizerError(ValueError):
    """A tokenizer's files are missing, corrupt or inconsistent."""


@dataclass(frozen=True)
class SpecialToken:
    id: int
    text: str
    hf_special: bool  # the HF ``special`` flag: False means skip_special_tokens keeps it in decoded text


@runtime_checkable
class Tokenizer(Protocol):
    """What the kit needs from a tokenizer: encoding, exact token bytes, and the tables derived from them.

    The derived tables (special IDs and texts, the id -> bytes table, ...) are built once per tokenizer
    object and owned by it: implementations get them from :class:`DerivedTables`.
    """

    name: str

    @property
    def n_vocab(self) -> int: ...

    @property
    def special_tokens(self) -> list[SpecialToken]: ...

    def encode(self, text: str, allow_special: AllowSpecial = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def is_special(self, token_id: int) -> bool: ...

    @property
    def special_ids(self) -> frozenset[int]: ...

    @property
    def special_id_by_text(self) -> dict[str, int]: ...

    @property
    def special_text_by_id(self) -> dict[int, str]: ...

    @property
    def token_table(self) -> list[bytes]: ...

    @property
    def token_lengths(self) -> np.ndarray: ...

    @property
    def token_length_list(self) -> list[int]: ...

    @property
    def special_mask(self) -> np.ndarray: ...

    @property
    def plain_token_table(self) -> list[bytes]: ...

    @property
    def has_empty_token(self) -> bool: ...

    @property
    def id_by_bytes(self) -> dict[bytes, int]: ...


class DerivedTables:
    """Tables derived from ``special_tokens``, ``n_vocab`` and ``token_bytes``, each built on first use.

    Mixed into every tokenizer class, so a table is built once per tokenizer object and read as an
    attribute afterwards (the hot paths read them once per record).
    """

    special_tokens: list[SpecialToken]
    n_vocab: int

    def token_bytes(self, token_id: int) -> bytes:  # pragma: no cover - provided by the tokenizer
        raise NotImplementedError

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """IDs of every special/added token."""
        return frozenset(s.id for s in self.special_tokens)

    @cached_property
    def special_id_by_text(self) -> dict[str, int]:
        """Special-token spelling -> ID."""
        return {s.text: s.id for s in self.special_tokens}

    @cached_property
    def special_text_by_id(self) -> dict[int, str]:
        """Special-token ID -> spelling."""
        return {s.id: s.text for s in self.special_tokens}

    @cached_property
    def named_special_ids(self) -> frozenset[int]:
        """IDs of the specials the tokenizer config names (a slow HF tokenizer's added tokens: a server's
        detokenizer decodes them on their own), not the unnamed ``<|reserved_token_N|>`` slots."""
        return frozenset(s.id for s in self.special_tokens if s.text != f"<|reserved_token_{s.id}|>")

    @cached_property
    def skipped_special_ids(self) -> frozenset[int]:
        """Named specials flagged HF ``special`` (what ``skip_special_tokens`` removes when decoding)."""
        return frozenset(s.id for s in self.special_tokens if s.hf_special and s.id in self.named_special_ids)

    @cached_property
    def token_table(self) -> list[bytes]:
        """The bytes of every ID, ``0 .. n_vocab - 1``."""
        return [self.token_bytes(i) for i in range(self.n_vocab)]

    @cached_property
    def token_length_list(self) -> list[int]:
        """``len(token_table[i])`` for every ID, as a list (C-speed sums of short runs)."""
        return list(map(len, self.token_table))

    @cached_property
    def token_lengths(self) -> np.ndarray:
        """``len(token_table[i])`` for every ID, as int64 (vectorised sums of long runs)."""
        return np.array(self.token_length_list, dtype=np.int64)

    @cached_property
    def special_mask(self) -> np.ndarray:
        """Boolean by ID: is it a special/added token."""
        mask = np.zeros(self.n_vocab, dtype=bool)
        mask[[i for i in self.special_ids if 0 <= i < self.n_vocab]] = True
        return mask

    @cached_property
    def plain_token_table(self) -> list[bytes]:
        """``token_table`` with every special token spelled ``b""`` (ordinary bytes only)."""
        plain = list(self.token_table)
        for i in self.special_ids:
            if 0 <= i < len(plain):
                plain[i] = b""
        return plain

    @cached_property
    def has_empty_token(self) -> bool:
        """Some ID spells no bytes (byte offsets are then not strictly increasing)."""
        return 0 in self.token_length_list

    @cached_property
    def id_by_bytes(self) -> dict[bytes, int]:
        """Bytes -> ID of the ordinary (non-special) tokens; the highest ID where several spell the same bytes."""
        specials = self.special_ids
        return {raw: i for i, raw in enumerate(self.token_table) if i not in specials}


def special_id(tok: Tokenizer, text: str) -> int:
    """The ID of the special token spelled ``text``; KeyError if the tokenizer has none."""
    try:
        return tok.special_id_by_text[text]
    except KeyError:
        raise KeyError(f"{tok.name}: no special token {text!r}") from None


def ids_to_bytes(tok: Tokenizer, ids: Sequence[int]) -> bytes:
    return b"".join(tok.token_bytes(i) for i in ids)


# --------------------------------------------------------------------------------------------
# Kimi


def _load_ranks(path: Path, expected_sha256: str | None) -> dict[bytes, int]:
    if not path.is_file():
        raise AssetError(f"tiktoken ranks file not found: {path}")
    data = path.read_bytes()
    if expected_sha256 is not None and (got := sha256_bytes(data)) != expected_sha256:
        raise TokenizerError(f"{path}: sha256 {got} does not match the expected {expected_sha256}")
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64, validate=True)] = int(rank)
        except ValueError as e:
            raise TokenizerError(f"{path}:{lineno}: not a 'base64 rank' line ({e})") from None
    return ranks


def _load_added_tokens(config_path: Path) -> dict[int, tuple[str, bool]]:
    if not config_path.is_file():
        raise AssetError(f"tokenizer config not found: {config_path}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        decoder = config["added_tokens_decoder"]
        return {int(k): (v["content"], bool(v.get("special", True))) for k, v in decoder.items()}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{config_path}: not valid JSON ({e})") from None
    except (KeyError, TypeError, ValueError) as e:
        raise TokenizerError(f"{config_path}: malformed added_tokens_decoder ({type(e).__name__}: {e})") from None


def split_long_runs(text: str, max_run: int = MAX_RUN_CHARS) -> list[str]:
    """Cut ``text`` inside runs of more than ``max_run`` whitespace or non-whitespace characters.

    A run is cut every ``max_run`` characters from its start; the text before a run stays with
    its first piece. This is the reference tokenizer's rule, so long blobs (base64, repeated
    spaces) tokenize as the model saw them.
    """
    if len(text) <= max_run:
        return [text]
    # The lookbehind makes only run starts try the long match, so the scan is linear.
    long_run = re.compile(rf"(?<!\s)\s{{{max_run + 1},}}|(?<!\S)\S{{{max_run + 1},}}")
    cuts = []
    for m in long_run.finditer(text):
        cuts.extend(range(m.start() + max_run, m.end(), max_run))
    if not cuts:
        return [text]
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


class KimiTokenizer(DerivedTables):
    """Kimi's tiktoken BPE: 163,584 ranks plus 256 special slots (n_vocab 163,840).

    Built from ``tiktoken.model`` and ``tokenizer_config.json`` only; no remote code.
    """

    def __init__(self, ranks: dict[bytes, int], added: dict[int, tuple[str, bool]], name: str = "kimi") -> None:
        self.name = name
        n_ranks = len(ranks)
        if sorted(ranks.values()) != list(range(n_ranks)):
            raise TokenizerError("tiktoken ranks are not the contiguous range 0..n-1")
        bad = [i for i in added if not n_ranks <= i < n_ranks + N_RESERVED_SPECIALS]
        if bad:
            raise TokenizerError(f"added token ids {bad} fall outside the special slots {n_ranks}..{n_ranks + N_RESERVED_SPECIALS - 1}")
        self._specials = [
            SpecialToken(i, *added.get(i, (f"<|reserved_token_{i}|>", True)))
            for i in range(n_ranks, n_ranks + N_RESERVED_SPECIALS)
        ]
        self.n_ranks = n_ranks
        self._encoding = tiktoken.Encoding(
            name=name,
            pat_str=KIMI_PAT_STR,
            mergeable_ranks=ranks,
            special_tokens={s.text: s.id for s in self._specials},
        )
        self._special_bytes = {s.id: s.text.encode() for s in self._specials}

    @classmethod
    def from_dir(cls, path: str | Path, verify_sha256: bool = True) -> "KimiTokenizer":
        """Load ``tiktoken.model`` + ``tokenizer_config.json`` from a model directory."""
        path = Path(path)
        if not path.is_dir():
            raise AssetError(f"Kimi tokenizer directory not found: {path}")
        ranks = _load_ranks(path / "tiktoken.model", KIMI_TIKTOKEN_SHA256 if verify_sha256 else None)
        return cls(ranks, _load_added_tokens(path / "tokenizer_config.json"), name=f"kimi:{path.name}")

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The underlying ``tiktoken.Encoding`` (for baselines)."""
        return self._encoding

    @property
    def n_vocab(self) -> int:
        return self._encoding.n_vocab

    @property
    def special_tokens(self) -> list[SpecialToken]:
        return list(self._specials)

    def encode(self, text: str, allow_special: AllowSpecial = False) -> list[int]:
        """Encode like the reference tokenizer (400k-char chunks, long runs cut).

        ``allow_special``: False encodes special-token text as ordinary text; True or ``"all"``
        turns every special spelling into its ID; a set allows just those spellings.
        """
        allowed: AbstractSet[str] | Literal["all"]
        allowed = "all" if allow_special is True or allow_special == "all" else (allow_special or set())
        enc = self._encoding.encode
        if len(text) <= MAX_RUN_CHARS:
            return enc(text, allowed_special=allowed, disallowed_special=())
        ids: list[int] = []
        for start in range(0, len(text), MAX_ENCODE_CHARS):
            for piece in split_long_runs(text[start : start + MAX_ENCODE_CHARS]):
                ids.extend(enc(piece, allowed_special=allowed, disallowed_special=()))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._encoding.decode(list(ids), errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        if token_id in self._special_bytes:
            return self._special_bytes[token_id]
        if not 0 <= token_id < self.n_ranks:
            raise IndexError(f"token id {token_id} out of range for n_vocab {self.n_vocab}")
        return self._encoding.decode_single_token_bytes(token_id)

    def is_special(self, token_id: int) -> bool:
        return token_id >= self.n_ranks


# --------------------------------------------------------------------------------------------
# HF tokenizer.json


def _bytes_to_unicode() -> dict[str, int]:
    """The byte-level BPE alphabet: printable stand-in character -> byte value."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in mapping.items()}


_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


# texts longer than this are encoded through `tokenizers`' batch call, which releases the GIL (a server thread
# tokenising a 15 MB prompt must not stop the event loop from answering /health)
GIL_FREE_CHARS = 100_000


class HFTokenizer(DerivedTables):
    """Any HF ``tokenizer.json`` (byte-level BPE like Qwen3/DeepSeek-V3, or SentencePiece-style BPE)."""

    def __init__(self, tokenizer_json: str | Path, config_json: str | Path | None = None, name: str | None = None) -> None:
        from tokenizers import Tokenizer as _HF

        path = Path(tokenizer_json)
        if not path.is_file():
            raise AssetError(f"tokenizer.json not found: {path}")
        try:
            self._tok = _HF.from_file(str(path))
            spec = json.loads(path.read_text(encoding="utf-8"))
        except Exception as e:  # the tokenizers library raises bare Exceptions
            raise TokenizerError(f"{path}: cannot load tokenizer ({e})") from None
        self.name = name or f"hf:{path.parent.name}"
        self.path = path
        self.config: dict = {}
        if config_json and Path(config_json).is_file():
            self.config = json.loads(Path(config_json).read_text(encoding="utf-8"))
        self._byte_level = "ByteLevel" in json.dumps(spec.get("decoder")) or "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))
        self._added = {int(t["id"]): (t["content"], bool(t.get("special", False))) for t in spec.get("added_tokens", [])}
        self._vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.n_ranks = self._tok.get_vocab_size(with_added_tokens=False)

    @classmethod
    def from_dir(cls, path: str | Path) -> "HFTokenizer":
        """The tokenizer of an HF model directory, named after the model (``.../stories260K/hf`` ->
        ``hf:stories260K``, as :func:`kimi_eagle.engine.local.default_model_name` names it; #46: ``hf:hf`` hid the
        toy model from every data-kind check)."""
        path = Path(path)
        model = path.resolve().parent.name if path.resolve().name in ("hf", "model", "checkpoint") else path.name
        return cls(path / "tokenizer.json", path / "tokenizer_config.json", name=f"hf:{model}")

    @property
    def n_vocab(self) -> int:
        return self._vocab_size

    @property
    def special_tokens(self) -> list[SpecialToken]:
        return [SpecialToken(i, text, special) for i, (text, special) in sorted(self._added.items())]

    @property
    def chat_template(self) -> str | None:
        return self.config.get("chat_template")

    @cached_property
    def token_table(self) -> list[bytes]:
        """The bytes of every ID (read from the vocabulary, not by decoding each ID)."""
        byte_of = _bytes_to_unicode()
        table = [b""] * self._vocab_size
        for piece, i in self._tok.get_vocab(with_added_tokens=False).items():
            if self._byte_level:
                table[i] = bytes(byte_of[c] for c in piece) if all(c in byte_of for c in piece) else piece.encode()
            elif m := _BYTE_FALLBACK.match(piece):
                table[i] = bytes([int(m.group(1), 16)])
            else:
                table[i] = piece.replace("\u2581", " ").encode()
        for i, (text, _) in self._added.items():
            if i < len(table):
                table[i] = text.encode()
        return table

    def encode(self, text: str, allow_special: AllowSpecial = False, continuation: bool = False) -> list[int]:
        """Encode without adding BOS/EOS. ``allow_special`` False encodes special spellings as text.

        ``continuation``: encode ``text`` as the continuation of earlier text, i.e. without the
        SentencePiece dummy-prefix space (Metaspace ``prepend_scheme``), so the token bytes equal
        the text's UTF-8 bytes. No effect on tokenizers without a dummy prefix.
        """
        tok = self._continuation_tok if continuation else self._tok
        tok.encode_special_tokens = not bool(allow_special)
        if len(text) > GIL_FREE_CHARS:  # the same IDs; `encode_batch` lets other threads run while it works
            return tok.encode_batch([text], add_special_tokens=False)[0].ids
        return tok.encode(text, add_special_tokens=False).ids

    @cached_property
    def _continuation_tok(self):
        """A copy whose Metaspace pre-tokenizer never prepends the dummy-prefix space."""
        from tokenizers import Tokenizer as _HF

        spec = json.loads(self._tok.to_str())
        changed = False
        for pre in _metaspaces(spec.get("pre_tokenizer")):
            if pre.get("prepend_scheme", "always") != "never" or pre.get("add_prefix_space"):
                pre["prepend_scheme"], changed = "never", True
                pre.pop("add_prefix_space", None)
        return _HF.from_str(json.dumps(spec)) if changed else self._tok

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self._vocab_size:
            raise IndexError(f"token id {token_id} out of range for n_vocab {self.n_vocab}")
        return self.token_table[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._added and self._added[token_id][1]


def _metaspaces(node: dict | None) -> list[dict]:
    """The Metaspace pre-tokenizers in a tokenizer.json ``pre_tokenizer`` (possibly a Sequence)."""
    if not node:
        return []
    if node.get("type") == "Metaspace":
        return [node]
    return [m for sub in node.get("pretokenizers", []) for m in _metaspaces(sub)]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizer directory: Kimi (``tiktoken.model``) or HF (``tokenizer.json``)."""
    path = Path(path)
    if (path / "tiktoken.model").is_file():
        return KimiTokenizer.from_dir(path)
    if (path / "tokenizer.json").is_file():
        return HFTokenizer.from_dir(path)
    if path.is_file() and path.name.endswith(".json"):
        return HFTokenizer(path)
    raise AssetError(f"{path}: no tiktoken.model or tokenizer.json here")
