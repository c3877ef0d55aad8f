"""Hidden states in the trainers' layouts, both ways, on the real stories260K target: every stored tensor is
HF ``output_hidden_states`` at the index its convention names, speculators' ``ArrowDataset`` + collate and
SpecForge's ``build_offline_eagle3_dataset`` see exactly the kit's tensors, and ``train`` reads all three."""
from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import replace

import pytest
import torch

from kimi_eagle.apps.cli import main as cli_main
from kimi_eagle.apps.interop.export_data import export_data
from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3.extract import ExtractOptions, extract
from kimi_eagle.eagle3.hidden import Row, load_target
from kimi_eagle.eagle3.layers import speculators_layer_ids, trainer_layer_ids
from kimi_eagle.eagle3.layouts import arrow_rows, specforge_path, speculators_path
from kimi_eagle.eagle3.readers import load_specforge_file, open_hidden_states, prompts_from_hidden, rms_norm
from kimi_eagle.eagle3.speculative import generate_target_only
from kimi_eagle.eagle3.writers import speculators_payload
from kimi_eagle.io import write_jsonl

torch.set_num_threads(1)
LAYERS = [1, 2, 3]  # stories260K's (5 blocks) default aux block outputs
N_ROWS = 12  # enough for SpecForge's string order (data_10 before data_2) to differ from the row order


@pytest.fixture(scope="module")
def target():
    return load_target(stories_dir())


@pytest.fixture(scope="module")
def data(target, stories, tmp_path_factory):
    """Real sampled rows, exported for both trainers, with hidden states extracted in each layout."""
    g = torch.Generator().manual_seed(3)
    rows = []
    for i in range(N_ROWS):
        prompt = [1] + stories.encode(["Once upon a time", "The dog", "Tom had a red ball", "One day"][i % 4])
        completion = generate_target_only(target, prompt, 6 + i % 5, 1.0, None, g)
        rows.append(Row(f"r{i}", prompt + completion, [0] * len(prompt) + [1] * len(completion)))
    root = tmp_path_factory.mktemp("layouts")
    src = write_jsonl(root / "rows.jsonl", ({"id": r.id, "input_ids": r.input_ids, "loss_mask": r.loss_mask} for r in rows))
    kw = dict(vocab_size=512, draft_vocab_size=64, target=str(stories_dir()), n_layers=5, hidden_size=64)
    export_data(src, "speculators", root / "spec", **kw)
    export_data(src, "specforge", root / "sf", **kw)
    # max_tokens=1: one row per forward, so the stored values are those of an unpadded HF forward, bit for bit
    one_row_batches = ExtractOptions(dtype="bf16", max_tokens=1)
    extract(stories_dir(), rows, root / "kit", one_row_batches, model=target)
    extract(stories_dir(), arrow_rows(root / "spec"), root / "spec" / "hidden_states",
            replace(one_row_batches, layout="speculators", rows_source=root / "spec"), model=target)
    extract(stories_dir(), rows, root / "sf" / "hidden_states",
            replace(one_row_batches, layout="specforge", rows_source=root / "sf"), model=target)
    return root, rows


def hf_states(target, row):
    """HF ``output_hidden_states`` of one row, plus the last block's output before the final norm."""
    captured = {}
    hook = target.model.layers[-1].register_forward_hook(lambda _m, _i, o: captured.setdefault("pre", o[0] if isinstance(o, tuple) else o))
    try:
        with torch.no_grad():
            out = target(torch.tensor([row.input_ids]), output_hidden_states=True)
    finally:
        hook.remove()
    return [h[0] for h in out.hidden_states], captured["pre"][0]


def bf16(x):
    return x.to(torch.bfloat16)


def test_speculators_files_hold_hf_states_at_the_capture_before_ids(data, target):
    root, rows = data
    m = json.loads((root / "spec" / "hidden_states" / "manifest.json").read_text())
    capture = speculators_layer_ids(LAYERS, 5)
    assert m["layer_ids"] == LAYERS and m["trainer_layer_ids"] == capture == [2, 3, 4, 5] and m["complete"]
    from safetensors.torch import load_file

    for k, row in enumerate(rows):
        stored = load_file(str(speculators_path(root / "spec" / "hidden_states", k)))
        assert stored["token_ids"].dtype == torch.int64 and stored["token_ids"].tolist() == row.input_ids
        assert stored["hidden_states"].shape == (len(row.input_ids), 4, 64)
        hs, pre_norm = hf_states(target, row)
        for j, layer in enumerate(capture[:3]):  # capture before block j = HF hidden_states[j]
            assert torch.equal(stored["hidden_states"][:, j], bf16(hs[layer]))
        # the 4th is the last block's output before the final norm; HF's hidden_states[n] is after it
        assert torch.equal(stored["hidden_states"][:, 3], bf16(pre_norm))
        assert torch.equal(target.model.norm(pre_norm), hs[5]) and not torch.equal(pre_norm, hs[5])


