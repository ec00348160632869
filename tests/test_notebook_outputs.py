"""The executed notebooks of the newest ``make run`` carry clean outputs (issue 56).

``make run`` executes the notebooks into ``RUNS_DIR/notebooks/<stamp>/embedded/`` and
``.../qwen2.5-coder/`` (one folder per runbook call, each with its ``runbook.json``); the newest ``<stamp>``
(UTC ``YYYYmmdd-HHMMSS``, so the names sort by time) is walked, every notebook its ``runbook.json`` does not
list as still ``running``. Where there is no run (CI's test-only clone) the real-run test skips, saying where
it looked. :func:`notebook_findings` walks every cell of one executed notebook and reports each defect as
``<notebook>: cell <i>: <kind>: <excerpt>`` (``<notebook>`` the path under the run without ``.ipynb``, e.g.
``embedded/03_m2_speedup_runs``; ``<i>`` the cell's 0-based index in the *executed* notebook, papermill's
injected-parameters cell included). One finding per output and kind (the first offending line, and how many
more there are), so a tqdm bar redrawn a hundred times is one line. The kinds:

- ``stderr``: any other line on stderr. A clean run writes nothing there but SPADE's own controls.
- ``warning``: a library warning in any text output: a ``...Warning`` class name (``FutureWarning``,
  ``UserWarning``, ``TqdmWarning``, ...), ``Warning:``, or the source line Python echoes under a warning.
  *Deliberate* lines are not findings: a line carrying ``spade_lib.runs.controls.PREFIX`` (``physical
  control``) or ``MODEL_PREFIX`` (``cost-model control``) -- notebook 03 raises its controls' violations with
  ``warnings.warn(line, RuntimeWarning)`` and prints their tallies (``physical controls: 0 violation(s)``) --
  and the indented source line Python prints under such a warning. No notebook prints any other sentence
  about warnings (their ``print`` calls were read for this).
- ``progress``: a progress bar -- tqdm's ``NN%|`` or ``it/s]`` / ``prompt/s]`` / ``s/it]``, on any stream,
  or a Jupyter widget output (``tqdm.auto`` under ipywidgets).
- ``weights``: weight-loading noise: ``Loading weights``, ``Loading checkpoint shards``, ``Writing model
  shards``, ``Some weights of``.
- ``error``: an error output (a notebook that raised).
- ``nan``: a missing value printed as a table cell: a ``<td>`` of an HTML table whose text is ``NaN``,
  ``nan``, ``<NA>`` or ``NaT`` (named by column and row), or such a whitespace-separated token in a
  ``text/plain`` result (a DataFrame's plain repr) or on stdout (``print(df)``).
- ``missing figure``: ``figures/<name>.png|pdf`` named in a markdown cell or any text output while no figure
  folder of the run holds ``<name>.png`` or ``<name>.pdf`` (``save_figure`` writes both; the report copies
  only the PNG to ``<stamp>/report/figures/``, so either one counts). The folders: the run's
  ``report/figures`` and ``spade_lib.paths.FIGURES_DIR``.
- ``dangling reference``: prose pointing at a table or figure that is not there. The heuristic, kept simple
  on purpose: a markdown cell or a text output that says ``table(s)``/``figure(s)``/``plot(s)``/``chart(s)``
  followed by ``above``/``below`` (or ``above``/``below`` followed by one of them) needs an output of that
  kind (plot and chart are figures) among the outputs *adjacent in that direction*: for a text output, the
  outputs of its own cell on that side; then the :data:`NEAR` nearest code cells on that side (markdown cells
  are passed over, not counted). A table output is an HTML ``<table>`` or plain text with two consecutive
  lines of at least three columns separated by two or more spaces (a DataFrame's repr); a figure output is an
  image (``image/png``, ``image/svg+xml``, ``image/jpeg``, ``application/pdf``) or matplotlib's ``<Figure
  size ...>``. It does not check *which* table the sentence means, only that one of that kind is near, which
  is the defect the issue names: a sentence left pointing at a table or figure a section did not produce.

The walker is tested on synthetic executed notebooks built with ``nbformat`` (each defect in a notebook of its
own, found with its notebook and cell; a clean notebook with the deliberate lines finds nothing), so the
real-run test cannot pass by walking nothing.
"""

