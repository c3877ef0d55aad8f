"""Hostile files, fields and options on the DFlash, evaluate, compare and export-data paths (issue 48): each is
refused in one line (exit 2, no traceback) naming the path, field or option at fault — or, where the rest of the
run is sound, said as a warning naming the run and field.

Cases that held before the fix are kept beside the fixed ones (marked ``# fixed``), so that the table stays whole.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from kimi_eagle.apps.cli import main
from kimi_eagle.assets import stories_dir

TARGET = stories_dir()
ROWS = [[1, 403 + i, 407, 261, 378, 275, 263, 380, 31, 315] for i in range(4)]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A DFlash extraction of stories260K (``df/``), a DFlash drafter trained 2 steps on it (``run/drafter``), a
    prompt file and an export-data row file."""
    from kimi_eagle.eagle3.extract import extract
    from kimi_eagle.eagle3.hidden import Row, load_target

    root = tmp_path_factory.mktemp("made")
    extract(TARGET, [Row(str(i), ids, [0] * 3 + [1] * 7) for i, ids in enumerate(ROWS)], root / "df", drafter="dflash",
            model=load_target(TARGET))
    assert main(["train", str(root / "df"), "--target", str(TARGET), "-o", str(root / "run"), "--drafter", "dflash",
                 "--steps", "2", "--no-progress"]) == 0
    (root / "prompts.jsonl").write_text(json.dumps({"id": "p", "prompt_ids": [1, 403, 407, 261]}) + "\n")
    (root / "rows.jsonl").write_text(json.dumps({"id": "a", "input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}) + "\n")
    return root


class Case:
    """Builds one hostile input under ``tmp`` from the ``made`` fixtures, and the command line that reads it."""

    def __init__(self, made: Path, tmp: Path):
        self.made, self.tmp = made, tmp

    def copy(self, src: Path, name: str) -> Path:
        (shutil.copytree if src.is_dir() else shutil.copy)(src, self.tmp / name)
        return self.tmp / name

    def file(self, name: str, data: bytes = b"\x00garbage{") -> Path:
        (self.tmp / name).write_bytes(data)
        return self.tmp / name

    def folder(self, name: str) -> Path:
        (self.tmp / name).mkdir()
        return self.tmp / name

    def garbled(self, src: Path, name: str, inner: str) -> Path:
        copy = self.copy(src, name)
        self.file(f"{name}/{inner}")
        return copy

    def edited(self, src: Path, name: str, inner: str = "config.json", nested: str | None = None, **fields) -> Path:
        copy = self.copy(src, name)
        data = json.loads((copy / inner).read_text())
        (data[nested] if nested else data).update(fields)
        (copy / inner).write_text(json.dumps(data))
        return copy

    @property
    def drafter(self) -> Path:
        return self.made / "run" / "drafter"

    def train(self, data: Path | None = None, target: Path = TARGET, *extra: str) -> list[str]:
        return ["train", str(data or self.made / "df"), "--target", str(target), "-o", str(self.tmp / "out"),
                "--drafter", "dflash", "--steps", "2", "--no-progress", *extra]

    def evaluate(self, draft: Path | None = None, prompts: Path | None = None, target: Path = TARGET, *extra: str):
        return ["evaluate", str(prompts or self.made / "prompts.jsonl"), "--target", str(target), "--draft",
                str(draft or self.drafter), "--max-new-tokens", "4", "--temperatures", "0", "--no-ngram", *extra]

    def export(self, rows: Path | None = None, target: Path = TARGET, *extra: str, to: str = "speculators"):
        return ["export-data", str(rows or self.made / "rows.jsonl"), "--to", to, "-o", str(self.tmp / "xout"),
                "--target", str(target), *extra]

    def billing(self, name: str, **over) -> Path:
        summary = {"evidence": "billing-only", "data": "real", "n_records": 10,
                   "verdict_class": {"match": 5, "explained": 3, "unexplained": 2},
                   "by_provider": [{"provider": "all", "gap_pct": 1.0, "gap_pct_lo": 0.5, "gap_pct_hi": 1.5,
                                    "unexplained": 2, "rated": 10}], "by_dataset": []} | over
        self.file(f"{self.folder(name).name}/summary.json", json.dumps(summary).encode())
        return self.tmp / name

    def batch(self, name: str, value) -> Path:
        folder = self.folder(name)
        (folder / "batch.json").write_text("{}")
        pd.DataFrame({"run": ["r1"], "status": ["ok"], "metric.mismatch_rate": pd.Series([value], dtype=object),
                      "metric.mismatch_rate_ci.0": [0.1], "metric.mismatch_rate_ci.1": [0.3]}
                     ).to_parquet(folder / "summary.parquet")
        return folder

    def compare(self, a: Path, b: Path) -> list[str]:
        return ["compare", str(a), str(b), "-o", str(self.tmp / "cmp")]


def _resume_garbled_checkpoint(c: Case) -> list[str]:
    c.copy(c.made / "run", "out")
    c.file("out/checkpoint/last.pt")
    return [*c.train(), "--resume"]


def _garbled_shard(c: Case) -> list[str]:
    data = c.copy(c.made / "df", "df")
    c.file(f"df/{sorted(p.name for p in data.glob('*.safetensors'))[0]}")
    return c.train(data)


def _nan_summary(c: Case) -> list[str]:
    summary = c.billing("n") / "summary.json"
    summary.write_text(summary.read_text().replace('"gap_pct": 1.0', '"gap_pct": NaN'))
    return c.compare(c.billing("a"), summary.parent)


def _batch_pair(c: Case) -> list[str]:
    a, b = (c.folder(n) for n in ("a", "b"))
    for folder in (a, b):
        (folder / "batch.json").write_text("{}")
        c.file(f"{folder.name}/summary.parquet")
    return c.compare(a, b)


REFUSED = [  # (case, command line, words the one-line message names)
    ("train dflash: empty extraction folder", lambda c: c.train(c.folder("hs")), ["hs"]),
    ("train dflash: extraction is a file", lambda c: c.train(c.file("hs")), ["hs"]),
    ("train dflash: garbled manifest.json", lambda c: c.train(c.garbled(c.made / "df", "d", "manifest.json")), ["d/manifest.json"]),
    ("train dflash: manifest layer_ids a string",
     lambda c: c.train(c.edited(c.made / "df", "d", "manifest.json", layer_ids="0,1")), ["layer_ids"]),
    ("train dflash: manifest vocab_size 'x'",  # fixed
     lambda c: c.train(c.edited(c.made / "df", "d", "manifest.json", vocab_size="x")), ["d/manifest.json", "vocab_size"]),
    ("train dflash: garbled shard", _garbled_shard, ["shard-00000.safetensors"]),
    ("train dflash: target num_hidden_layers '5'",  # fixed
     lambda c: c.train(None, c.edited(TARGET, "t", num_hidden_layers="5")), ["t/config.json", "num_hidden_layers"]),
    ("train dflash: target hidden_size null",  # fixed
     lambda c: c.train(None, c.edited(TARGET, "t", hidden_size=None)), ["t/config.json", "hidden_size"]),
    ("train dflash: target vocab_size 'big'",  # fixed
     lambda c: c.train(None, c.edited(TARGET, "t", vocab_size="big")), ["t/config.json", "vocab_size"]),
    ("train dflash: target config.json garbled", lambda c: c.train(None, c.garbled(TARGET, "t", "config.json")), ["config.json"]),
    ("train dflash: target model.safetensors garbled",  # fixed
     lambda c: c.train(None, c.garbled(TARGET, "t", "model.safetensors")), ["t/model.safetensors"]),
    ("train dflash: target is a file", lambda c: c.train(None, c.file("t")), ["t"]),
    ("train dflash: garbled checkpoint with --resume", _resume_garbled_checkpoint, ["out/checkpoint/last.pt"]),
    ("train dflash: unknown --dflash-recipe", lambda c: c.train(None, TARGET, "--dflash-recipe", "nope"), ["--dflash-recipe", "kit"]),
    ("train dflash: unknown --dflash-weighting", lambda c: c.train(None, TARGET, "--dflash-weighting", "x"), ["--dflash-weighting", "power"]),
    ("evaluate: --draft empty folder", lambda c: c.evaluate(c.folder("d")), ["d/config.json"]),
    ("evaluate: --draft is a file", lambda c: c.evaluate(c.file("d")), ["d/config.json"]),
    ("evaluate: drafter config.json garbled", lambda c: c.evaluate(c.garbled(c.drafter, "d", "config.json")), ["d/config.json"]),
    ("evaluate: drafter block_size '8'", lambda c: c.evaluate(c.edited(c.drafter, "d", nested="config", block_size="8")), ["block_size"]),
    ("evaluate: drafter aux_layer_ids 'x'",
     lambda c: c.evaluate(c.edited(c.drafter, "d", nested="config", aux_layer_ids="x")), ["aux_layer_ids"]),
    ("evaluate: drafter num_draft_layers 2.5",
     lambda c: c.evaluate(c.edited(c.drafter, "d", nested="config", num_draft_layers=2.5)), ["num_draft_layers"]),
    ("evaluate: drafter mask_token_id -1",
     lambda c: c.evaluate(c.edited(c.drafter, "d", nested="config", mask_token_id=-1)), ["mask_token_id"]),
    ("evaluate: drafter format unknown", lambda c: c.evaluate(c.edited(c.drafter, "d", format="nope/9")), ["d"]),
    ("evaluate: drafter 'config' a list", lambda c: c.evaluate(c.edited(c.drafter, "d", config=[1])), ["config"]),
    ("evaluate: drafter weights garbled", lambda c: c.evaluate(c.garbled(c.drafter, "d", "model.safetensors")), ["d/model.safetensors"]),
    ("evaluate: drafter weights missing",
     lambda c: c.evaluate((lambda d: ((d / "model.safetensors").unlink(), d)[1])(c.copy(c.drafter, "d"))), ["d/model.safetensors"]),
    ("evaluate: prompts file empty", lambda c: c.evaluate(None, c.file("p.jsonl", b"")), ["p.jsonl", "no prompts"]),  # fixed
    ("evaluate: prompts folder empty", lambda c: c.evaluate(None, c.folder("p")), ["p"]),
    ("evaluate: prompt_ids strings", lambda c: c.evaluate(None, c.file("p.jsonl", b'{"prompt_ids": ["a"]}\n')), ["prompt_ids"]),
    ("evaluate: prompt_ids out of vocabulary",
     lambda c: c.evaluate(None, c.file("p.jsonl", b'{"prompt_ids": [1, 99999999]}\n')), ["99999999"]),
    ("evaluate: --temperatures nan", lambda c: c.evaluate(None, None, TARGET, "--temperatures", "nan"), ["--temperatures"]),
    ("evaluate: target config.json garbled", lambda c: c.evaluate(None, None, c.garbled(TARGET, "t", "config.json")), ["t/config.json"]),
    ("evaluate: target hidden_size '64'",  # fixed
     lambda c: c.evaluate(None, None, c.edited(TARGET, "t", hidden_size="64")), ["t/config.json", "hidden_size"]),
    ("compare: a run is a file", lambda c: c.compare(c.billing("a"), c.file("f")), ["f"]),
    ("compare: an empty folder", lambda c: c.compare(c.billing("a"), c.folder("e")), ["e"]),
    ("compare: n_records 'ten'", lambda c: c.compare(c.billing("a"), c.billing("b", n_records="ten")), ["b/summary.json", "n_records"]),
    ("compare: NaN in summary.json", _nan_summary, ["n/summary.json", "NaN"]),
    ("compare: by_provider a string",  # fixed
     lambda c: c.compare(c.billing("a"), c.billing("b", by_provider="all")), ["b/summary.json", "by_provider"]),
    ("compare: gap_pct a string",  # fixed
     lambda c: c.compare(c.billing("a"), c.billing("b", by_provider=[{"provider": "all", "gap_pct": "1.0"}])),
     ["b/summary.json", "by_provider['all'].gap_pct"]),
    ("compare: verdict_class counts strings",
     lambda c: c.compare(c.billing("a"), c.billing("b", verdict_class={"match": "5"})), ["verdict_class.match"]),
    ("compare: batch summary.parquet garbled", _batch_pair, ["a/summary.parquet"]),
    ("compare: batch metric inf", lambda c: c.compare(c.batch("a", 0.2), c.batch("b", float("inf"))), ["run B", "mismatch rate · r1"]),
    ("compare: -o is a file", lambda c: ["compare", str(c.billing("a")), str(c.billing("b")), "-o", str(c.file("o"))], ["o"]),
    ("export-data: rows is a folder", lambda c: c.export(c.folder("r")), ["r"]),
    ("export-data: rows file empty", lambda c: c.export(c.file("r.jsonl", b"")), ["r.jsonl"]),
    ("export-data: rows parquet garbled", lambda c: c.export(c.file("r.parquet")), ["r.parquet"]),  # fixed
    ("export-data: target config.json garbled", lambda c: c.export(None, c.garbled(TARGET, "t", "config.json")), ["t/config.json"]),  # fixed
    ("export-data: target vocab_size '512'", lambda c: c.export(None, c.edited(TARGET, "t", vocab_size="512")), ["vocab_size"]),  # fixed
    ("export-data: target hidden_size 1.5", lambda c: c.export(None, c.edited(TARGET, "t", hidden_size=1.5)), ["hidden_size"]),
    ("export-data: target is a file", lambda c: c.export(None, c.file("t")), ["t"]),
    ("export-data: unknown --to", lambda c: c.export(None, TARGET, to="nope"), ["--to", "speculators"]),
    ("export-data: input_ids strings",
     lambda c: c.export(c.file("r.jsonl", b'{"id": "a", "input_ids": ["1", "2"], "loss_mask": [0, 1]}\n')), ["input_ids"]),
    ("export-data: -o is a file", lambda c: ["export-data", str(c.made / "rows.jsonl"), "--to", "tokens", "-o", str(c.file("o")),
                                             "--target", str(TARGET)], ["o"]),
]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's refusals
        code = e.code
    io = capsys.readouterr()
    return code, io.out, io.err


@pytest.mark.parametrize("build,words", [(b, w) for _, b, w in REFUSED], ids=[n for n, _, _ in REFUSED])
def test_a_hostile_input_is_refused_in_one_line_naming_what_is_wrong(made, tmp_path, capsys, build, words):
    argv = build(Case(made, tmp_path))
    code, _, err = run(argv, capsys)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and "Traceback" not in err and len(errors) == 1, err[-2000:]
    assert all(w in errors[0] for w in words), errors[0]


def test_a_batch_run_with_a_non_numeric_metric_is_compared_without_it_and_said(made, tmp_path, capsys):  # fixed
    c = Case(made, tmp_path)
    code, out, err = run(c.compare(c.batch("a", 0.2), c.batch("b", "abc")), capsys)
    assert code == 0 and "Traceback" not in err
    assert "run B: batch run 'r1' reports metric.mismatch_rate = 'abc', not a number" in out, out
