"""Every command and notebook, on each kind of input it can carry, says that kind and no other (#46).

The matrix: for each command that writes a page, a chart, a summary or a ``metrics.json``, and for each data kind its
inputs can carry (``real``, ``simulated``, ``toy``, ``stand-in: …``; :mod:`kimi_eagle.data_kinds`), a small input of
that kind goes through the command, and every file it writes is read back: the kind word in the terminal line, the
title and banner of the page, every chart's tag (charts are also written as SVG, whose text keeps each title),
``metrics.json``, ``summary.json``, ``summary.md`` and ``summary.csv``. Nothing written for simulated, toy or stand-in
inputs calls its data real. ``compare`` of two runs of different kinds carries its warning in ``compare.html``,
``compare.md``, ``compare.csv`` and on the terminal; two runs of one kind carry none.

The inputs, each cheap (one simulated benchmark of 10 records, shared by the module):

- ``simulated``: ``kimi-eagle simulate`` (its labels beside the reconstruction; expected labels in the diff);
- ``real``: the same records without the benchmark's labels, Kimi's tokenizer, an engine that names no toy model:
  all a user's own logs carry;
- ``toy``: engine records naming tiny-kimi (``diff``, ``report``), a reconstruction with stories260K's tokenizer
  (``billing``), a stories260K target (``train``, notebooks 03 and 04);
- ``stand-in``: answers of a server on this machine (``collect``, notebook 00, ``audit`` and notebook 05; ``billing``
  of their reconstruction).

The source of a reconstruction travels inside it: ``collect`` stores the address of each answer, ``reconstruct``
writes the kind of its API records (a toy model named, a server on this machine) into the parquet's metadata, and
``billing`` reads it. tiny-kimi served from the demo's cache names itself (``tiny-kimi-<key>``) in every engine record
and answer. A kind nobody recorded (a training folder from before the ``data`` field) is said to be not recorded.

Kinds a command's inputs cannot carry, and why:

- ``diff``, ``report``: no stand-in. A diff's vocabulary is ``real``, ``simulated``, ``toy`` (from its labels, its
  engine records' model, the model its reconstruction's API records name, its tokenizer); ``billing`` reads stand-in
  from its reconstruction's source. ``--data`` may only make any of them more cautious.
- ``audit`` (notebook 05): only ``real`` (providers over the network) or ``stand-in`` (a local server); it asks
  providers, so it has no simulated or toy input of its own (a local stories260K is a stand-in).
- ``train``: the kind of its target model's generations: ``toy`` for stories260K and tiny-kimi, else ``real``; only a
  real Kimi target (not in the assets) would be real.
- notebook 01b: always ``real``: it reconstructs the bundled real conversations with Kimi's tokenizer and template
  (it has no tokenizer parameter).

Commands with no kind to propagate (what they write names no data kind, so none can be wrong; the tests below check
they never call anything real): ``collect`` (its ``.summary.json/.md/.csv`` count requests; notebook 00's
``metrics.json`` states the kind, from the server's address), ``providers`` (a calibration table of the log it is
given), ``evaluate`` (its report JSON names the target and measures τ; the kind is its target's, stated by notebook
03's ``metrics.json``), ``probe`` (a tokenizer report; notebook 01's ``metrics.json`` states the kind),
``convert``, ``reconstruct``, ``simulate``, ``generate``, ``extract``, ``export``, ``export-data``, ``serve`` and
``tiny-kimi`` (data files and models, no pages or summaries).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from kimi_eagle.apps import cli
from kimi_eagle.apps.reports.outputs import DPI_ENV, FORMAT_ENV
from kimi_eagle.assets import REPO_ROOT, stories_dir
from kimi_eagle.data_kinds import REAL, SIMULATED, STORIES_STAND_IN, TOY, base_kind, data_tag

DIFF_KINDS = (REAL, SIMULATED, TOY)
TAGS = {kind: data_tag(kind) for kind in DIFF_KINDS}


# ---- reading what a command wrote


def claims_real(text: str) -> list[str]:
    """Every place ``text`` (a page, chart, summary, CSV, terminal) calls its data real: the ``[REAL data]`` tag,
    "real data" (never "not real data"), a ``data`` field or cell of ``real``, the page's ``data real`` class."""
    text = re.sub(r"base64,[A-Za-z0-9+/=]+", "", text)
    patterns = (r"\[REAL data\]", r"(?<!not )\breal data\b", r'"data":\s*"real"', r"(^|,)data,real\b",
                r"\|\s*data\s*\|\s*real\s*\|", r"class='data real'", r"\(real\b[^)]*data\)")
    return [m.group(0) for p in patterns for m in re.finditer(p, text, re.I | re.M)]