from __future__ import annotations

import os

import html
import json
import re
from pathlib import Path
from typing import NamedTuple

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from spade_lib import paths
from spade_lib.runs import controls

NEAR = 3  # code cells on each side whose outputs count as adjacent to a "table above" / "figure below"
STAMP = re.compile(r"\d{8}-\d{6}")
EXCERPT = 120  # characters of the offending text in a finding

DELIBERATE = (controls.PREFIX, controls.MODEL_PREFIX)
WARNING = re.compile(r"\b[A-Z]\w*Warning\b|\bWarning:|^\s*warnings\.warn\(")
PROGRESS = re.compile(r"\d+%\||[\d?][A-Za-z]+/s\]|\ds/[A-Za-z]+\]")  # 50%| 1.5it/s] ?it/s] 2.1s/it]
WEIGHTS = re.compile(r"Loading (?:weights|checkpoint shards)|Writing model shards|Some weights of", re.I)
MISSING = ("NaN", "nan", "<NA>", "NaT")
MISSING_TOKEN = re.compile(r"(?<!\S)(?:NaN|nan|<NA>|NaT)(?!\S)")
FIGURE_REF = re.compile(r"\bfigures/([\w.-]+?)\.(?:png|pdf)\b")
PROSE_REF = re.compile(r"\b(table|figure|plot|chart)s?\s+(above|below)\b"
                       r"|\b(above|below)\s+(table|figure|plot|chart)s?\b", re.I)
IMAGES = ("image/png", "image/svg+xml", "image/jpeg", "application/pdf")
WIDGET = "application/vnd.jupyter.widget-view+json"


class Finding(NamedTuple):
    notebook: str
    cell: int
    kind: str
    excerpt: str

    def __str__(self) -> str:
        return f"{self.notebook}: cell {self.cell}: {self.kind}: {self.excerpt}"


def _excerpt(text: str, more: int = 0) -> str:
    text = " ".join(text.split())
    text = text if len(text) <= EXCERPT else text[:EXCERPT - 3] + "..."
    return text + (f" (+{more} more)" if more else "")


def _lines(text: str) -> list[str]:
    return [ln for ln in re.split(r"[\r\n]+", text) if ln.strip()]


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


# ---- what an output is ------------------------------------------------------------------------------------

def _texts(o) -> list[tuple[str, str]]:
    """``(where, text)`` of an output's text: ``stdout``/``stderr`` for streams, the MIME type for data."""
    kind = o.get("output_type")
    if kind == "stream":
        return [(o.get("name", "stdout"), _text(o.get("text")))]
    if kind in ("execute_result", "display_data"):
        data = o.get("data", {})
        return [(m, _text(data[m])) for m in ("text/plain", "text/markdown", "text/html") if m in data]
    return []


def _is_figure(o) -> bool:
    data = o.get("data", {}) if o.get("output_type") in ("execute_result", "display_data") else {}
    return any(m in data for m in IMAGES) or _text(data.get("text/plain")).lstrip().startswith("<Figure size")


def _is_table(o) -> bool:
    for where, text in _texts(o):
        if where == "text/html":
            if "<table" in text:
                return True
        elif where != "text/markdown":
            wide = [len(re.split(r"\s{2,}", ln.strip())) >= 3 for ln in text.splitlines()]
            if any(a and b for a, b in zip(wide, wide[1:])):
                return True
    return False


# ---- the checks ----------------------------------------------------------------------------------------

def _line_kinds(where: str, text: str) -> dict[str, list[str]]:
    """Offending lines of one text, by kind (module docstring); deliberate control lines skipped."""
    found: dict[str, list[str]] = {}
    echo = False  # the source line Python prints under a deliberate warning
    for line in _lines(text):
        if any(p in line for p in DELIBERATE):
            echo = True
            continue
        if echo and line[:1].isspace():
            echo = False
            continue
        echo = False
        if PROGRESS.search(line):
            kind = "progress"
        elif WEIGHTS.search(line):
            kind = "weights"
        elif WARNING.search(line):
            kind = "warning"
        elif where == "stderr":
            kind = "stderr"
        else:
            continue
        found.setdefault(kind, []).append(line)
    return found


