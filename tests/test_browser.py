"""Real-browser tests: notebook 02 run in JupyterLab, driven in headless Debian chromium by Playwright.

Part of ``make test`` whenever ``/usr/bin/chromium`` exists (``.ci/run`` installs it with apt-get; skipped
otherwise); ``make test-browser`` runs them alone. Playwright's own browser download is never used. One
JupyterLab server and one page serve every test here (module fixtures); every wait has a timeout; the server
and its kernels are killed by process group. Screenshots and the server log are kept in
``test-artifacts/browser/``.

The copy of the notebook gets two extra cells: small parameters, and after the diff inspector a second
inspector over one synthetic record whose hunks lie far apart (``far_hunks_inspector`` of
tests/test_widgets.py), so that stepping through hunks has somewhere to scroll to.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from kimi_eagle.assets import REPO_ROOT
from kimi_eagle.diff.classify import SUBCLASSES

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO_ROOT / "test-artifacts" / "browser"
NOTEBOOK = REPO_ROOT / "notebooks" / "02_bpe_diff_inspection.ipynb"
FAR_CELL = """import sys
sys.path.insert(0, {tests!r})
from test_widgets import far_hunks_inspector

inspector.widget.add_class("ke-nb")  # hooks that tell the notebook's inspector from this one
far = far_hunks_inspector(tok)
far.widget.add_class("ke-far")
far.widget"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5, fatal=()):
    """Poll ``predicate`` until it is truthy; errors of type ``fatal`` end the wait at once."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except fatal:
            raise
        except Exception as e:  # the server may not be up yet
            last = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last})")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 serving a copy of notebook 02 with small parameters."""
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install -y chromium)")
    root = tmp_path_factory.mktemp("lab")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    k = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(k + 1, nbformat.v4.new_code_cell(
        f"sample_size = 1\nseed = 0\noutput_dir = {str(root / 'out')!r}"))
    k = next(i for i, c in enumerate(nb.cells) if "DiffInspector.from_files" in c.source)
    nb.cells.insert(k + 1, nbformat.v4.new_code_cell(FAR_CELL.format(tests=str(REPO_ROOT / "tests"))))
    nb.nbformat_minor = max(nb.nbformat_minor, 5)  # cell ids: every cell gets one
    for k, c in enumerate(nb.cells):
        c.setdefault("id", f"cell-{k}")
    nbformat.write(nb, root / "inspect.ipynb")
    # every cell rendered, however long the outputs above it (JupyterLab's windowing detaches off-screen cells, whose
    # text then reads empty)
    settings = root / "config" / "lab" / "user-settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    token, port = secrets.token_hex(16), free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(root / "runtime"), "JUPYTER_CONFIG_DIR": str(root / "config"),
           "JUPYTERLAB_WORKSPACES_DIR": str(root / "workspaces"), "KIMI_EAGLE_ASSETS": os.environ.get(
               "KIMI_EAGLE_ASSETS", str(REPO_ROOT.parent / "shared" / "assets"))}
    log = open(root / "jupyter.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
         "--allow-root",
         "--LabApp.expose_app_in_browser=True",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        def up():
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {proc.returncode}: "
                                   f"{(root / 'jupyter.log').read_text()[-2000:]}")
            try:
                return get_json(f"{base}/api/status?token={token}")
            except OSError:
                return None

        wait_for(up, 90, "the Jupyter server", fatal=RuntimeError)
        yield {"base": base, "token": token, "root": root, "proc": proc}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started (its own session)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def kernel_idle(lab) -> bool:
    sessions = get_json(f"{lab['base']}/api/sessions?token={lab['token']}")
    return any(s["kernel"]["execution_state"] == "idle" for s in sessions)