def test_specforge_files_hold_hf_states_at_the_block_output_ids(data, target):
    root, rows = data
    assert trainer_layer_ids(LAYERS, 5, "specforge") == LAYERS  # SGLang reads ids starting at 1 as block outputs
    for k, row in enumerate(rows):
        path = specforge_path(root / "sf" / "hidden_states", k)
        assert path.parent.name == "rows_0-2000" and path.name == f"data_{k}.ckpt"
        stored = load_specforge_file(path)
        assert stored["input_ids"].dtype == stored["loss_mask"].dtype == torch.int64
        assert stored["input_ids"].tolist() == row.input_ids and stored["loss_mask"].tolist() == row.loss_mask
        hs, _ = hf_states(target, row)
        assert torch.equal(stored["aux_hidden_state"][0], bf16(torch.cat([hs[i + 1] for i in LAYERS], -1)))
        assert torch.equal(stored["hidden_state"][0], bf16(hs[-1]))  # after the final norm
        assert stored["aux_hidden_state"].shape == (1, len(row.input_ids), 192)


def test_speculators_arrow_dataset_and_collate_see_the_kits_tensors(data):
    from speculators.train.data import ArrowDataset, CollateFn

    root, rows = data
    ours = open_hidden_states(root / "spec" / "hidden_states", stories_dir())
    assert len(ours) == N_ROWS and ours.row_ids == [r.id for r in rows] and tuple(ours.layer_ids) == tuple(LAYERS)
    theirs = ArrowDataset(max_len=4096, datapath=str(root / "spec"), on_missing="raise")
    norm = load_target(stories_dir()).model.norm
    for i in range(N_ROWS):
        t, o = theirs[i], ours[i]
        assert torch.equal(t["input_ids"], o["input_ids"]) and torch.equal(t["loss_mask"].to(torch.uint8), o["loss_mask"])
        assert torch.equal(t["hidden_states"], o["aux"])
        with torch.no_grad():  # speculators applies the verifier's norm itself; the kit reader already did
            assert torch.equal(rms_norm(t["verifier_last_hidden_states"], norm.weight, norm.variance_epsilon), o["final"])
            assert torch.equal(norm(t["verifier_last_hidden_states"].float()), o["final"])
    batch = CollateFn(max_len=4096, hidden_size=64)([theirs[0], theirs[1]])
    n0, n1 = len(rows[0].input_ids), len(rows[1].input_ids)
    assert torch.equal(batch["input_ids"][0, : n0 + n1], torch.cat([ours[0]["input_ids"], ours[1]["input_ids"]]))
    assert torch.equal(batch["hidden_states"][0, : n0 + n1], torch.cat([ours[0]["aux"], ours[1]["aux"]]))
    assert batch["loss_mask"][0, : n0 + n1].tolist() == rows[0].loss_mask + rows[1].loss_mask
    assert batch["error_records"] == 0


def test_speculators_fp8_variant_is_hs_connectors_quantization(data, target, tmp_path):
    from hs_connectors.fp8_utils import quantize_tensor_to_fp8
    from hs_connectors.transfer import FP8Transfer
    from safetensors.torch import load_file
    from speculators.train.data import ArrowDataset

    root, rows = data
    spec = tmp_path / "spec"
    shutil.copytree(root / "spec", spec, ignore=shutil.ignore_patterns("hidden_states"))
    for dtype in ("fp32", "fp8"):
        extract(stories_dir(), arrow_rows(spec), spec / dtype, layout="speculators", dtype=dtype, max_tokens=1,
                rows_source=spec, model=target)
    ours = open_hidden_states(spec / "fp8", stories_dir())
    transfer = FP8Transfer(spec / "fp8", dequantize_dtype=torch.float32)
    for k in range(3):
        exact = load_file(str(speculators_path(spec / "fp32", k)))["hidden_states"]
        stored = load_file(str(speculators_path(spec / "fp8", k)))
        values, scales = quantize_tensor_to_fp8(exact)
        assert stored["hidden_states"].dtype == torch.float8_e4m3fn and stored["hidden_states_scales"].shape == (len(rows[k].input_ids), 1, 1)
        assert torch.equal(stored["hidden_states"].view(torch.uint8), values.view(torch.uint8))
        assert torch.equal(stored["hidden_states_scales"], scales)
        assert torch.equal(ours.stored(k)["hidden_states"], transfer.get_cached(k)["hidden_states"])
    fp8_size = speculators_path(spec / "fp8", 0).stat().st_size
    assert fp8_size < 0.6 * speculators_path(root / "spec" / "hidden_states", 0).stat().st_size  # vs bf16
    theirs = ArrowDataset(max_len=4096, datapath=str(spec), transfer=transfer, on_missing="raise")
    assert torch.equal(theirs[2]["input_ids"], ours[2]["input_ids"])


