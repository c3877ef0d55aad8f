"""One real-browser test: notebook 02 run in JupyterLab, driven in headless Debian chromium by Playwright.

Part of ``make test`` whenever ``/usr/bin/chromium`` exists (``.ci/run`` installs it with apt-get; skipped
otherwise); ``make test-browser`` runs it alone. Playwright's own browser download is never used. Every wait
has a timeout; the server and its kernels are killed by process group. The screenshot and the server log are
kept in ``test-artifacts/browser/``.
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

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO_ROOT / "test-artifacts" / "browser"
NOTEBOOK = REPO_ROOT / "notebooks" / "02_bpe_diff_inspection.ipynb"


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
    nb.nbformat_minor = max(nb.nbformat_minor, 5)  # cell ids: every cell gets one
    for k, c in enumerate(nb.cells):
        c.setdefault("id", f"cell-{k}")
    nbformat.write(nb, root / "inspect.ipynb")
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


def test_inspector_notebook_runs_filters_and_navigates_in_chromium(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1500, "height": 1100})
        context.set_default_timeout(30_000)
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.goto(f"{lab['base']}/lab/tree/inspect.ipynb?token={lab['token']}", timeout=60_000)
            page.wait_for_selector(".jp-Notebook", timeout=90_000)
            page.wait_for_function("() => window.jupyterapp !== undefined", timeout=90_000)
            wait_for(lambda: kernel_idle(lab), 90, "the notebook's kernel to be ready")
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

            position = page.locator(".ke-inspector-position")
            position.wait_for(state="attached", timeout=240_000)
            page.wait_for_function(
                "() => { const e = document.querySelector('.ke-inspector-position');"
                " return e && /hunk|no hunks/.test(e.textContent); }", timeout=60_000)

            page.locator(".ke-inspector-verdict select").select_option("semantic", timeout=10_000)
            page.locator(".ke-inspector-subclass select").select_option("tool_args_json_equal", timeout=10_000)
            page.wait_for_function(  # the kernel has applied the filters: the selected record and its first hunk
                "() => { const s = document.querySelector('.ke-inspector-record select');"
                " const o = s && s.options[s.selectedIndex];"
                " return o && o.textContent.includes('[tool_args_json_equal]')"
                " && /hunk 1\\/\\d+/.test(document.querySelector('.ke-inspector-position').textContent); }",
                timeout=90_000)
            record = page.locator(".ke-inspector-record select option:checked").inner_text(timeout=10_000)
            assert "#args_reserialised" in record and "[tool_args_json_equal]" in record
            n = int(re.search(r"hunk 1/(\d+)", position.inner_text(timeout=10_000)).group(1))
            expected = 1 % n + 1

            page.locator(".ke-inspector-next button, button.ke-inspector-next").first.click(timeout=10_000)
            page.wait_for_function(
                f"() => document.querySelector('.ke-inspector-position').textContent.includes('hunk {expected}/{n}')",
                timeout=90_000)
            current = page.locator(".ke-inspector-view .ke-cur")
            assert current.count() == 1
            assert current.get_attribute("data-hunk", timeout=10_000) == str(expected - 1)
            assert "label <b>tool_args_json_equal</b>" in page.locator(".ke-inspector-view").inner_html(timeout=10_000)

            news = page.get_by_role("button", name="No", exact=True)  # JupyterLab's "notify about news?" toast
            if news.count():
                news.first.click(timeout=5_000)
            # the playground: its checkbox label is shown whole, its comparison names the pasted IDs
            label = page.locator(".ke-playground-allow-special")
            label.wait_for(state="attached", timeout=90_000)
            clipped = label.evaluate("e => [...e.querySelectorAll('label, span')].some("
                                     "x => x.textContent.trim() && x.scrollWidth > x.clientWidth + 1)", timeout=10_000)
            assert not clipped, "the playground's checkbox label is cut off"
            assert "special-token spellings become specials" in label.inner_text(timeout=10_000)

            current.scroll_into_view_if_needed(timeout=10_000)
            shot = ARTIFACTS / "inspector.png"
            page.screenshot(path=str(shot), full_page=False, timeout=90_000)
            assert shot.stat().st_size > 10_000
            assert (lab["root"] / "out" / "metrics.json").is_file()
        finally:
            context.close()
            shutil.copy(lab["root"] / "jupyter.log", ARTIFACTS / "jupyter.log")