@pytest.fixture(scope="module")
def page(lab, tmp_path_factory):
    """Chromium on the notebook with every cell run: the two inspectors and the playground are displayed."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1500, "height": 1100})
        context.set_default_timeout(30_000)
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.goto(f"{lab['base']}/lab/tree/inspect.ipynb?token={lab['token']}", timeout=60_000)
            page.wait_for_selector(".jp-Notebook", timeout=90_000)
            page.wait_for_function("() => window.jupyterapp !== undefined", timeout=90_000)
            wait_for(lambda: kernel_idle(lab), 90, "the notebook's kernel to be ready")
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            for scope in (".ke-nb", ".ke-far"):
                page.locator(f"{scope} .ke-inspector-position").wait_for(state="attached", timeout=240_000)
                page.wait_for_function(
                    f"() => {{ const e = document.querySelector('{scope} .ke-inspector-position');"
                    " return e && /hunk|no hunks/.test(e.textContent); }", timeout=60_000)
            page.locator(".ke-completion-view .ke-message").wait_for(state="attached", timeout=120_000)
            news = page.get_by_role("button", name="No", exact=True)  # JupyterLab's "notify about news?" toast
            if news.count():
                news.first.click(timeout=5_000)
            yield page
        finally:
            context.close()
            shutil.copy(lab["root"] / "jupyter.log", ARTIFACTS / "jupyter.log")


def choose(page, selector: str, name: str, timeout: float = 90.0) -> None:
    """Pick the option of dropdown ``selector`` whose label starts with ``name`` (labels carry counts).

    The kernel rewrites a dropdown's options after another filter changes (counts, the subclasses present), so a
    pick by index can land on a list that is about to change: wait until the options hold still for a second, pick,
    and pick again until the kernel's list shows ``name`` selected."""
    def first_word(text: str) -> str:
        return text.replace("\xa0", " ").split(" ")[0]

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        labels = page.locator(f"{selector} select option").all_inner_texts()
        time.sleep(1.0)
        if labels != page.locator(f"{selector} select option").all_inner_texts():
            continue  # the kernel is still rewriting the options
        index = next(i for i, t in enumerate(labels) if first_word(t) == name)
        page.locator(f"{selector} select").select_option(index=index, timeout=10_000)
        time.sleep(1.0)
        chosen = page.locator(f"{selector} select option:checked").all_inner_texts()
        if chosen and first_word(chosen[0]) == name:
            return
    raise AssertionError(f"{selector}: could not select {name!r} within {timeout:.0f}s")


def options(page, selector: str) -> list[str]:
    return [t.replace("\xa0", " ") for t in page.locator(f"{selector} select option").all_inner_texts()]


def wait_position(page, scope: str, pattern: str) -> str:
    """Wait until the inspector's position reads ``pattern`` (a regex), meaning the kernel has rendered."""
    page.wait_for_function(
        "([s, p]) => { const e = document.querySelector(s + ' .ke-inspector-position');"
        " return e && new RegExp(p).test(e.textContent); }", arg=[scope, pattern], timeout=90_000)
    return page.locator(f"{scope} .ke-inspector-position").inner_text(timeout=10_000)


def in_viewport(locator) -> dict:
    """Where the element lies, and whether it is on screen: inside the window and topmost at its centre
    (JupyterLab scrolls the notebook in a panel of its own, which could hide it while it is in the window)."""
    return locator.evaluate(
        "e => { const r = e.getBoundingClientRect(); const x = r.left + r.width / 2, y = r.top + Math.min(r.height / 2, 10);"
        " const hit = document.elementFromPoint(x, y);"
        " return {top: r.top, bottom: r.bottom, height: innerHeight,"
        " visible: r.top >= 0 && r.bottom <= innerHeight && r.left >= 0 && r.right <= innerWidth"
        " && !!hit && e.contains(hit)}; }", timeout=10_000)


def style(locator, *props: str) -> list[str]:
    return locator.evaluate("(e, ps) => { const s = getComputedStyle(e); return ps.map(p => s[p]); }",
                            list(props), timeout=10_000)


