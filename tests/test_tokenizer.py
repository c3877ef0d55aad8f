"""KimiTokenizer on the real files, and the same interface over HF tokenizer.json files."""
import base64
import random

import pytest

from kimi_eagle.assets import asset_path, stories_dir
from kimi_eagle.tokenize.tokenizer import (
    MAX_RUN_CHARS,
    HFTokenizer,
    Tokenizer,
    ids_to_bytes,
    load_tokenizer,
    special_id,
    split_long_runs,
)

MIXED = "Kimi 的分词器很快。\ndef f(x):\n    return x ** 2  # 🚀🦀 café\n\t<|not_special|> ünïcödé 1234567"


def test_kimi_vocab_shape(kimi):
    assert kimi.n_ranks == 163_584
    assert kimi.n_vocab == 163_840
    assert len(kimi.special_tokens) == 256


def test_im_end_is_163586_and_163533_is_chas(kimi):
    assert kimi.encode("<|im_end|>", allow_special=True) == [163586]
    assert kimi.decode([163533]) == "chas"
    assert special_id(kimi, "<|im_end|>") == 163586
    assert not kimi.is_special(163533)


def test_named_specials_match_the_config(kimi):
    named = {s.text: (s.id, s.hf_special) for s in kimi.special_tokens if not s.text.startswith("<|reserved_token_")}
    assert len(named) == 23
    assert named["<think>"] == (163606, False)
    assert named["</think>"] == (163607, False)
    assert named["[EOS]"] == (163585, True)
    assert named["<|tool_calls_section_begin|>"] == (163595, False)


def test_every_special_round_trips(kimi):
    for s in kimi.special_tokens:
        assert kimi.encode(s.text, allow_special=True) == [s.id], s
        assert kimi.decode([s.id]) == s.text
        assert kimi.token_bytes(s.id) == s.text.encode()


def test_special_text_is_plain_text_unless_allowed(kimi):
    ids = kimi.encode("<|im_end|>")
    assert 163586 not in ids and len(ids) > 1
    assert kimi.decode(ids) == "<|im_end|>"
    assert kimi.encode("a</think>b", allow_special={"</think>"}) == kimi.encode("a") + [163607] + kimi.encode("b")


def test_mixed_text_round_trips_through_ids_and_bytes(kimi):
    ids = kimi.encode(MIXED)
    assert kimi.decode(ids) == MIXED
    assert ids_to_bytes(kimi, ids) == MIXED.encode()


def test_partial_utf8_tokens_exist_and_have_exact_bytes(kimi):
    partial = [i for i in range(kimi.n_ranks) if not _utf8(kimi.token_bytes(i))]
    assert len(partial) == 1172


def test_out_of_range_token_bytes_is_an_index_error(kimi):
    with pytest.raises(IndexError, match="out of range"):
        kimi.token_bytes(kimi.n_vocab)


def reference_cuts(text: str, limit: int) -> list[str]:
    """The reference rule written as the plain per-character loop, to check the fast version."""
    pieces, start, run, prev_space = [], 0, 0, text[:1].isspace()
    for i, c in enumerate(text):
        if c.isspace() != prev_space:
            prev_space, run = c.isspace(), 1
        else:
            run += 1
            if run > limit:
                pieces.append(text[start:i])
                start, run = i, 1
    pieces.append(text[start:])
    return pieces


@pytest.mark.parametrize(
    "text",
    [
        "x" * 30_000,
        "ab " + " " * 30_000 + "cd",
        "hello " + "Q" * 60_001 + " tail",
        "short text",
        ("word " * 8_000),
    ],
)
def test_long_run_cuts_match_the_reference_loop(text):
    assert split_long_runs(text) == reference_cuts(text, MAX_RUN_CHARS)


def test_chunking_changes_nothing_for_ordinary_text(kimi):
    text = (MIXED + "\n") * 800  # ~ 70,000 characters, no long runs
    assert len(text) > MAX_RUN_CHARS
    assert kimi.encode(text) == kimi.encoding.encode(text, disallowed_special=())


def test_30000_character_run_is_cut_like_the_reference(kimi):
    text = base64.b64encode(random.Random(0).randbytes(22_500)).decode()  # a 30,000-character blob
    assert len(text) == 30_000
    expected = [i for piece in reference_cuts(text, MAX_RUN_CHARS) for i in kimi.encoding.encode(piece)]
    assert kimi.encode(text) == expected
    assert kimi.encode(text) != kimi.encoding.encode(text)  # the cut really matters here
    assert kimi.decode(kimi.encode(text)) == text


def test_all_asset_tokenizers_load_and_round_trip():
    paths = [asset_path("kimi"), asset_path("tokenizers/qwen3"), asset_path("tokenizers/deepseek-v3"), stories_dir()]
    for path in paths:
        tok = load_tokenizer(path)
        assert isinstance(tok, Tokenizer)
        text = "Once upon a time, there was a little girl.\n"
        ids = tok.encode(text)
        assert ids_to_bytes(tok, ids).decode().lstrip() == text.lstrip()


def test_hf_byte_level_token_bytes(qwen3):
    assert isinstance(qwen3, HFTokenizer)
    ids = qwen3.encode(MIXED)
    assert ids_to_bytes(qwen3, ids) == MIXED.encode()
    im_end = special_id(qwen3, "<|im_end|>")
    assert qwen3.encode("<|im_end|>", allow_special=True) == [im_end]
    assert im_end not in qwen3.encode("<|im_end|>")


def test_sentencepiece_style_token_bytes_use_byte_fallback(stories):
    text = "Lily saw a dog. 🐶"
    ids = stories.encode(text)
    assert ids_to_bytes(stories, ids) == b" " + text.encode()  # the dummy-prefix space is a real byte of the first token
    assert stories.decode(ids) == text


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_long_texts_encode_to_the_same_ids_while_other_threads_keep_running():
    """Over GIL_FREE_CHARS the HF tokenizer encodes through the batch call: the same IDs, and a thread beside it
    is not stopped for the whole encode (the server's event loop answers /health meanwhile)."""
    import threading
    import time

    from kimi_eagle.assets import stories_dir
    from kimi_eagle.tokenize.tokenizer import GIL_FREE_CHARS, HFTokenizer

    tok = HFTokenizer.from_dir(stories_dir())
    text = ("Once upon a time, there was a little girl named Lily. <s> She liked to play. \n" * 40_000)
    assert len(text) > GIL_FREE_CHARS
    for allow_special in (False, True):
        tok._tok.encode_special_tokens = not allow_special
        reference = tok._tok.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, allow_special=allow_special) == reference
    gaps: list[float] = []
    done = threading.Event()

    def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    thread = threading.Thread(target=ticker)
    thread.start()
    start = time.perf_counter()
    tok.encode(text * 3)
    elapsed = time.perf_counter() - start
    done.set()
    thread.join(timeout=10)
    assert max(gaps) < max(0.5, elapsed / 2), (max(gaps), elapsed)