def _html_missing(text: str) -> list[str]:
    """``column 'c', row r: NaN`` for every missing-value cell of the HTML tables in ``text``."""
    out = []
    for table in re.findall(r"<table.*?</table>", text, re.S | re.I):
        header: list[str] = []
        for row in re.findall(r"<tr.*?</tr>", table, re.S | re.I):
            cells = [(tag.lower(), html.unescape(re.sub(r"<[^>]+>", "", body)).strip())
                     for tag, body in re.findall(r"<(t[hd])\b[^>]*>(.*?)</t[hd]>", row, re.S | re.I)]
            if all(tag == "th" for tag, _ in cells):
                header = [t for _, t in cells]
                continue
            label = next((t for tag, t in cells if tag == "th"), "?")
            for k, (tag, value) in enumerate(cells):
                if tag == "td" and value in MISSING:
                    col = header[k] if len(header) == len(cells) else f"#{k}"
                    out.append(f"column {col!r}, row {label}: {value}")
    return out


def _outputs_near(cells, i: int, direction: str) -> list:
    """The outputs of the :data:`NEAR` nearest code cells before (``above``) or after (``below``) cell ``i``."""
    order = range(i - 1, -1, -1) if direction == "above" else range(i + 1, len(cells))
    code = [cells[j] for j in order if cells[j].cell_type == "code"][:NEAR]
    return [o for c in code for o in c.get("outputs", [])]


def _dangling(text: str, cells, i: int, before: list, after: list) -> list[str]:
    """The prose references of ``text`` (in cell ``i``) with no adjacent output of their kind."""
    out = []
    for m in PROSE_REF.finditer(text):
        noun = (m.group(1) or m.group(4)).lower()
        direction = (m.group(2) or m.group(3)).lower()
        near = (before if direction == "above" else after) + _outputs_near(cells, i, direction)
        wanted = _is_table if noun == "table" else _is_figure
        if not any(wanted(o) for o in near):
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            out.append(f"no {'table' if noun == 'table' else 'figure'} {direction}: "
                       + text[start:end if end >= 0 else len(text)].strip())
    return out


def _missing_figures(text: str, figure_dirs: list[Path]) -> list[str]:
    return [m.group(0) for m in FIGURE_REF.finditer(text)
            if not any((d / f"{m.group(1)}{ext}").is_file() for d in figure_dirs for ext in (".png", ".pdf"))]


def notebook_findings(notebook, name: str, *, figure_dirs=()) -> list[Finding]:
    """Every defect of one executed notebook (a path or a read ``NotebookNode``), in cell order (module
    docstring). ``figure_dirs``: the folders where a ``figures/<name>.png`` it names may be."""
    nb = nbformat.read(notebook, as_version=4) if isinstance(notebook, (str, Path)) else notebook
    figure_dirs = [Path(d) for d in figure_dirs]
    cells = nb.cells
    found: list[Finding] = []

    def add(i: int, kind: str, items: list[str]) -> None:
        if items:
            found.append(Finding(name, i, kind, _excerpt(items[0], len(items) - 1)))

    for i, cell in enumerate(cells):
        if cell.cell_type == "markdown":
            add(i, "missing figure", _missing_figures(cell.source, figure_dirs))
            add(i, "dangling reference", _dangling(cell.source, cells, i, [], []))
            continue
        if cell.cell_type != "code":
            continue
        outputs = cell.get("outputs", [])
        for j, o in enumerate(outputs):
            if o.get("output_type") == "error":
                add(i, "error", [f"{o.get('ename')}: {o.get('evalue')}"])
                continue
            if WIDGET in o.get("data", {}):
                add(i, "progress", [_text(o["data"].get("text/plain")) or "a Jupyter widget output"])
                continue  # its text/plain is the same bar
            texts = _texts(o)
            html_tables = any(w == "text/html" and "<table" in t for w, t in texts)
            for where, text in texts:
                if where != "text/html":
                    for kind, lines in _line_kinds(where, text).items():
                        add(i, kind, lines)
                if where == "text/html":
                    add(i, "nan", _html_missing(text))
                elif where == "stdout" or (where == "text/plain" and not html_tables):
                    add(i, "nan", [ln for ln in _lines(text) if MISSING_TOKEN.search(ln)])
                add(i, "missing figure", _missing_figures(text, figure_dirs))
                if where != "text/html":
                    add(i, "dangling reference", _dangling(text, cells, i, outputs[:j], outputs[j + 1:]))
    return found


