"""JupyterLab in a real browser: notebook 02 opened in headless Chromium, run to the end; and the
HTML report of a run (``spade_lib.report``) opened from disk, every page rendering its figures.

The test starts ``jupyter lab`` (the project's Python, so the notebook's ``python3`` kernel is the
project kernel) headless on 127.0.0.1 at a free port, token disabled, in its own process group, with
``SPADE_PROFILE=smoke``; opens a copy of notebook 02 (so the repository's clean notebook is never
saved over) in Chromium driven by Playwright; clicks Run > Run All Cells; waits (bounded) for the
kernel to finish; then checks the saved notebook for error outputs and unexecuted cells, checks that
the browser rendered a figure, and saves a screenshot to ``RUNS_DIR/browser/`` (``runs/test/browser/``
under ``make test``). The server and its kernel are always stopped.

Playwright's own browser download is not needed: any Chromium works through ``executable_path``
(Debian's ``chromium`` package, as ``.ci/run`` installs; ``SPADE_CHROMIUM=/path/to/chrome``; or the one
``python -m playwright install chromium`` downloads). Without one the test skips, saying how to get one
(in CI, where ``CI=true``, it fails instead).
"""

from __future__ import annotations

import json
import os
import re
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

from spade_lib import paths
from spade_lib.io import atomic_path
from test_report import run  # noqa: F401 - the fixture of a run folder

NOTEBOOK = paths.NOTEBOOKS_DIR / "02_m2_acceptance_math.ipynb"
SERVER_START_S = 120   # jupyter lab up and answering
PAGE_LOAD_S = 120      # notebook rendered and kernel idle
RUN_S = 480            # every cell run (the smoke profile takes well under that)
SAVE_S = 60
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = ("no Chromium found for the browser test: install one with `apt-get install chromium` "
                "(Debian/Ubuntu, as root) or `python -m playwright install chromium`, or point "
                "SPADE_CHROMIUM at a Chrome/Chromium executable")



def find_browser(sync_api) -> str | None:
    """``SPADE_CHROMIUM``, else a Chromium on PATH, else Playwright's own download if present."""
    env = os.environ.get("SPADE_CHROMIUM")
    if env:
        return env if Path(env).is_file() else None
    found = next((p for p in map(shutil.which, BROWSERS) if p), None)
    if found is None:
        with sync_api.sync_playwright() as pw:
            bundled = pw.chromium.executable_path
        found = bundled if bundled and Path(bundled).is_file() else None
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def lab_settings(folder: Path) -> None:
    """User settings for the test's JupyterLab: every cell rendered (no windowing, so all outputs are
    in the page) and no news/update toast."""
    for plugin, values in {
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    }.items():
        f = folder / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values), encoding="utf-8")