def test_inspector_notebook_runs_filters_and_navigates_in_chromium(page, lab, kimi):
    position = page.locator(".ke-nb .ke-inspector-position")
    choose(page, ".ke-nb .ke-inspector-verdict", "semantic")
    choose(page, ".ke-nb .ke-inspector-subclass", "tool_args_json_equal")
    page.wait_for_function(  # the kernel has applied the filters: the selected record and its first hunk
        "() => { const s = document.querySelector('.ke-nb .ke-inspector-record select');"
        " const o = s && s.options[s.selectedIndex];"
        " return o && o.textContent.includes('[tool_args_json_equal]')"
        " && /hunk 1\\/\\d+/.test(document.querySelector('.ke-nb .ke-inspector-position').textContent); }",
        timeout=90_000)
    record = page.locator(".ke-nb .ke-inspector-record select option:checked").inner_text(timeout=10_000)
    assert "#args_reserialised" in record and "[tool_args_json_equal]" in record
    n = int(re.search(r"hunk 1/(\d+)", position.inner_text(timeout=10_000)).group(1))
    expected = 1 % n + 1
    page.locator(".ke-nb .ke-inspector-next button, .ke-nb button.ke-inspector-next").first.click(timeout=10_000)
    wait_position(page, ".ke-nb", f"hunk {expected}/{n}")
    current = page.locator(".ke-nb .ke-inspector-view .ke-cur")
    assert current.count() == 1
    assert current.get_attribute("data-hunk", timeout=10_000) == str(expected - 1)
    assert "label <b>tool_args_json_equal</b>" in page.locator(".ke-nb .ke-inspector-view").inner_html(timeout=10_000)
    # hovering a chip tells its ID, its text (whitespace made visible) and its bytes
    chip = current.locator(".ke-chip").first
    token_id = int(chip.get_attribute("data-id", timeout=10_000))
    lines = chip.get_attribute("title", timeout=10_000).split("\n")
    assert len(lines) == 3 and f"id {token_id}" in lines[0] and lines[1].startswith("text “")
    assert lines[2] == f"bytes {kimi.token_bytes(token_id).hex(' ')}"

    # the playground: its checkbox label is shown whole
    label = page.locator(".ke-playground-allow-special")
    if label.count():
        clipped = label.evaluate("e => [...e.querySelectorAll('label, span')].some("
                                 "x => x.textContent.trim() && x.scrollWidth > x.clientWidth + 1)", timeout=10_000)
        assert not clipped, "the playground's checkbox label is cut off"
        assert "special-token spellings become specials" in label.inner_text(timeout=10_000)

    current.scroll_into_view_if_needed(timeout=10_000)
    shot = ARTIFACTS / "inspector.png"
    page.screenshot(path=str(shot), full_page=False, timeout=90_000)
    assert shot.stat().st_size > 10_000
    assert (lab["root"] / "out" / "metrics.json").is_file()