# ---- the run -----------------------------------------------------------------------------------------------

def newest_run(root: Path | None = None) -> Path | None:
    """The newest ``<stamp>`` folder under ``RUNS_DIR/notebooks`` holding a ``runbook.json`` (in itself, or in
    a direct subfolder as ``make run`` writes them); ``None`` if there is none."""
    root = Path(root) if root is not None else paths.RUNS_DIR / "notebooks"
    if not root.is_dir():
        return None
    stamps = sorted((p for p in root.iterdir() if p.is_dir() and STAMP.fullmatch(p.name)), reverse=True)
    return next((p for p in stamps if _parts(p)), None)


def _parts(run: Path) -> list[Path]:
    """The runbook folders of a run: the run itself and/or its direct subfolders with a ``runbook.json``."""
    return [d for d in [run, *sorted(p for p in run.iterdir() if p.is_dir())] if (d / "runbook.json").is_file()]


def executed_notebooks(run: Path) -> list[tuple[str, Path]]:
    """``(name, path)`` of every executed notebook of ``run`` that its runbook has finished (ok or failed);
    ``name`` is the path under ``run`` without ``.ipynb``."""
    out = []
    for part in _parts(run):
        try:
            record = json.loads((part / "runbook.json").read_text(encoding="utf-8"))
            status = {n.get("name"): n.get("status") for n in record.get("notebooks", [])}
        except (OSError, ValueError, AttributeError):
            status = {}
        for nb in sorted(part.glob("*.ipynb")):
            if status.get(nb.stem) != "running":
                out.append((nb.relative_to(run).with_suffix("").as_posix(), nb))
    return out