def start_server(root: Path, port: int, tmp: Path, log) -> subprocess.Popen:
    env = dict(os.environ)
    env.update({
        "SPADE_PROFILE": "smoke",
        "SPADE_RUNS_DIR": str(paths.RUNS_DIR),
        "SPADE_FIGURES_DIR": os.environ.get("SPADE_FIGURES_DIR") or str(paths.RUNS_DIR / "figures"),
        "PYTHONPATH": os.pathsep.join([str(paths.REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
        "IPYTHONDIR": str(tmp / "ipython"),
    })
    env.pop("MPLBACKEND", None)  # make test sets Agg; in JupyterLab the kernel's inline backend shows figures
    lab_settings(tmp / "settings")
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--port-retries=0", f"--ServerApp.root_dir={root}", "--IdentityProvider.token=",
           "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def wait_for_server(proc: subprocess.Popen, base: str, log_path: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            get_json(f"{base}/api/status")
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer within {SERVER_START_S} s:\n{log_path.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen, base: str) -> None:
    """Shut the kernels down, then SIGTERM the server's process group (SIGKILL if it lingers)."""
    try:
        for k in get_json(f"{base}/api/kernels"):
            req = urllib.request.Request(f"{base}/api/kernels/{k['id']}", method="DELETE")
            urllib.request.urlopen(req, timeout=10).close()
    except OSError:
        pass
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue


def kernel_busy(base: str) -> bool:
    return any(k.get("execution_state") != "idle" for k in get_json(f"{base}/api/kernels"))


def prompts(page) -> list[str]:
    return page.eval_on_selector_all(".jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent.trim())")


def wait_until(cond, seconds: float, what: str, interval: float = 1.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {seconds:.0f} s waiting for {what}")


def dismiss_toasts(page) -> None:
    for label in ("No", "Dismiss"):
        button = page.locator(".Toastify__toast button", has_text=re.compile(f"^{label}$"))
        if button.count():
            button.first.click()


def browser_or_skip():
    """(playwright's sync API, a Chromium executable), or skip (fail under CI) saying how to get one."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (see requirements.txt)")
    browser_path = find_browser(sync_api)
    if browser_path is None:
        if os.environ.get("CI") == "true":  # .ci/run installs chromium: CI must run this test, not skip it
            pytest.fail(INSTALL_HINT)
        pytest.skip(INSTALL_HINT)
    return sync_api, browser_path


@pytest.mark.slow
def test_notebook_02_runs_in_jupyterlab(tmp_path):
    sync_api, browser_path = browser_or_skip()
    root = tmp_path / "lab"
    root.mkdir()
    nb_path = root / NOTEBOOK.name
    shutil.copyfile(NOTEBOOK, nb_path)
    code_cells = sum(c.cell_type == "code" for c in nbformat.read(nb_path, as_version=4).cells)
    shot = paths.ensure_dir(paths.RUNS_DIR / "browser") / f"{NOTEBOOK.stem}.png"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "jupyter.log"
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        server = start_server(root, port, tmp_path, log)
        try:
            wait_for_server(server, base, log_path)
            args = ["--no-sandbox"] if os.geteuid() == 0 else []
            with sync_api.sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=browser_path, headless=True, args=args)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                try:
                    page.set_default_timeout(PAGE_LOAD_S * 1000)
                    page.goto(f"{base}/lab/tree/{NOTEBOOK.name}")
                    page.wait_for_selector(".jp-Notebook .jp-CodeCell")
                    wait_until(lambda: len(get_json(f"{base}/api/kernels")) == 1 and not kernel_busy(base),
                               PAGE_LOAD_S, "the kernel to start")
                    assert len(prompts(page)) == code_cells
                    dismiss_toasts(page)
                    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
                    page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Run All Cells$")).click()
                    wait_until(lambda: any(p != "[ ]:" for p in prompts(page)), 30, "the cells to be queued", 0.2)

                    def finished() -> bool:
                        return not any("*" in p for p in prompts(page)) and not kernel_busy(base)

                    wait_until(lambda: finished() and (time.sleep(1.0) or finished()), RUN_S, "the notebook to run")
                    images = page.eval_on_selector_all(
                        ".jp-OutputArea-output img", "els => els.filter(e => e.complete && e.naturalWidth > 0).length")
                    assert images >= 1, "no figure rendered in the browser"
                    dismiss_toasts(page)
                    page.locator(".jp-OutputArea-output img").first.scroll_into_view_if_needed(timeout=10_000)
                    with atomic_path(shot) as tmp_png:
                        page.screenshot(path=str(tmp_png))
                    page.keyboard.press("Control+s")
                    wait_until(lambda: not page.locator(".jp-mod-dirty").count(), SAVE_S, "the notebook to be saved")
                except BaseException:
                    page.screenshot(path=str(shot.with_name(f"{NOTEBOOK.stem}-failure.png")))
                    raise
                finally:
                    browser.close()
        finally:
            stop_server(server, base)
    elapsed = time.monotonic() - t0
    assert server.poll() is not None, "jupyter lab is still running"

    nb = nbformat.read(nb_path, as_version=4)
    errors = [f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, c in enumerate(nb.cells)
              if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, f"error outputs in {NOTEBOOK.name}: {errors}"
    unexecuted = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.execution_count is None]
    assert not unexecuted, f"cells {unexecuted} did not run"
    assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert shot.stat().st_size > 10_000
    print(f"browser test: {elapsed:.0f} s, {images} figures rendered, screenshot {shot}")


def test_run_report_renders_in_chromium(run):
    """The report of a make-run-shaped folder (tests/test_report.py's ``run``), opened from disk with
    every network request refused: the index shows the run's figures, and each notebook page it links
    to loads and shows its figure (``img`` elements decoded, ``naturalWidth > 0``)."""
    from spade_lib import report

    sync_api, browser_path = browser_or_skip()
    summary = report.write_report(run, quiet=True)
    index = run / "report" / "index.html"
    loaded = "els => els.filter(e => e.complete && e.naturalWidth > 0).length"
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, headless=True, args=args)
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.route(re.compile(r"^https?://"), lambda route: route.abort())  # offline, as from a laptop
            page.goto(index.as_uri(), wait_until="load")
            assert page.title().startswith("SPADE run")
            assert page.eval_on_selector_all("img", loaded) == len(summary["figures"]) >= 1
            hrefs = page.eval_on_selector_all("a[href$='.html']", "els => els.map(e => e.href)")
            links = sorted(set(hrefs))  # the table and each figure's caption link the notebook that drew it
            assert len(links) == len(summary["notebooks"]) >= 1
            assert {u.rsplit("/report/", 1)[1] for u in links} == {
                n["file"].replace(".ipynb", ".html") for n in summary["notebooks"]}
            for url in links:
                page.goto(url, wait_until="load")
                assert page.locator(".jp-Notebook").count() == 1, url
                assert page.eval_on_selector_all(".jp-OutputArea-output img", loaded) >= 1, url
        finally:
            browser.close()


def _img_sources(page: str) -> list[str]:
    """The ``src`` of every ``<img>`` of an HTML page (parsed, not searched)."""
    from html.parser import HTMLParser

    class Images(HTMLParser):
        def __init__(self):
            super().__init__()
            self.src: list[str] = []

        def handle_starttag(self, tag, attrs):
            if tag == "img":
                self.src.append(dict(attrs).get("src") or "")

    parser = Images()
    parser.feed(page)
    return parser.src


def test_a_notebook_executed_by_papermill_under_agg_shows_its_figure_in_the_report(tmp_path, monkeypatch):
    """The planted-PNG run above proves the report keeps an image it is given; this one makes the image
    the real way: papermill executes a small notebook with ``MPLBACKEND=Agg`` exported (as ``make run``
    does), its cell draws and saves a figure with ``spade_lib.plots`` (``use_style`` selects the inline
    backend under the kernel, so the open figure becomes the cell's output), and ``report.write_report``
    of that run folder must show the figure on the notebook's page and in the gallery (HTML parsed; in
    Chromium too where one is installed)."""
    import papermill
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    from spade_lib import report

    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(paths.REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    run_dir, figures = tmp_path / "run", tmp_path / "figures"
    run_dir.mkdir()
    source = tmp_path / "source.ipynb"
    params = new_code_cell("points: int = 4  # points on the line")
    params.metadata["tags"] = ["parameters"]
    nbformat.write(new_notebook(cells=[
        new_markdown_cell("# A tiny notebook"), params,
        new_markdown_cell("**A line** through a few points, saved the SPADE way."),
        new_code_cell("from spade_lib.plots import figure, save_figure, use_style\n"
                      "use_style()\n"
                      "fig, ax = figure()\n"
                      "ax.plot(range(points), [x * x for x in range(points)], marker='o')\n"
                      f"_ = save_figure(fig, 'm9_executed_line', directory={str(figures)!r})"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}), source)
    papermill.execute_notebook(str(source), str(run_dir / "01_tiny.ipynb"), parameters={"points": 5},
                               kernel_name="python3", cwd=str(tmp_path), progress_bar=False)
    assert (figures / "m9_executed_line.png").is_file()
    summary = report.write_report(run_dir, runs_dir=tmp_path / "runs", figures_dir=figures, quiet=True)
    page = (run_dir / "report" / "01_tiny.html").read_text()
    assert any(src.startswith("data:image/png;base64,") for src in _img_sources(page)), "no figure on the page"
    assert [(g["notebook"], g["name"], g["caption"]) for g in summary["gallery"]] == [
        ("01_tiny", "m9_executed_line", "A line through a few points, saved the SPADE way.")]
    assert _img_sources((run_dir / "report" / "index.html").read_text()) == ["figures/m9_executed_line.png"]
    try:
        from playwright import sync_api
    except ImportError:
        return  # the HTML checks above stand; the browser check below needs Playwright and a Chromium
    browser_path = find_browser(sync_api)
    if browser_path is None:
        return
    loaded = "els => els.filter(e => e.complete && e.naturalWidth > 0).length"
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, headless=True,
                                     args=["--no-sandbox"] if os.geteuid() == 0 else [])
        try:
            tab = browser.new_page()
            tab.route(re.compile(r"^https?://"), lambda route: route.abort())
            tab.goto((run_dir / "report" / "01_tiny.html").as_uri(), wait_until="load")
            assert tab.eval_on_selector_all(".jp-OutputArea-output img", loaded) >= 1
        finally:
            browser.close()