def written_text(folder: Path) -> dict[str, str]:
    """Every text file a command wrote into ``folder`` (pages, SVG charts, JSON, Markdown, CSV), by name."""
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.iterdir())
            if p.suffix in (".html", ".svg", ".json", ".md", ".csv")}


def chart_titles(svg: str) -> str:
    """The text of an SVG chart (matplotlib keeps each drawn line of text as a comment), one line."""
    return " ".join(re.findall(r"<!-- (.*?) -->", svg, re.S))


def heading(page: str) -> str:
    """The page's ``<h1>`` text."""
    return re.search(r"<h1>(.*?)</h1>", page, re.S).group(1)


def assert_says_only(folder: Path, kind: str) -> None:
    """Every chart in ``folder`` carries ``kind``'s tag and no other kind's; nothing written calls non-real data
    real; ``summary.json``/``metrics.json`` state ``kind``, and so do ``summary.md`` and ``summary.csv``."""
    files = written_text(folder)
    charts = {name: chart_titles(text) for name, text in files.items() if name.endswith(".svg")}
    assert charts, f"no SVG chart in {folder}"
    for name, titles in charts.items():
        assert data_tag(kind) in titles, f"{name}: no {data_tag(kind)} in {titles[:200]!r}"
        assert not [t for k, t in TAGS.items() if k != kind and t in titles], f"{name} carries another kind's tag"
    for name in ("summary.json", "metrics.json"):
        if name in files:
            assert json.loads(files[name])["data"] == kind, name
    assert f"| data | {kind} |" in files["summary.md"] and f"\nsummary,,data,{kind}\n" in files["summary.csv"]
    if kind != REAL:
        for name, text in files.items():
            assert not claims_real(text), f"{name} calls {kind} data real: {claims_real(text)[:3]}"


# ---- the inputs, one of each kind (built once)


@pytest.fixture(scope="module", autouse=True)
def svg_charts():
    """Every chart of this module is written as SVG beside its PNG (restored afterwards)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(FORMAT_ENV, "svg")
        mp.delenv(DPI_ENV, raising=False)
        yield


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kinds")


@pytest.fixture(scope="module")
def sim(root) -> Path:
    assert cli.main(["simulate", "-o", str(root / "sim"), "--per-effect", "1", "--seed", "0", "--run"]) == 0
    return root / "sim"


def _engine_naming(sim: Path, path: Path, model: str) -> Path:
    lines = [json.loads(line) for line in (sim / "engine.jsonl").read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps({**r, "model": model}) + "\n" for r in lines))
    return path


def _toy_reconstruction(folder: Path) -> Path:
    """Three stories260K answers, reconstructed with its tokenizer (plain format)."""
    folder.mkdir()
    answers = ["Once upon a time there was a cat.", "Lily saw a big red bird.", "Tom was sad."]
    records = [{"id": f"t{i}", "dataset": "stories",
                "request": {"model": "stories260K", "messages": [{"role": "user", "content": "Tell a story"}]},
                "response": {"provider": "local", "model": "stories260K", "usage": {"completion_tokens": 9},
                             "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}}
               for i, text in enumerate(answers)]
    (folder / "api.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli.main(["reconstruct", str(folder / "api.jsonl"), "-o", str(folder / "reconstructed.parquet"),
                     "--tokenizer", str(stories_dir()), "--format", "plain", "--no-progress"]) == 0
    return folder / "reconstructed.parquet"


@pytest.fixture(scope="module")
def reconstructions(sim, root) -> dict[str, tuple[Path, list[str]]]:
    """Per kind: a reconstruction and the options `billing` needs for it."""
    (root / "real").mkdir()
    real = shutil.copy(sim / "reconstructed.parquet", root / "real" / "reconstructed.parquet")  # no labels beside
    toy = _toy_reconstruction(root / "toy")
    return {REAL: (Path(real), []), SIMULATED: (sim / "reconstructed.parquet", []),
            TOY: (toy, ["--tokenizer", str(stories_dir())])}


@pytest.fixture(scope="module")
def diffs(sim, reconstructions, root) -> dict[str, Path]:
    """Per kind: a `kimi-eagle diff` folder (real: no labels; toy: engine records naming tiny-kimi)."""
    real_recon = reconstructions[REAL][0]
    engines = {REAL: sim / "engine.jsonl", TOY: _engine_naming(sim, root / "engine_tiny_kimi.jsonl", "tiny-kimi")}
    for kind, engine in engines.items():
        assert cli.main(["diff", "--engine", str(engine), "--reconstructed", str(real_recon),
                         "-o", str(root / f"diff_{kind}")]) == 0
    return {REAL: root / f"diff_{REAL}", SIMULATED: sim / "diff", TOY: root / f"diff_{TOY}"}


@pytest.fixture(scope="module")
def reports(diffs, root) -> dict[str, tuple[Path, str]]:
    """Per kind: a `kimi-eagle report` folder and the command's terminal line."""
    import contextlib
    import io

    out = {}
    for kind, diff in diffs.items():
        terminal = io.StringIO()
        with contextlib.redirect_stdout(terminal):
            assert cli.main(["report", str(diff), "-o", str(root / f"report_{kind}")]) == 0
        out[kind] = (root / f"report_{kind}", terminal.getvalue())
    return out