def run_findings(run: Path, figure_dirs=None) -> tuple[list[Finding], int]:
    """Every finding of every executed notebook of ``run`` and how many outputs were walked."""
    figure_dirs = figure_dirs if figure_dirs is not None else [run / "report" / "figures", paths.FIGURES_DIR]
    found, n_outputs = [], 0
    for name, path in executed_notebooks(run):
        nb = nbformat.read(path, as_version=4)
        n_outputs += sum(len(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")
        found += notebook_findings(nb, name, figure_dirs=figure_dirs)
    return found, n_outputs


@pytest.mark.skipif(os.environ.get("SPADE_CHECK_RUN_OUTPUTS", "1") == "0",
                    reason="SPADE_CHECK_RUN_OUTPUTS=0: the newest make run's outputs are not walked")
def test_the_newest_run_has_clean_outputs():
    """The newest ``make run`` in this clone (none in CI's test-only clone: skipped, saying where it looked) has
    clean outputs: the fresh-clone run at 3803230 had 0 findings over 111 outputs (114 at 0247039)."""
    # make test points SPADE_RUNS_DIR at runs/test; make run writes into runs/ (or SPADE_RUNS_DIR): look in both
    roots = list(dict.fromkeys([paths.RUNS_DIR / "notebooks", paths.REPO_ROOT / "runs" / "notebooks"]))
    found_runs = [r for r in (newest_run(root) for root in roots) if r is not None]
    if not found_runs:
        pytest.skip(f"no `make run` folder (<stamp>/ with a runbook.json) under {[str(r) for r in roots]}")
    run = max(found_runs, key=lambda r: r.name)
    if not executed_notebooks(run):
        pytest.skip(f"{run}: no finished executed notebook yet")
    found, n_outputs = run_findings(run)
    assert n_outputs > 0, f"{run}: the executed notebooks hold no outputs at all"
    assert not found, f"{run}: {len(found)} unclean output(s):\n" + "\n".join(f"  {f}" for f in found)


# ---- the walker on synthetic executed notebooks ------------------------------------------------------------

TABLE = pd.DataFrame({"label": ["spade", "ar"], "speedup": [1.31, 1.0], "tau": [2.4, 1.0]})
HOLED = pd.DataFrame({"label": ["spade", "ar"], "speedup": [1.31, float("nan")],
                      "n": pd.array([3, None], dtype="Int64")})
PNG = "iVBORw0KGgo="  # any base64: the walker looks at the MIME type only
CONTROL = ("/tmp/ipykernel_41/2571.py:9: RuntimeWarning: physical control: r(1) = 0.93 < 1 for eagle3\n"
           "  warnings.warn(line, RuntimeWarning, stacklevel=1)\n")


def stream(text: str, name: str = "stdout"):
    return new_output("stream", name=name, text=text)


def result(df: pd.DataFrame, *, html_repr: bool = True):
    data = {"text/plain": repr(df)}
    if html_repr:
        data["text/html"] = df._repr_html_()
    return new_output("execute_result", data=data, execution_count=1)


def figure():
    return new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"})


def code(*outputs, source: str = "x = 1"):
    cell = new_code_cell(source)
    cell.outputs = list(outputs)
    return cell


def write(tmp_path: Path, name: str, cells) -> Path:
    path = tmp_path / f"{name}.ipynb"
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


INTRO = new_markdown_cell("# A notebook\n\nIt narrates.")
# (kind, cells, cell index of the defect, text the excerpt must hold)
DEFECTS = {
    "future_warning": ("warning", [INTRO, code(stream(
        "/venv/lib/python3.12/site-packages/transformers/x.py:12: FutureWarning: `foo` is deprecated\n"
        "  warnings.warn(\n", "stderr"))], 1, "FutureWarning"),
    "deprecation_on_stdout": ("warning", [INTRO, code(), code(stream("DeprecationWarning: old API\n"))], 2,
                              "DeprecationWarning"),
    "stray_stderr": ("stderr", [INTRO, code(stream("something went to stderr\n", "stderr"))], 1, "stderr"),
    "tqdm_bar": ("progress", [INTRO, code(stream(
        "\rbatch study:   0%|          | 0/4 [00:00<?, ?it/s]\rbatch study:  50%|#####     | 2/4 "
        "[00:01<00:01,  1.52it/s]", "stderr"))], 1, "%|"),
    "tqdm_prompts": ("progress", [INTRO, code(stream("tiny/embedded 3 configs interleaved: 4/8 [00:02, 1.9prompt/s]",
                                                     "stderr"))], 1, "prompt/s]"),
    "widget_bar": ("progress", [INTRO, code(new_output("display_data", data={
        WIDGET: {"model_id": "abc", "version_major": 2, "version_minor": 0}, "text/plain": "  0%|          | 0/8"}))],
                   1, "0/8"),
    "loading_weights": ("weights", [INTRO, code(stream("Loading weights from /cache/qwen/model.safetensors\n"))], 1,
                        "Loading weights"),
    "writing_shards": ("weights", [INTRO, code(), code(stream("Writing model shards: done\n", "stderr"))], 2,
                       "Writing model shards"),
    "error": ("error", [INTRO, code(new_output("error", ename="ValueError", evalue="gamma: must be >= 1",
                                               traceback=[]))], 1, "ValueError"),
    "nan_html": ("nan", [INTRO, code(result(HOLED))], 1, "column 'speedup', row 1: NaN"),
    "na_plain": ("nan", [INTRO, code(result(HOLED[["label", "n"]], html_repr=False))], 1, "<NA>"),
    "nan_printed": ("nan", [INTRO, code(stream(HOLED[["label", "speedup"]].to_string() + "\n"))], 1, "NaN"),
    "table_above": ("dangling reference", [INTRO, code(stream("done\n")),
                                           new_markdown_cell("As the table above shows, gamma 4 is best.")], 2,
                    "no table above"),
    "figure_below_printed": ("dangling reference", [INTRO, code(stream("the figure below plots tau by depth\n")),
                                                    code(result(TABLE))], 1, "no figure below"),
    "far_figure": ("dangling reference", [INTRO, code(figure()), *[code() for _ in range(NEAR)],
                                          new_markdown_cell("The figure above is the headline.")], 2 + NEAR,
                   "figure above"),
    "missing_figure_file": ("missing figure", [INTRO, new_markdown_cell("See `figures/m9_nothing.png`.")], 1,
                            "figures/m9_nothing.png"),
    "missing_figure_printed": ("missing figure", [INTRO, code(stream("saved figures/m9_gone.pdf\n"))], 1,
                               "figures/m9_gone.pdf"),
}


@pytest.mark.parametrize("case", sorted(DEFECTS))
def test_the_walker_reports_each_defect_with_its_notebook_and_cell(tmp_path, case):
    kind, cells, index, text = DEFECTS[case]
    (tmp_path / "figures").mkdir()
    found = notebook_findings(write(tmp_path, case, cells), case, figure_dirs=[tmp_path / "figures"])
    assert [(f.notebook, f.cell, f.kind) for f in found] == [(case, index, kind)], [str(f) for f in found]
    assert str(found[0]).startswith(f"{case}: cell {index}: {kind}: ") and text in str(found[0]), str(found[0])


def test_a_clean_notebook_reports_nothing(tmp_path):
    """Tables without holes, figures where prose points, existing figure files, and SPADE's deliberate control
    lines (the warning notebook 03 raises, its echoed source line, the printed tallies) are all clean."""
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "m2_speedup_runs.png").write_bytes(b"png")
    (figures / "m3_acceptance_by_position.pdf").write_bytes(b"pdf")
    cells = [
        INTRO,
        code(stream(CONTROL, "stderr"), stream("physical controls: 0 violation(s) (r(g) >= 1 within 5 %)\n"
                                               "cost-model control: eagle3 measured 1.10x outside [1.2, 1.4]\n")),
        code(stream("the table below is per category; nan-free\n"), result(TABLE)),
        new_markdown_cell("The table above and the figure below (`figures/m2_speedup_runs.png`, "
                          "`figures/m3_acceptance_by_position.pdf`): the run saved both."),
        code(stream("speedup 1.31x [1.22, 1.40] at gamma 4; throughput [tok/s] 41.2\n"),
             figure()),
        new_markdown_cell("The figure above has one series per draft; the plots above too."),
    ]
    path = write(tmp_path, "clean", cells)
    assert notebook_findings(path, "clean", figure_dirs=[figures]) == []


def test_every_finding_of_a_notebook_is_reported(tmp_path):
    """One notebook with several defects reports each, in cell order, and the control warning beside a
    library warning in one stderr stream leaves only the library one."""
    cells = [INTRO, code(stream(CONTROL + "/venv/x.py:3: UserWarning: TypedStorage is deprecated\n", "stderr")),
             code(result(HOLED)), new_markdown_cell("See `figures/m9_none.png`.")]
    found = notebook_findings(write(tmp_path, "many", cells), "many", figure_dirs=[tmp_path])
    assert [(f.cell, f.kind) for f in found] == [(1, "warning"), (2, "nan"), (3, "missing figure")], found
    assert "UserWarning" in found[0].excerpt and "physical control" not in found[0].excerpt


def _make_run(root: Path, stamp: str, parts: dict[str, dict[str, str]]) -> Path:
    """A fake ``make run`` folder: ``parts`` maps a runbook folder to {notebook stem: status}."""
    run = root / stamp
    for part, notebooks in parts.items():
        d = run / part
        d.mkdir(parents=True)
        (d / "runbook.json").write_text(json.dumps({"status": "ok", "notebooks": [
            {"name": n, "status": s} for n, s in notebooks.items()]}), encoding="utf-8")
        for n in notebooks:
            write(d, n, [INTRO, code(stream("/x.py:1: FutureWarning: old\n", "stderr"))])
    return run


def test_the_newest_run_is_found_and_walked(tmp_path, monkeypatch):
    root = tmp_path / "runs" / "notebooks"
    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path / "runs")
    assert newest_run() is None  # no run at all: the real-run test skips
    _make_run(root, "20240101-000000", {"embedded": {"02_m2_acceptance_math": "ok"}})
    run = _make_run(root, "20250102-030405", {"embedded": {"03_m2_speedup_runs": "ok"},
                                              "qwen2.5-coder": {"03_m2_speedup_runs": "ok",
                                                                "04_m3_rejection_diagnostics": "running"}})
    (root / "20990101-000000").mkdir()       # no runbook.json: not a run
    (root / "not-a-stamp").mkdir()
    assert newest_run() == run
    found, n_outputs = run_findings(run, figure_dirs=[])
    assert n_outputs == 2  # the notebook still running is left out
    assert [str(f) for f in found] == ["embedded/03_m2_speedup_runs: cell 1: warning: /x.py:1: FutureWarning: old",
                                       "qwen2.5-coder/03_m2_speedup_runs: cell 1: warning: /x.py:1: FutureWarning: old"]