def test_specforge_offline_dataset_sees_the_kits_tensors_matched_by_index(data):
    from specforge.data.preprocessing import build_offline_eagle3_dataset

    root, rows = data
    ours = open_hidden_states(root / "sf" / "hidden_states", stories_dir())
    assert len(ours) == N_ROWS and ours.manifest["rows_checked"] and ours.row_ids == [r.id for r in rows]
    theirs = build_offline_eagle3_dataset(str(root / "sf" / "hidden_states"), max_len=4096)
    order = [int(p.rsplit("data_", 1)[1].split(".")[0]) for p in theirs.datapaths]
    assert order != sorted(order)  # string order: data_10, data_11 before data_2
    for i, idx in enumerate(order):
        t, o = theirs[i], ours[idx]
        assert torch.equal(t["input_ids"][0], o["input_ids"]) and torch.equal(t["hidden_state"][0], o["aux"])
        assert torch.equal(t["target"][0], o["final"])
        # SpecForge zeroes the last position's mask itself (it has no next token)
        assert t["loss_mask"][0, :-1].tolist() == rows[idx].loss_mask[:-1] and t["loss_mask"][0, -1] == 0


def test_train_reads_all_three_layouts_and_sees_the_same_data(data, tmp_path):
    from kimi_eagle.eagle3.train import TrainConfig, read_history, train_drafter

    root, _ = data
    first = {}
    for name, path in (("kimi", root / "kit"), ("specforge", root / "sf" / "hidden_states"), ("speculators", root / "spec")):
        cfg = TrainConfig(data=str(path), target=str(stories_dir()), out=str(tmp_path / name), steps=2, ttt_steps=2,
                          batch_size=4, draft_vocab_size=64, log_every=1, save_every=100, progress=False)
        summary = train_drafter(cfg)
        assert summary["finished"] and summary["layer_ids"] == LAYERS and summary["data_skipped"] == {}
        first[name] = read_history(tmp_path / name / "train_log.jsonl")[0]["loss"]
    assert first["kimi"] == first["specforge"]  # the same bf16 tensors, the same rows
    # speculators stores the pre-norm last layer; the norm is applied on read (bf16 rounding before, not after)
    assert first["speculators"] == pytest.approx(first["kimi"], rel=1e-4)


def test_files_that_disagree_with_their_row_are_skipped_with_the_reason(data, tmp_path):
    root, rows = data
    spec = tmp_path / "spec"
    shutil.copytree(root / "spec", spec)
    hs = speculators_path(spec / "hidden_states", 1)
    hs.write_bytes(speculators_payload(rows[2].input_ids[: len(rows[1].input_ids)], torch.zeros(len(rows[1].input_ids), 192),
                                       torch.zeros(len(rows[1].input_ids), 64), "bf16"))
    speculators_path(spec / "hidden_states", 4).unlink()
    speculators_path(spec / "hidden_states", 5).write_bytes(b"not a safetensors file")
    with pytest.warns(UserWarning, match="3 hidden-state files skipped"):
        ours = open_hidden_states(spec, stories_dir())
    assert len(ours) == N_ROWS - 3 and "r1" not in ours.row_ids
    assert ours.manifest["read_skipped_by_reason"] == {"missing": 1, "token_ids disagree with the row's input_ids": 1,
                                                      "unreadable": 1}

    sf = tmp_path / "sf"
    shutil.copytree(root / "sf", sf)
    wrong = load_specforge_file(specforge_path(sf / "hidden_states", 3))
    wrong["input_ids"] = wrong["input_ids"].flip(0).clone()
    torch.save({k: v.clone() for k, v in wrong.items()}, specforge_path(sf / "hidden_states", 3))
    torch.save({"input_ids": torch.tensor([1]), "loss_mask": torch.tensor([1]), "payload": shutil.copytree},
               specforge_path(sf / "hidden_states", 7))  # a pickled callable: weights_only refuses it
    (sf / "hidden_states" / "rows_0-2000" / "stray.ckpt").write_bytes(b"x")
    with pytest.warns(UserWarning, match="3 hidden-state files skipped"):
        ours = open_hidden_states(sf / "hidden_states", stories_dir())
    assert ours.manifest["read_skipped_by_reason"] == {"refused": 1, "token_ids disagree with the row's input_ids": 1,
                                                      "unrecognised name": 1}
    assert len(ours) == N_ROWS - 2 and {"r3", "r7"}.isdisjoint(ours.row_ids)