@pytest.fixture(scope="module")
def billings(reconstructions, root) -> dict[str, tuple[Path, str]]:
    """Per kind: a `kimi-eagle billing` folder and the command's terminal lines."""
    import contextlib
    import io

    out = {}
    for kind, (recon, options) in reconstructions.items():
        terminal = io.StringIO()
        with contextlib.redirect_stdout(terminal):
            assert cli.main(["billing", str(recon), "-o", str(root / f"billing_{kind}"), *options]) == 0
        out[kind] = (root / f"billing_{kind}", terminal.getvalue())
    return out


# ---- diff, report, billing


@pytest.mark.parametrize("kind", DIFF_KINDS)
def test_a_diff_folder_states_the_kind_of_its_inputs(diffs, kind):
    meta = json.loads((diffs[kind] / "meta.json").read_text())
    assert meta["data"] == kind


@pytest.mark.parametrize("kind", DIFF_KINDS)
def test_report_says_its_diffs_kind_on_the_terminal_page_charts_and_summaries(reports, kind):
    folder, terminal = reports[kind]
    assert terminal.startswith(f"{kind} data: ")
    page = (folder / "report.html").read_text()
    assert f"<p class='data {kind}'>" in page and heading(page).endswith(f"— {kind} data")
    assert_says_only(folder, kind)
    if kind != REAL:
        assert not claims_real(terminal)


@pytest.mark.parametrize("kind", DIFF_KINDS)
def test_billing_says_its_reconstructions_kind_on_the_page_charts_summaries_and_metrics(billings, kind):
    folder, terminal = billings[kind]
    assert json.loads((folder / "metrics.json").read_text())["data"] == kind
    assert heading((folder / "report.html").read_text()).endswith(f"({kind} data)")
    assert_says_only(folder, kind)
    if kind != REAL:
        assert not claims_real(terminal)


# ---- compare: each run's kind, and a warning wherever runs of different kinds meet

PAIRS = [(REAL, SIMULATED), (SIMULATED, TOY), (TOY, REAL), (TOY, TOY)]


def compare_outputs(a: Path, b: Path, out: Path, capsys) -> dict[str, str]:
    """`kimi-eagle compare A B -o OUT`: its terminal output and the three files it writes."""
    capsys.readouterr()
    assert cli.main(["compare", str(a), str(b), "-o", str(out)]) == 0
    return {"terminal": capsys.readouterr().out, **{f"compare.{ext}": (out / f"compare.{ext}").read_text()
                                                    for ext in ("html", "md", "csv")}}