def test_verdict_then_subclass_lists_only_records_matching_both(page, lab):
    import pandas as pd

    r = pd.read_parquet(lab["root"] / "out" / "diff" / "records.parquet")
    r = r[r["status"] == "ok"]
    scope = ".ke-nb"
    choose(page, f"{scope} .ke-inspector-subclass", "all")
    choose(page, f"{scope} .ke-inspector-verdict", "semantic")
    semantic = r[r["verdict"] == "semantic"]
    counts = pd.Series([c for s in semantic["subclasses"] for c in s]).value_counts()
    want = [f"all ({len(semantic)})"] + [f"{c} ({counts[c]})" for c in SUBCLASSES if c in counts]
    page.wait_for_function("([s, n]) => document.querySelectorAll(s + ' select option').length === n",
                           arg=[f"{scope} .ke-inspector-subclass", len(want)], timeout=90_000)
    assert options(page, f"{scope} .ke-inspector-subclass") == want  # only what semantic records have, counted
    sub = counts.index[0]
    choose(page, f"{scope} .ke-inspector-subclass", sub)
    both = semantic[semantic["subclasses"].map(lambda s: sub in list(s))]["id"].tolist()
    page.wait_for_function(
        "([s, n, sub]) => { const o = [...document.querySelectorAll(s + ' .ke-inspector-record select option')];"
        " return o.length === n && o.every(x => x.textContent.includes('[' + sub + ']')); }",
        arg=[scope, len(both), sub], timeout=90_000)
    listed = [t.split("\xa0")[0] for t in page.locator(f"{scope} .ke-inspector-record select option").all_inner_texts()]
    assert listed == both
    head = page.locator(f"{scope} .ke-inspector-view p").first.inner_text(timeout=10_000)
    assert f"{listed[0]} — verdict semantic" in head
    # the subclass stays chosen when a verdict without it is picked: nothing matches, and the page says so
    choose(page, f"{scope} .ke-inspector-verdict", "bpe_split")
    page.wait_for_function(
        "s => document.querySelector(s + ' .ke-inspector-view').textContent.includes('no record matches')",
        arg=scope, timeout=90_000)
    assert page.locator(f"{scope} .ke-inspector-record select option").count() == 0
    assert f"{sub} (0)" in options(page, f"{scope} .ke-inspector-subclass")
    page.locator(f"{scope} .ke-inspector-verdict").scroll_into_view_if_needed(timeout=10_000)
    page.screenshot(path=str(ARTIFACTS / "inspector_filters.png"), timeout=90_000)
    choose(page, f"{scope} .ke-inspector-subclass", "all")
    split = r[r["verdict"] == "bpe_split"]["id"].tolist()
    page.wait_for_function(
        "([s, n]) => document.querySelectorAll(s + ' .ke-inspector-record select option').length === n"
        " && /hunk/.test(document.querySelector(s + ' .ke-inspector-position').textContent)",
        arg=[scope, len(split)], timeout=90_000)
    assert options(page, f"{scope} .ke-inspector-subclass") == [f"all ({len(split)})"]  # splits have none


def legend_matches_current(page, scope: str) -> str:
    """Assert the current hunk's outline is the legend's "current hunk" swatch colour, and its border the
    swatch of its kind; return the colour."""
    current = page.locator(f"{scope} .ke-inspector-view .ke-cur")
    assert current.count() == 1
    kind = "split" if "ke-split" in current.get_attribute("class", timeout=10_000) else "semantic"
    colour, outline, width, border = style(current, "outlineColor", "outlineStyle", "outlineWidth", "borderTopColor")
    swatch = page.locator(f"{scope} .ke-inspector-view [data-legend=current] .ke-swatch")
    assert style(swatch, "outlineColor", "outlineStyle") == [colour, outline] and outline == "solid"
    assert float(width.removesuffix("px")) >= 3
    kind_swatch = page.locator(f"{scope} .ke-inspector-view [data-legend={kind}] .ke-swatch")
    assert style(kind_swatch, "borderTopColor") == [border]
    assert colour != border  # the current mark is not the kind's colour
    text = page.locator(f"{scope} .ke-inspector-view [data-legend=current]").inner_text(timeout=10_000)
    assert "current hunk" in text
    return colour


def test_legend_colours_are_the_colours_drawn(page):
    # the notebook's split record (where the current hunk used to be drawn blue, against a legend saying orange)
    choose(page, ".ke-nb .ke-inspector-subclass", "all")
    choose(page, ".ke-nb .ke-inspector-verdict", "bpe_split")
    wait_position(page, ".ke-nb", r"hunk 1/\d+: split")
    colours = {legend_matches_current(page, ".ke-nb")}
    # the far-apart record: its first hunk is a split, its second changes bytes
    far = ".ke-far"
    wait_position(page, far, r"hunk \d+/10")
    while "hunk 1/10" not in page.locator(f"{far} .ke-inspector-position").inner_text(timeout=10_000):
        page.locator(f"{far} .ke-inspector-prev button, {far} button.ke-inspector-prev").first.click(timeout=10_000)
        wait_position(page, far, r"hunk \d+/10")
    colours.add(legend_matches_current(page, far))
    page.locator(f"{far} button.ke-inspector-next, {far} .ke-inspector-next button").first.click(timeout=10_000)
    wait_position(page, far, "hunk 2/10: other")
    colours.add(legend_matches_current(page, far))
    assert len(colours) == 1  # one colour marks the current hunk, whatever its kind


