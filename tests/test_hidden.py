"""Hidden-state extraction on the real stories260K target: layer ids, contents, storage, resume."""
import json

import pytest
import torch
from safetensors import safe_open

from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3.extract import ExtractOptions, extract
from kimi_eagle.eagle3.hidden import Row, bytes_per_token, load_rows, load_target
from kimi_eagle.eagle3.readers import HiddenStates
from kimi_eagle.eagle3.speculative import generate_target_only

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target():
    return load_target(stories_dir())


@pytest.fixture(scope="module")
def rows(target, stories):
    """Real sampled completions of the target, prompt masked out."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i, text in enumerate(["Once upon a time", "The dog", "Tom had a red ball", "One day"]):
        prompt = [1] + stories.encode(text)
        completion = generate_target_only(target, prompt, 12 + 5 * i, 1.0, 2, g)
        out.append(Row(f"r{i}", prompt + completion, [0] * len(prompt) + [1] * len(completion)))
    return out


def test_extracted_states_are_the_target_block_outputs(target, rows, tmp_path):
    manifest = extract(stories_dir(), rows, tmp_path / "hs", dtype="bf16", shard_rows=3, model=target)
    assert manifest["layer_ids"] == [1, 2, 3] and manifest["complete"] and manifest["dtype"] == "bf16"
    assert manifest["n_tokens"] == sum(len(r.input_ids) for r in rows)
    hs = HiddenStates(tmp_path / "hs")
    assert len(hs) == len(rows) and hs.row_ids == [r.id for r in rows] and hs.verify() == []
    for row, got in zip(rows, hs):
        with torch.no_grad():
            o = target(torch.tensor([row.input_ids]), output_hidden_states=True)
        want_aux = torch.cat([o.hidden_states[i + 1][0] for i in (1, 2, 3)], dim=-1)
        assert got["aux"].dtype == torch.bfloat16 and got["aux"].shape == (len(row.input_ids), 3 * 64)
        assert torch.equal(got["aux"], want_aux.to(torch.bfloat16))
        assert torch.equal(got["final"], o.hidden_states[-1][0].to(torch.bfloat16))
        assert got["input_ids"].tolist() == row.input_ids and got["loss_mask"].tolist() == row.loss_mask
    # final is post-norm: the target's lm_head over it gives the target's logits
    ref = rows[0]
    with torch.no_grad():
        logits = target(torch.tensor([ref.input_ids])).logits[0]
    fp32 = extract(stories_dir(), rows[:1], tmp_path / "fp32", dtype="fp32", model=target)
    final = HiddenStates(tmp_path / "fp32")[0]["final"]
    assert torch.allclose(target.lm_head(final), logits, atol=1e-5)
    assert fp32["bytes_per_token"] > bytes_per_token(64, 4)  # payload plus the shard's header and offsets


def test_manifest_describes_shards(target, rows, tmp_path):
    m = extract(stories_dir(), rows, tmp_path, dtype="fp16", shard_rows=3, model=target)
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert on_disk == {k: v for k, v in m.items() if k != "reused_rows"} and m["reused_rows"] == 0
    assert m["layer_id_convention"].startswith("0-based block-output")
    assert len(m["target_sha256"]) == 64 and [s["rows"] for s in m["shards"]] == [[0, 3], [3, 4]]
    with safe_open(str(tmp_path / m["shards"][0]["file"]), framework="pt") as f:
        assert set(f.keys()) == {"input_ids", "loss_mask", "aux", "final", "offsets", "row_index", "layer_ids"}
        assert f.get_tensor("layer_ids").tolist() == m["layer_ids"]  # checked against the manifest on read (issue 37)
        assert f.get_slice("aux").get_dtype() == "F16"


def test_extraction_resumes_without_redoing_finished_shards(target, rows, tmp_path):
    full = extract(stories_dir(), rows, tmp_path / "a", shard_rows=2, model=target)
    # an interrupted run: only the first shard and its manifest entry were written
    part = tmp_path / "b"
    first = extract(stories_dir(), rows, part, shard_rows=2, model=target)
    (part / first["shards"][1]["file"]).unlink()
    first_mtime = (part / first["shards"][0]["file"]).stat().st_mtime_ns
    resumed = extract(stories_dir(), rows, part, shard_rows=2, model=target)
    assert (part / first["shards"][0]["file"]).stat().st_mtime_ns == first_mtime
    assert resumed["reused_rows"] == 2 and first["reused_rows"] == 0  # says what it kept (the first shard's rows)
    assert [s["sha256"] for s in resumed["shards"]] == [s["sha256"] for s in full["shards"]]
    with pytest.raises(ValueError, match="different"):
        extract(stories_dir(), rows, part, shard_rows=2, model=target, layer_ids=[0, 2, 4])


def test_a_row_over_the_limit_is_skipped_whole_and_named_in_the_manifest(target, rows, tmp_path):
    """Long rows are skipped, never cut: a shard whose only row is too long is written empty, the manifest
    lists the row with its reason, and the reader yields every other row whole."""
    limit = max(len(r.input_ids) for r in rows) - 1
    too_long = [k for k, r in enumerate(rows) if len(r.input_ids) > limit]
    m = extract(stories_dir(), rows, tmp_path / "hs", ExtractOptions(shard_rows=1, max_len=limit), model=target)
    assert m["long_rows"]["policy"] == "skip" and m["long_rows"]["max_len"] == limit
    assert [r["row"] for r in m["long_rows"]["rows"]] == too_long and m["long_rows"]["n"] == len(too_long) > 0
    assert all("longer than the" in r["reason"] for r in m["long_rows"]["rows"])
    assert m["complete"] and [s["ids"] for s in m["shards"]] == [[] if k in too_long else [r.id] for k, r in enumerate(rows)]
    kept = [r for k, r in enumerate(rows) if k not in too_long]
    hs = HiddenStates(tmp_path / "hs")
    assert hs.row_ids == [r.id for r in kept] and hs.verify() == []
    assert [got["input_ids"].tolist() for got in hs] == [r.input_ids for r in kept]
    resumed = extract(stories_dir(), rows, tmp_path / "hs", ExtractOptions(shard_rows=1, max_len=limit), model=target)
    assert [s["sha256"] for s in resumed["shards"]] == [s["sha256"] for s in m["shards"]]


def test_bad_rows_are_reported_not_dropped(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join([
        json.dumps({"id": "ok", "prompt_ids": [1, 5], "completion_ids": [6, 2]}),
        json.dumps({"id": "engine", "prompt_ids": [1], "output_ids": [7, 8]}),
        json.dumps({"id": "failed", "status": "error", "error": "no content"}),
        json.dumps({"id": "short", "input_ids": [1], "loss_mask": [1]}),
        json.dumps({"id": "engine-failed", "error": "prompt too long"}),
        "not json",
    ]) + "\n")
    rows, skipped = load_rows(data)
    assert [(r.id, r.input_ids, r.loss_mask) for r in rows] == [
        ("ok", [1, 5, 6, 2], [0, 0, 1, 1]), ("engine", [1, 7, 8], [0, 1, 1])]
    assert [s["id"] for s in skipped] == ["failed", "short", "engine-failed", None]
    assert skipped[2]["reason"] == "error: prompt too long"
    assert all(s["reason"] for s in skipped)


def test_kimi_bytes_per_token_arithmetic():
    # aux 3H + final H at 2 bytes, plus an int64 id and a mask byte
    assert bytes_per_token(7168) == 4 * 7168 * 2 + 9 == 57_353


def test_fp8_shards_hold_e4m3_values_with_a_scale_per_token_and_layer(target, rows, tmp_path):
    from kimi_eagle.eagle3.quant import FP8_MAX, dequantize_fp8, quantize_fp8

    m8 = extract(stories_dir(), rows, tmp_path / "fp8", dtype="fp8", shard_rows=3, model=target)
    m16 = extract(stories_dir(), rows, tmp_path / "bf16", dtype="bf16", shard_rows=3, model=target)
    assert m8["dtype"] == "fp8" and m8["payload_bytes_per_token"] == 4 * 64 + 4 * 4 + 9  # values + 4 fp32 scales + id + mask
    assert m8["payload_vs_bf16"] == round(281 / 521, 4) and m16["payload_vs_bf16"] == 1.0
    assert m8["bytes"] < 0.6 * m16["bytes"]
    with safe_open(str(tmp_path / "fp8" / m8["shards"][0]["file"]), framework="pt") as f:
        assert f.get_slice("aux").get_dtype() == "F8_E4M3" and f.get_slice("aux_scale").get_shape() == [m8["shards"][0]["n_tokens"], 3]
        aux_q = f.get_tensor("aux")
        # absmax scaling: every token's largest value in every layer maps to ±448
        per_layer = aux_q.float().abs().reshape(-1, 3, 64).amax(-1)
        assert torch.equal(per_layer, torch.full_like(per_layer, FP8_MAX))
    # the reader dequantizes: within half an e4m3 step (2**-4 relative) of the exact states, plus the subnormal floor
    for exact, got in zip(HiddenStates(tmp_path / "bf16"), HiddenStates(tmp_path / "fp8")):
        assert got["aux"].dtype == torch.float32 and got["aux"].shape == exact["aux"].shape
        for name, n in (("aux", 3), ("final", 1)):
            x = exact[name].float()
            scale = x.reshape(len(x), n, 64).abs().amax(-1, keepdim=True) / FP8_MAX
            bound = (x.reshape(len(x), n, 64).abs() * 2**-4 + scale * 2**-10 + x.reshape(len(x), n, 64).abs() * 2**-8).reshape(x.shape)
            assert ((got[name] - x).abs() <= bound).all(), name  # (2**-8: the bf16 reference's own rounding)
    # an all-zero block is stored exactly (scale 1), and quantization round-trips its own grid exactly
    q, s = quantize_fp8(torch.zeros(2, 8), 4)
    assert torch.equal(s, torch.ones(2, 2)) and torch.equal(dequantize_fp8(q, s), torch.zeros(2, 8))
    q, s = quantize_fp8(torch.tensor([[448.0, -1.0, 0.5, 2.0]]), 4)
    assert torch.equal(dequantize_fp8(q, s), torch.tensor([[448.0, -1.0, 0.5, 2.0]]))


def test_fp8_halves_the_bytes_at_kimi_scale():
    from kimi_eagle.eagle3.quant import fp8_bytes_per_token

    assert fp8_bytes_per_token(7168) == 4 * 7168 + 16 + 9 == 28_697
    assert fp8_bytes_per_token(7168) / bytes_per_token(7168) <= 0.52  # 0.5004


def test_rows_whose_tool_call_the_server_dropped_are_skipped_by_name(tmp_path):
    """A ``dropped_by_server`` row's IDs after the last known byte are unknown, an ``answer_empty`` row's answer
    was never returned: neither is trained on."""
    from kimi_eagle.eagle3.hidden import ANSWER_EMPTY_REASON, DROPPED_BY_SERVER_REASON, load_rows

    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in [
        {"id": "kept", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]},
        {"id": "cut", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "flags": ["dropped_by_server"]},
        {"id": "empty", "input_ids": [1, 2, 3], "loss_mask": [0, 0, 1], "flags": ["answer_empty"]},
    ]) + "\n")
    kept, skipped = load_rows(rows)
    assert [r.id for r in kept] == ["kept"]
    assert skipped == [{"index": 1, "id": "cut", "reason": DROPPED_BY_SERVER_REASON},
                       {"index": 2, "id": "empty", "reason": ANSWER_EMPTY_REASON}]


def test_export_data_drops_rows_the_server_cut_by_default():
    from kimi_eagle.apps.commands.export_data import DEFAULT_DROP_FLAGS

    assert {"literal_marker", "dropped_by_server", "answer_empty"} <= set(DEFAULT_DROP_FLAGS)