def assert_compare_says(said: dict[str, str], a: str, b: str) -> None:
    """Each run's kind in the page and the Markdown; a warning of different kinds in all four places exactly when
    ``a`` and ``b`` differ; nothing calls non-real data real."""
    warning = f"the runs hold different kinds of data (A {a}, B {b})"
    for name, text in said.items():
        assert (warning in text) == (a != b), f"{name}: {'no' if a != b else 'a'} warning of different kinds"
        if REAL not in (a, b):
            assert not claims_real(text), f"{name} calls {a}/{b} data real"
    for name in ("compare.html", "compare.md"):
        assert f"({a} data)" in said[name] and f"({b} data)" in said[name], name
    if a != b:
        warned = [line for line in said["compare.csv"].splitlines() if line.startswith("⚠ warning")]
        assert any(warning in line for line in warned), "compare.csv: the warning is not a ⚠ row"


@pytest.mark.parametrize(("a", "b"), PAIRS)
@pytest.mark.parametrize("output", ["diff", "report", "billing"])
def test_compare_says_each_runs_kind_and_warns_of_different_kinds_everywhere(diffs, reports, billings, root,
                                                                             capsys, output, a, b):
    folders = {"diff": diffs, "report": {k: v[0] for k, v in reports.items()},
               "billing": {k: v[0] for k, v in billings.items()}}[output]
    said = compare_outputs(folders[a], folders[b], root / f"compare_{output}_{a}_{b}", capsys)
    assert_compare_says(said, a, b)


# ---- batch: each run's kind from its metrics.json, on the page, the charts and compare

BATCH_KINDS = (SIMULATED, REAL, TOY, STORIES_STAND_IN)


@pytest.fixture(scope="module")
def batch(root) -> Path:
    """`kimi-eagle batch` of a two-cell notebook that writes a metrics.json of the kind it is given, one run per kind."""
    import nbformat
    import yaml

    cells = [nbformat.v4.new_code_cell('data = "real"\noutput_dir = "out"', metadata={"tags": ["parameters"]}),
             nbformat.v4.new_code_cell(
                 "import json, pathlib\nrate = {'simulated': 0.4, 'real': 0.1, 'toy': 0.2}.get(data, 0.3)\n"
                 "metrics = {'data': data, 'n_records': 10, 'mismatch_rate': rate,\n"
                 "           'mismatch_rate_ci': [rate - 0.05, rate + 0.05]}\n"
                 "pathlib.Path(output_dir).mkdir(parents=True, exist_ok=True)\n"
                 "(pathlib.Path(output_dir) / 'metrics.json').write_text(json.dumps(metrics))")]
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata=kernel), str(root / "kind.ipynb"))
    runs = [{"_name": base_kind(kind), "data": kind} for kind in BATCH_KINDS]
    (root / "kinds.yaml").write_text(yaml.safe_dump({"runs": runs}))
    assert cli.main(["batch", str(root / "kind.ipynb"), "--grid", str(root / "kinds.yaml"), "-o", str(root / "batch"),
                     "--workers", "2", "--no-progress"]) == 0
    return root / "batch"


def test_batch_labels_every_run_with_its_own_kind_on_the_page_and_every_chart(batch):
    page = (batch / "summary.html").read_text()
    for kind in BATCH_KINDS:
        assert f"1 run on <b>{kind}</b> data" in page
    charts = [chart_titles(p.read_text()) for p in sorted((batch / "charts").glob("*.svg"))]
    assert charts
    for titles in charts:
        assert f"simulated [{SIMULATED}]" in titles and f"real [{REAL}]" in titles
        assert f"stand-in [{STORIES_STAND_IN}]" in titles and f"toy {TAGS[TOY]}" in titles
        assert "simulated [real]" not in titles and "toy [real]" not in titles


def _one_run_batch(batch: Path, name: str, out: Path) -> Path:
    """A batch folder holding only the run ``name`` of ``batch``, summarised as `kimi-eagle batch` does."""
    from kimi_eagle.apps.reports.batch_summary import write_summary

    shutil.copytree(batch / name, out / name)
    shutil.copy(batch / "batch.json", out / "batch.json")
    write_summary(out, [(name, {})])
    return out