def test_next_hunk_brings_the_current_hunk_into_the_viewport(page):
    far = ".ke-far"
    nxt = page.locator(f"{far} button.ke-inspector-next, {far} .ke-inspector-next button").first
    page.locator(f"{far} .ke-inspector-dataset").evaluate("e => e.scrollIntoView({block: 'start'})", timeout=10_000)
    text = page.locator(f"{far} .ke-inspector-position").inner_text(timeout=10_000)
    k = int(re.search(r"hunk (\d+)/10", text).group(1))
    page.screenshot(path=str(ARTIFACTS / "inspector_next_hunk_before.png"), timeout=90_000)
    seen = []
    for _ in range(7):
        nxt.click(timeout=10_000)
        k = k % 10 + 1
        wait_position(page, far, f"hunk {k}/10")
        current = page.locator(f"{far} .ke-inspector-view .ke-cur")
        assert current.get_attribute("data-hunk", timeout=10_000) == str(k - 1)
        where = in_viewport(current)
        seen.append((k, where))
        assert where["visible"], f"hunk {k} is off screen after 'next hunk': {where}"
        assert nxt.is_visible()  # the button stays where it was: the view, not the page, moved
    page.screenshot(path=str(ARTIFACTS / "inspector_next_hunk.png"), timeout=90_000)
    assert len({k for k, _ in seen}) == 7


def test_completion_playground_parses_what_is_typed(page, kimi):
    from kimi_eagle.chat.parse import ParseOptions
    from kimi_eagle.serving.answer import parse_completion

    tok = kimi
    box = page.locator(".ke-completion-ids textarea")
    view = page.locator(".ke-completion-view")
    box.evaluate("e => e.scrollIntoView({block: 'start'})", timeout=10_000)
    page.screenshot(path=str(ARTIFACTS / "completion_playground_before.png"), timeout=90_000)
    first = json.loads(view.locator(".ke-message").inner_text(timeout=10_000))
    ids = tok.encode("Checking the sky.</think>Rain in Oslo tonight.<|im_end|>", allow_special=True)
    expect = parse_completion(ids, tok, ParseOptions(format_name="kimi-k2.5"))
    assert expect.message()["content"] != first.get("content")

    def shown(expected: dict) -> dict:
        """Wait until the parsed message on the page holds ``expected``'s fields (the kernel has caught up
        with the last edit; states in between are not checked), then return it."""
        page.wait_for_function(
            "want => { const m = document.querySelector('.ke-completion-view .ke-message');"
            " if (!m) return false; const got = JSON.parse(m.textContent);"
            " return Object.keys(want).every(k => JSON.stringify(got[k]) === JSON.stringify(want[k])); }",
            arg=expected, timeout=90_000)
        return json.loads(view.locator(".ke-message").inner_text(timeout=10_000))

    box.fill(", ".join(map(str, ids)), timeout=10_000)  # pasted
    got = shown({"content": "Rain in Oslo tonight."})
    assert got["finish_reason"] == expect.finish_reason == "stop"
    assert got["content"] == expect.message()["content"] == "Rain in Oslo tonight."
    assert got["reasoning"] == "Checking the sky."
    assert f"{len(ids)} tokens" in view.inner_text(timeout=10_000)
    # typed: the same IDs without <|im_end|> (select all, then key by key): cut by the length limit
    box.click(timeout=10_000)
    box.press("Control+a", timeout=10_000)
    box.press_sequentially(str(ids[:-1]), delay=5, timeout=60_000)
    cut = parse_completion(ids[:-1], tok, ParseOptions(format_name="kimi-k2.5"))
    got = shown({"finish_reason": "length"} | cut.message())
    assert got["finish_reason"] == cut.finish_reason == "length" and got["content"] == "Rain in Oslo tonight."
    assert box.input_value(timeout=10_000) == str(ids[:-1])
    page.wait_for_function("n => document.querySelector('.ke-completion-view').textContent.includes(n + ' tokens')",
                           arg=len(ids) - 1, timeout=90_000)
    if page.locator(".ke-completion-mode").count():  # the playground reads raw text too
        box.fill("Hm.</think>Snow in Bergen.<|im_end|>", timeout=10_000)
        got = shown({"content": "Snow in Bergen."})
        assert got["reasoning"] == "Hm." and got["finish_reason"] == "stop"
        box.fill(", ".join(map(str, ids)), timeout=10_000)
        shown({"content": "Rain in Oslo tonight.", "finish_reason": "stop"})
    box.evaluate("e => e.scrollIntoView({block: 'start'})", timeout=10_000)
    page.screenshot(path=str(ARTIFACTS / "completion_playground.png"), timeout=90_000)