def test_extraction_resumes_and_refuses_other_settings(data, target, tmp_path):
    root, rows = data
    out = tmp_path / "sf"
    shutil.copytree(root / "sf" / "hidden_states", out)
    before = {k: specforge_path(out, k).read_bytes() for k in range(N_ROWS)}
    specforge_path(out, 4).unlink()
    stamp = specforge_path(out, 5).stat().st_mtime_ns
    m = extract(stories_dir(), rows, out, layout="specforge", dtype="bf16", max_tokens=1, rows_source=root / "sf", model=target)
    assert m["complete"] and m["rows_written"] == N_ROWS and specforge_path(out, 5).stat().st_mtime_ns == stamp
    assert specforge_path(out, 4).read_bytes() == before[4]  # recomputed, the same bytes
    with pytest.raises(ValueError, match="different dtype"):
        extract(stories_dir(), rows, out, layout="specforge", dtype="fp16", model=target)
    with pytest.raises(ValueError, match="fp8 is speculators' FP8 variant"):
        extract(stories_dir(), rows, tmp_path / "x", layout="specforge", dtype="fp8", model=target)


def test_every_layout_skips_a_row_over_the_limit_and_states_the_policy(data, target, tmp_path):
    """One long-row policy for all three layouts: a row over ``max_len`` is left out whole (never cut), the
    manifest names it with its reason, and every other row is written exactly as without a limit."""
    root, rows = data
    limit = max(len(r.input_ids) for r in rows) - 1
    long_rows = [{"row": k, "id": r.id, "n_tokens": len(r.input_ids),
                  "reason": f"longer than the {limit}-token limit ({len(r.input_ids)} tokens)"}
                 for k, r in enumerate(rows) if len(r.input_ids) > limit]
    assert 0 < len(long_rows) < N_ROWS
    limited = ExtractOptions(max_tokens=1, shard_rows=5, max_len=limit)
    outs = {"kimi": (tmp_path / "kit", rows, limited),
            "speculators": (tmp_path / "spec", arrow_rows(root / "spec"),
                            replace(limited, layout="speculators", rows_source=root / "spec")),
            "specforge": (tmp_path / "sf", rows, replace(limited, layout="specforge", rows_source=root / "sf"))}
    unlimited = open_hidden_states(root / "kit", stories_dir())
    for layout, (out, these, options) in outs.items():
        m = extract(stories_dir(), these, out, options, model=target)
        assert m["long_rows"] == {"policy": "skip", "max_len": limit, "n": len(long_rows), "rows": long_rows}, layout
        assert m["complete"] and m["n_tokens"] == sum(len(r.input_ids) for r in rows) - sum(r["n_tokens"] for r in long_rows)
        with pytest.warns(UserWarning, match="long row") if layout == "speculators" else contextlib.nullcontext():
            ours = open_hidden_states(out, stories_dir())
        assert ours.row_ids == [r.id for r in rows if r.id not in {x["id"] for x in long_rows}], layout
        for i, rid in enumerate(ours.row_ids):
            want = unlimited[unlimited.row_ids.index(rid)]
            got = ours[i]
            assert got["input_ids"].tolist() == want["input_ids"].tolist(), (layout, rid)  # whole, never cut
            assert torch.equal(got["aux"].to(torch.bfloat16), want["aux"]), (layout, rid)


def test_evaluate_takes_prompts_from_any_layout(data):
    from kimi_eagle.eagle3.evaluate import load_prompts

    root, rows = data
    want = [(r.id, r.input_ids[: r.loss_mask.index(1)]) for r in rows]
    for path in (root / "kit", root / "spec" / "hidden_states", root / "sf" / "hidden_states"):
        assert load_prompts(path, stories_dir()) == want
    assert prompts_from_hidden(root / "sf", stories_dir()) == want  # the export dir finds its hidden_states


def test_cli_extract_layout(data, tmp_path, capsys):
    root, rows = data
    out = tmp_path / "hs"
    assert cli_main(["extract", "--layout", "specforge", "--target", str(stories_dir()), "--data", str(root / "sf"),
                     "-o", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["written"] == N_ROWS and printed["trainer_layer_ids"] == LAYERS
    assert sorted(p.name for p in out.rglob("*.ckpt")) == sorted(f"data_{k}.ckpt" for k in range(N_ROWS))
    assert cli_main(["extract", "--layout", "speculators", "--target", str(stories_dir()), "--data", str(root / "rows.jsonl"),
                     "-o", str(tmp_path / "x")]) == 2
    assert "export-data --to speculators" in capsys.readouterr().err  # hs_{row} must be the Arrow row