@pytest.mark.parametrize(("a", "b"), PAIRS)
def test_compare_of_batches_warns_of_different_kinds_everywhere(batch, root, capsys, a, b):
    run_a = _one_run_batch(batch, a, root / f"batch_{a}_{b}_A")
    run_b = _one_run_batch(batch, b, root / f"batch_{a}_{b}_B")
    assert_compare_says(compare_outputs(run_a, run_b, root / f"compare_batch_{a}_{b}", capsys), a, b)


def test_compare_of_a_batch_that_mixes_kinds_says_so_in_every_output(batch, root, capsys):
    said = compare_outputs(batch, batch, root / "compare_mixed", capsys)
    for name, text in said.items():
        assert "run A mixes data kinds" in text and "run B mixes data kinds" in text, name


# ---- audit (notebook 05): a local server stands in for providers; providers over the network are real


def _audit_summary(stories, base_url: str) -> dict:
    """The summary an audit of two "providers" at ``base_url`` writes, with its kind as `kimi-eagle audit` sets it."""
    from kimi_eagle.apps.audit.compare import REFERENCE, Completion, compare_all, summarize
    from kimi_eagle.data_kinds import provider_kind

    a, b = stories.encode(" Lily saw a big red bird"), stories.encode(" Lily saw a big blue bird")
    done = [Completion(p, name, rep, "ok", ids=a if (name, rep) != ("y", 1) else b)
            for p in ("p1", "p2") for name in ("x", "y") for rep in (0, 1)]
    pairs, _ = compare_all(stories, done, ["x", "y"], {p: Completion(p, REFERENCE, 0, "ok", ids=a) for p in ("p1", "p2")})
    summary = summarize(pairs, ["x", "y"], has_reference=True)
    settings = {"model": "stories260K", "max_tokens": 12, "base_url": base_url}
    return {**summary, "prompts": 2, "bad_prompts": 0, "repeats": 2, "requests": 8, "completions": {"ok": 8},
            "aborted": None, "settings": settings, "data": provider_kind(base_url, "stories260K")}


@pytest.mark.parametrize(("base_url", "kind"), [("http://127.0.0.1:8000/v1", STORIES_STAND_IN),
                                                ("https://openrouter.ai/api/v1", REAL)], ids=["stand-in", "real"])
def test_the_audit_says_whose_answers_it_compared_on_its_page_charts_and_summaries(stories, root, base_url, kind):
    from kimi_eagle.apps.audit.report import write_audit_report
    from kimi_eagle.apps.reports.outputs import write_summary_tables
    from kimi_eagle.io import write_json

    folder = root / f"audit_{base_kind(kind)}"
    summary = _audit_summary(stories, base_url)
    write_json(folder / "summary.json", summary)
    write_summary_tables(summary, folder / "summary.json")  # as the audit command writes them
    write_audit_report(summary, folder)
    assert heading((folder / "report.html").read_text()).endswith(f"— {kind}")
    assert_says_only(folder, kind)


# ---- train (notebooks 03, 04): the kind of the target's generations


@pytest.fixture(scope="module")
def hidden_dir(stories, root) -> Path:
    """Two sampled rows of stories260K, extracted (what `kimi-eagle train` reads)."""
    import torch

    from kimi_eagle.eagle3.extract import extract
    from kimi_eagle.eagle3.hidden import Row, load_target
    from kimi_eagle.eagle3.speculative import generate_target_only

    target, g, rows = load_target(stories_dir()), torch.Generator().manual_seed(3), []
    for i, text in enumerate(["Once upon a time", "The cat sat"]):
        prompt = [1] + stories.encode(text)
        completion = generate_target_only(target, prompt, 12, 1.0, 2, g)
        rows.append(Row(f"r{i}", prompt + completion, [0] * len(prompt) + [1] * len(completion)))
    extract(stories_dir(), rows, root / "hidden", dtype="bf16", shard_rows=2, model=target)
    return root / "hidden"