def test_compare_page_shows_every_figure_and_fits_the_window_in_chromium(page, tmp_path):
    """#35: `kimi-eagle compare` of two billing outputs of the benchmark, opened in chromium: the table holds a row
    per figure of compare.csv, says the sign, and does not run off the page at 1280 px."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install -y chromium)")
    import csv

    from kimi_eagle.apps import cli

    for name, per_effect, seed in (("a", 2, 0), ("b", 3, 1)):
        assert cli.main(["simulate", "-o", str(tmp_path / name), "--per-effect", str(per_effect), "--seed", str(seed),
                         "--run"]) == 0
        assert cli.main(["billing", str(tmp_path / name / "reconstructed.parquet"), "-o", str(tmp_path / name / "billing")]) == 0
    assert cli.main(["compare", str(tmp_path / "a" / "billing"), str(tmp_path / "b" / "billing"), "-o", str(tmp_path / "cmp")]) == 0
    with open(tmp_path / "cmp" / "compare.csv", newline="") as f:
        figures = [r["figure"] for r in csv.DictReader(f)]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab = page.context.new_page()  # the module's chromium (one sync Playwright per thread)
    try:
        tab.set_viewport_size({"width": 1280, "height": 900})
        tab.goto((tmp_path / "cmp" / "compare.html").as_uri(), timeout=30_000)
        rows = tab.locator("table.t tbody tr")
        assert rows.count() == len(figures)
        assert [rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())] == figures
        assert "change = B − A" in tab.locator("p.sign").first.inner_text()
        assert tab.evaluate("() => document.documentElement.scrollWidth") <= 1280
        tab.screenshot(path=str(ARTIFACTS / "compare_page.png"), full_page=True)
    finally:
        tab.close()


def test_notebook_04_charts_are_drawn_in_chromium(page, tmp_path):
    """#35 finding 1: notebook 04's chart cells printed `<Figure size 1100x380 with 2 Axes>`. The notebook executed as
    the demo runs it and rendered to HTML beside it, opened in chromium: every chart cell's image decodes and is
    drawn with a size, and no cell shows a Figure's text instead."""
    from kimi_eagle.apps.batch.notebooks import notebook_runs
    from kimi_eagle.apps.commands.demo import _execute_notebook

    notebook, params = next((n, p) for n, p in notebook_runs("test") if n.name == "04_drafter_ablation.ipynb")
    status, detail, _ = _execute_notebook(notebook, tmp_path, params)
    assert status == "ok", detail
    executed = json.loads(Path(detail).read_text())
    charts = sum("".join(c["source"]).count("display(Image(") for c in executed["cells"] if c["cell_type"] == "code")
    assert charts >= 2
    tab = page.context.new_page()
    try:
        tab.set_viewport_size({"width": 1280, "height": 900})
        tab.goto(Path(detail).with_suffix(".html").as_uri(), timeout=30_000)
        sizes = tab.evaluate("() => [...document.querySelectorAll('img')].map(i => [i.complete, i.naturalWidth, "
                             "i.getBoundingClientRect().width])")
        drawn = [s for s in sizes if s[0] and s[1] > 0 and s[2] > 0]
        assert len(drawn) == len(sizes) >= charts, sizes
        assert "<Figure size" not in tab.locator("body").inner_text()
        tab.screenshot(path=str(ARTIFACTS / "notebook_04.png"), full_page=True)
    finally:
        tab.close()