def test_train_on_a_toy_target_tags_its_curves_and_metrics_toy(hidden_dir, root):
    """#46: `kimi-eagle train --target stories260K` titled train_curves.png "[REAL data] drafter training"."""
    out = root / "train"
    assert cli.main(["train", str(hidden_dir), "--target", str(stories_dir()), "-o", str(out), "--steps", "2",
                     "--ttt-steps", "2", "--batch-size", "2", "--draft-vocab-size", "64", "--log-every", "1",
                     "--no-progress"]) == 0
    assert json.loads((out / "train_metrics.json").read_text())["data"] == TOY
    titles = chart_titles((out / "train_curves.svg").read_text())
    assert f"{TAGS[TOY]} drafter training" in titles and not claims_real(titles)


def _code(name: str) -> str:
    import nbformat

    nb = nbformat.read(str(REPO_ROOT / "notebooks" / name), as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def test_notebooks_03_and_04_take_the_kind_of_their_target():
    from kimi_eagle.data_kinds import model_kind

    assert model_kind(str(stories_dir())) == TOY and model_kind("runs/cache/tiny_kimi/3fa2c1") == TOY
    assert "data_kind = model_kind(target_dir)" in _code("03_eagle3_training.ipynb")
    assert '"data": data_kind' in _code("03_eagle3_training.ipynb") and '"data": "real"' not in _code("03_eagle3_training.ipynb")
    assert '"data": model_kind(target_dir)' in _code("04_drafter_ablation.ipynb")


# ---- notebook 02: the kind of a diff run's inputs, an override only towards caution


def test_notebook_02_reads_the_kind_of_its_inputs_and_refuses_to_call_them_real(sim, root):
    """#46: notebook 02 took `data_kind` as given ("real" on a simulated benchmark stayed "real") and called tiny-kimi's
    engine records "real" (only the tokenizer was read); both now come from `inputs_data_kind`."""
    from kimi_eagle.assets import kimi_dir
    from kimi_eagle.diff.inputs import DiffInputs, inputs_data_kind

    tiny = _engine_naming(sim, root / "engine_tiny_kimi_nb02.jsonl", "tiny-kimi")
    inputs = {SIMULATED: DiffInputs(sim / "api.jsonl", sim / "engine.jsonl", sim / "labels.parquet", "simulated"),
              REAL: DiffInputs(sim / "api.jsonl", sim / "engine.jsonl", None, "real"),
              "toy (engine)": DiffInputs(sim / "api.jsonl", tiny, None, "real"),
              "toy (billing only)": DiffInputs(sim / "api.jsonl", None, None, "real")}
    tokenizers = {"toy (billing only)": stories_dir()}
    for name, given in inputs.items():
        kind, note = inputs_data_kind(given, tokenizers.get(name, kimi_dir()))
        assert (kind, note) == (name.split(" ")[0], None), name
        if kind != REAL:
            with pytest.raises(ValueError, match=f"data_kind real: the inputs are {kind} data"):
                inputs_data_kind(given, tokenizers.get(name, kimi_dir()), "real")
    kind, note = inputs_data_kind(inputs[REAL], kimi_dir(), TOY)  # more cautious: kept, and said
    assert kind == TOY and note.startswith("data_kind toy overrides the inputs' real")
    code = _code("02_bpe_diff_inspection.ipynb")
    assert "data, note = inputs_data_kind(inputs, tok_dir, data_kind)" in code and "data = data_kind or" not in code


def test_notebook_02_on_a_simulated_benchmark_says_simulated_in_every_output(root):
    """The one notebook run of this module (papermill, one record per effect of one source)."""
    import papermill

    out = root / "nb02"
    papermill.execute_notebook(str(REPO_ROOT / "notebooks" / "02_bpe_diff_inspection.ipynb"), str(root / "nb02.ipynb"),
                               parameters={"simulate": True, "sample_size": 1, "sources": ["glaive"],
                                           "output_dir": str(out)}, progress_bar=False, log_output=False)
    assert json.loads((out / "metrics.json").read_text())["data"] == SIMULATED
    assert json.loads((out / "diff" / "meta.json").read_text())["data"] == SIMULATED
    for folder in (out / "report", out / "billing"):
        assert_says_only(folder, SIMULATED)


# ---- collect (notebook 00): a server on this machine stands in for a provider


@pytest.fixture(scope="module")
def collected(root) -> tuple[Path, dict, str]:
    """`kimi-eagle collect` of two prompts from a server on this machine: the responses, summary and its address."""
    from upstream_sse import Upstream

    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": "hello"}) + "\n" for i in range(2)))
    with Upstream() as srv:
        assert cli.main(["collect", str(prompts), "-o", str(root / "collected.jsonl"), "--base-url", srv.base_url,
                         "--model", "m", "--no-progress", "--max-attempts", "1"]) == 0
        base_url = srv.base_url
    summary = json.loads((root / "collected.jsonl.summary.json").read_text())
    return root / "collected.jsonl", summary, base_url


def test_collect_from_a_local_server_never_says_real_and_notebook_00_calls_it_a_stand_in(collected, root):
    """#46: notebook 00 called a collection from a server on this machine "real" unless it had started the server
    itself (`base_url` given): its metrics.json now takes the kind from the address."""
    from kimi_eagle.io import read_jsonl
    from kimi_eagle.records import collect_metrics, response_rows

    responses, summary, base_url = collected
    for ext in ("summary.json", "summary.md", "summary.csv"):  # collect's summary states no kind: none is wrong
        assert not claims_real(responses.with_name(f"{responses.name}.{ext}").read_text()), ext
    rows = response_rows(line.obj for line in read_jsonl(responses))
    assert collect_metrics(summary, rows, local_server=False, model="m", base_url=base_url)["data"] == \
        "stand-in: m served locally"
    assert collect_metrics(summary, rows, local_server=True)["data"] == STORIES_STAND_IN
    assert collect_metrics(summary, rows, False, "moonshotai/kimi-k2.5", "https://openrouter.ai/api/v1")["data"] == REAL
    assert "base_url=config.base_url" in _code("00_collect.ipynb")


def test_providers_on_a_simulated_log_never_calls_it_real(sim, root, capsys):
    """`providers` states no kind (a calibration table of the log it is given): neither its terminal nor its table
    calls the simulated benchmark real."""
    table = root / "providers.toml"
    capsys.readouterr()
    assert cli.main(["providers", str(sim / "api.jsonl"), "-o", str(table)]) == 0
    said = capsys.readouterr()
    assert not claims_real(said.out + said.err) and not claims_real(table.read_text())


def test_notebook_01_states_the_kind_of_its_tokenizer(kimi, stories):
    from kimi_eagle.tokenize.probe import probe, probe_metrics

    assert probe_metrics(probe(kimi), sample_tokens=1)["data"] == REAL
    assert probe_metrics(probe(stories), sample_tokens=1)["data"] == TOY


# ---- tiny-kimi from the demo's cache, the source of a reconstruction, a kind nobody recorded


@pytest.fixture(scope="module")
def tiny_kimi_run(root) -> Path:
    """tiny-kimi as `kimi-eagle demo` serves it: from its cache folder (named by 16 hex digits), served and collected
    (two glaive prompts, a few tokens each), then reconstructed with Kimi's tokenizer (the demo's folder layout)."""
    from kimi_eagle.apps.tiny_kimi import TinyKimiSpec, cached_tiny_kimi, collect_tiny_kimi

    spec = TinyKimiSpec(steps=2, seed=0, sharegpt_conversations=2, hidden_size=32, intermediate_size=64, num_layers=1,
                        num_heads=2, seq_len=64, batch_size=2, max_positions=1024)  # seconds, as tests/test_tiny_kimi.py
    model_dir, _, _ = cached_tiny_kimi(root / "cache" / "tiny_kimi", spec)
    assert re.fullmatch(r"[0-9a-f]{16}", model_dir.name)
    folder = root / "tiny_kimi"
    collect_tiny_kimi(model_dir, folder, 2, max_tokens=8)
    cli.main(["reconstruct", str(folder / "responses.jsonl"), "-o", str(folder / "reconstructed.parquet"),
              "--no-progress"])  # tiny-kimi's malformed answers may leave error rows: the kind is the point here
    return folder


def test_tiny_kimi_served_from_the_cache_names_itself_so_diff_and_report_say_toy(tiny_kimi_run, root, capsys):
    """#46: served under its cache folder's name, tiny-kimi's engine records named no toy model, and `diff` on the
    demo's runs/demo/tiny_kimi/engine.jsonl said "real" (the demo grid passed data_kind: toy to avoid it)."""
    from kimi_eagle.data_kinds import model_kind
    from kimi_eagle.diff.inputs import engine_model

    model = engine_model(tiny_kimi_run / "engine.jsonl")
    assert model.startswith("tiny-kimi-") and model_kind(model) == TOY
    cli.main(["diff", "--engine", str(tiny_kimi_run / "engine.jsonl"), "--reconstructed",
              str(tiny_kimi_run / "reconstructed.parquet"), "-o", str(root / "diff_tiny_kimi")])
    assert json.loads((root / "diff_tiny_kimi" / "meta.json").read_text())["data"] == TOY
    capsys.readouterr()
    assert cli.main(["report", str(root / "diff_tiny_kimi"), "-o", str(root / "report_tiny_kimi")]) == 0
    assert capsys.readouterr().out.startswith("toy data: ")
    assert_says_only(root / "report_tiny_kimi", TOY)


def test_billing_reads_the_kind_of_the_answers_a_reconstruction_was_made_from(tiny_kimi_run, collected, root, capsys):
    """#46: a reconstruction recorded neither the model nor the address of its answers, so `billing` on tiny-kimi's
    collected answers (Kimi's tokenizer) said "real". Its source now travels in the parquet: tiny-kimi's answers are
    toy, a server on this machine's a stand-in, and `--data real` on either is refused; notebook 02 reads the same
    source of its API records."""
    from kimi_eagle.assets import kimi_dir
    from kimi_eagle.diff.inputs import DiffInputs, inputs_data_kind
    from kimi_eagle.reconstruct.source import reconstruction_source

    recon = {TOY: tiny_kimi_run / "reconstructed.parquet", "stand-in: m served locally": root / "collected.parquet"}
    assert cli.main(["reconstruct", str(collected[0]), "-o", str(recon["stand-in: m served locally"]),
                     "--no-progress"]) == 0
    for kind, path in recon.items():
        assert reconstruction_source(path)["data"] == kind
        out = root / f"billing_source_{base_kind(kind)}"
        capsys.readouterr()
        cli.main(["billing", str(path), "-o", str(out)])
        assert json.loads((out / "metrics.json").read_text())["data"] == kind
        assert_says_only(out, kind)
        assert not claims_real(capsys.readouterr().out)
        assert cli.main(["billing", str(path), "-o", str(out / "again"), "--data", "real"]) == 2
        assert f"--data real: the inputs are {kind} data" in capsys.readouterr().err
    inputs = DiffInputs(tiny_kimi_run / "responses.jsonl", None, None, "real")  # notebook 02, billing-only
    assert inputs_data_kind(inputs, kimi_dir()) == (TOY, None)


@pytest.mark.parametrize("metrics", [{"drafter": "eagle3", "step": 2}, None], ids=["before the data field", "none"])
def test_a_training_folder_that_records_no_kind_is_charted_as_not_recorded_never_real(root, metrics):
    """#46: a train folder whose train_metrics.json predates its "data" field (or has none) was charted "[REAL data]"."""
    from kimi_eagle.apps.reports.training_charts import write_train_curves
    from kimi_eagle.data_kinds import NOT_RECORDED

    folder = root / f"old_train_{metrics is None}"
    folder.mkdir()
    log = [{"step": s, "loss": 3.0 - s / 10, "step_loss": [3.0 - s / 10], "acc": [0.1 * s]} for s in (1, 2)]
    (folder / "train_log.jsonl").write_text("".join(json.dumps(entry) + "\n" for entry in log))
    if metrics is not None:
        (folder / "train_metrics.json").write_text(json.dumps(metrics))
    write_train_curves(folder)
    titles = chart_titles((folder / "train_curves.svg").read_text())
    assert f"{NOT_RECORDED} drafter training" in titles and not claims_real(titles)
