"""The run's results on one page: summary.md/json, the HTML report, the README block, runbook.json."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from spade_lib import paths, report, runbook
from spade_lib.io import write_json
from spade_lib.runs import compare

REPO = Path(__file__).resolve().parents[1]
SUITE = {"tiny": "embedded-0123abcd", "smollm2": "humaneval-89abcdef"}
COSTS = {d: f"/elsewhere/runs/costs/smollm2/{d}-abc.json" for d in ("distilled", "ngram")}  # set by the fixture
DUP = ("spade-distilled-g12-T1-aaaaaaaaaaaa", "spade-distilled-g12-T1-bbbbbbbbbbbb")
# what the fixture's notebooks save: 03 a per-pair figure (captioned in plots.captions), 04 a per-pair figure
# without a caption line (its caption: the markdown before the cell) and one saved under one name for all pairs
SAVES_03 = '_ = save_figure(fig, E.figure_name("m2_speedup_runs"))'
SAVES_04 = ('_ = save_figure(fig, E.figure_name("m3_made_up"))\n'
            '_ = save_figure(fig, "m2_alpha_overlap")')
GALLERY_EXTRA = ("m3_made_up", "m3_made_up-smollm2", "m2_alpha_overlap", "m9_orphan-smollm2")


def png_bytes(color: str = "red") -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(1, 1))
    fig.patch.set_facecolor(color)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def row(pair, label, method, draft="-", gamma=0, T=0.0, **m):
    base = dict(pair=pair, suite=SUITE[pair], run=f"{label}-0123456789ab", baseline=f"ar-T{T:g}", label=label,
                method=method, draft=draft, policy="fixed" if method == "spade" else "-", gamma=gamma, T=T,
                interleaved=True, tokens_per_s=100.0, alpha=math.nan, tau=math.nan, speedup=1.0, speedup_low=1.0,
                speedup_high=1.0, predicted=math.nan, speedup_rounds=3, estimators_disagree=0.0)
    return {**base, **m}


def fake_table() -> pd.DataFrame:
    """What compare.speedups returns (its columns; no alpha/tau intervals yet, as today)."""
    return pd.DataFrame([
        row("tiny", "ar-T0", "ar"),
        row("tiny", "spade-distilled-g2-T0", "spade", "distilled", 2, alpha=0.61, tau=2.1, speedup=1.31,
            speedup_low=1.20, speedup_high=1.42, predicted=1.35),
        row("tiny", "spade-null-g2-T0", "spade", "null", 2, alpha=0.0, tau=1.0, speedup=0.91, speedup_low=0.85,
            speedup_high=0.97, predicted=0.9),
        row("tiny", "spade-stale-g9-T0", "spade", "distilled", 9, alpha=0.5, tau=2.0, speedup=9.0,
            speedup_low=8.0, speedup_high=10.0),  # a run of an older make run: not named by the notebooks
        row("smollm2", "ar-T0", "ar"),
        row("smollm2", "hf-T0", "hf", speedup=0.7, speedup_low=0.6, speedup_high=0.8),
        row("smollm2", "spade-ngram-g4-T0", "spade", "ngram", 4, alpha=0.4, tau=1.9, speedup=2.55,
            speedup_low=2.31, speedup_high=2.80, predicted=1.8, costs_file=COSTS["ngram"]),  # above tau: a defect
        row("smollm2", "spade-distilled-g1-T0", "spade", "distilled", 1, alpha=0.12, tau=1.1, speedup=0.61,
            speedup_low=0.55, speedup_high=0.66, predicted=0.7, overhead=0.2,  # measured below its prediction
            costs_file=COSTS["distilled"]),
        row("smollm2", "spade-distilled-g2-T0", "spade", "distilled", 2, alpha=0.13, tau=1.2, speedup=0.52,
            speedup_low=0.47, speedup_high=0.58, predicted=0.55, costs_file=COSTS["distilled"]),
        row("smollm2", "hf_assisted-distilled-g4-T0", "hf_assisted", "distilled", 4, speedup=0.4,
            speedup_low=0.35, speedup_high=0.45, vs_hf=0.54, vs_hf_low=0.5, vs_hf_high=0.6),
        row("smollm2", "ar-T1", "ar", T=1.0),
        row("smollm2", "spade-ngram-g4-T1", "spade", "ngram", 4, T=1.0, alpha=0.3, tau=1.7, speedup=1.32,
            speedup_low=1.2, speedup_high=1.45, predicted=1.4, speedup_decode=1.5, speedup_decode_low=1.4,
            speedup_decode_high=1.6, predicted_steady=1.55),  # the decode phase, prefills out
        row("smollm2", "spade-null-g4-T1", "spade", "null", 4, T=1.0, alpha=0.0, tau=1.0, speedup=1.2,
            speedup_low=1.1, speedup_high=1.3),  # the control faster than AR: flagged
        # two runs with one label (notebook 03's and 05's gamma 12 at T = 1, of other lengths)
        row("smollm2", "spade-distilled-g12-T1", "spade", "distilled", 12, T=1.0, alpha=0.3, tau=1.4, speedup=0.8,
            speedup_low=0.7, speedup_high=0.9, run=DUP[0]),
        row("smollm2", "spade-distilled-g12-T1", "spade", "distilled", 12, T=1.0, alpha=0.3, tau=1.4, speedup=0.6,
            speedup_low=0.5, speedup_high=0.7, run=DUP[1]),
    ])


def notebook(pair: str, labels: list[str], png: bytes, warning: str = "", saves: str = "",
             parameters: dict | None = None) -> nbformat.NotebookNode:
    """An executed notebook printing the run folders of ``labels``; its figure cell's code is ``saves``
    (say ``_ = save_figure(fig, E.figure_name("m2_speedup_runs"))``), after a markdown cell."""
    refs = "".join(f"  {lab:<30} -> traces/{pair}/{SUITE[pair]}/{lab}-0123456789ab\n" for lab in labels)
    cells = [new_markdown_cell(f"# 03 on {pair}"),
             new_code_cell("print(runs)", outputs=[new_output("stream", name="stdout", text=refs + warning)]),
             new_markdown_cell("## A section\n\n**A made-up figure** of `tau` per draft. Its second sentence."),
             new_code_cell("fig\n" + saves, outputs=[new_output("display_data", data={
                 "image/png": base64.b64encode(png).decode(), "text/plain": "<Figure>"})])]
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "papermill": {"duration": 12.5, "start_time": "2000-01-01T00:00:00", "exception": None,
                      "parameters": parameters or {}}})
    return nb


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A make-run-shaped folder (embedded/ and smollm2/ parts), its runs folder (costs) and figures."""
    runs, figures, root = tmp_path / "runs", tmp_path / "figures", tmp_path / "runs" / "notebooks" / "20000101-000000"
    monkeypatch.setattr(paths, "RUNS_DIR", runs)
    monkeypatch.setattr(paths, "FIGURES_DIR", figures)
    for d in COSTS:
        monkeypatch.setitem(COSTS, d, str(runs / "costs" / "smollm2" / f"{d}-abc.json"))
    monkeypatch.setattr(compare, "speedups", lambda runs_dir: fake_table())
    png = png_bytes()
    started = time.time() - 60
    for part, pair, labels in (("embedded", "tiny", ["ar-T0", "spade-distilled-g2-T0", "spade-null-g2-T0"]),
                               ("smollm2", "smollm2", [r for r in fake_table().label if r.startswith(
                                   ("ar", "hf", "spade-ngram", "spade-distilled", "spade-null"))])):
        folder = root / part
        folder.mkdir(parents=True)
        given = {"pair": pair} if part == "smollm2" else {}  # papermill's parameters; embedded: the defaults
        nbformat.write(notebook(pair, labels, png, saves=SAVES_03, parameters=given, warning="!!! physical control: printed by the notebook itself\n"
                                "physical controls: 0 violation(s) (a tally, not a warning)\n"
                                "the adaptive rule beats the best fixed gamma (by 19.5 %)\n"
                                "the rule beats it: 1.21x [1.05, 1.40]\n"
                                if part == "smollm2" else ""), folder / "03_m2_speedup_runs.ipynb")
        nbformat.write(notebook(pair, [], png, saves=SAVES_04, parameters=given),
                       folder / "04_m3_rejection_diagnostics.ipynb")
        if part == "smollm2":  # notebooks 03 and 05 each name one of the two runs labelled alike
            for nb_name, run_name in (("03_m2_speedup_runs", DUP[0]), ("05_whatif_replay", DUP[1])):
                nb = nbformat.read(folder / f"{nb_name}.ipynb", as_version=4) if nb_name.startswith("03") else \
                    notebook(pair, [], png)
                nb.cells.append(new_code_cell("print(run)", outputs=[new_output(
                    "stream", name="stdout", text=f"spade-distilled-g12-T1 -> traces/{pair}/{SUITE[pair]}/{run_name}\n")]))
                nbformat.write(nb, folder / f"{nb_name}.ipynb")
            for run_name, n_new in zip(DUP, (64, 128)):
                write_json(runs / "traces" / pair / SUITE[pair] / run_name / "metadata.json", {
                    "config": {"method": "spade", "draft": "distilled", "gamma": 12, "temperature": 1.0,
                               "max_new_tokens": n_new, "repeats": 1}, "suite": {"n_prompts": 10}})
        write_json(folder / "runbook.json", {
            "profile": "default", "params": f"params/{part}" if part == "smollm2" else None, "status": "ok",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(started)), "finished": None,
            "commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False,
            "machine": {"cpu_model": "Test CPU 9000", "cpu_count": 2, "threads": 2, "torch": "2.x", "python": "3.x"},
            "notebooks": [{"name": "03_m2_speedup_runs", "seconds": 154.2, "status": "ok"},
                          {"name": "04_m3_rejection_diagnostics", "seconds": 35.0, "status": "ok"}],
            **({"builds": [{"name": "default", "seconds": 120.0, "status": "ok"},
                           {"name": "smollm2", "seconds": 180.0, "status": "ok"}]} if part == "embedded" else {})})
    # the greedy baseline's generations: one a loop of four tokens (13 of its 17 4-grams repeats), one never repeating
    ar0 = runs / "traces" / "smollm2" / SUITE["smollm2"] / "ar-T0-0123456789ab"
    ar0.mkdir(parents=True)
    (ar0 / "summary.jsonl").write_text("".join(json.dumps({"prompt_id": f"q{i}", "category": "code", "output_ids": ids}) + "\n"
                                               for i, ids in enumerate(([1, 2, 3, 4] * 5, list(range(20))))))
    for pair, r in (("tiny", {1: 1.02, 2: 1.05}), ("smollm2", {1: 1.01, 2: 0.90, 3: 1.1})):
        for draft, c in (("distilled", 0.3), ("ngram", 0.0)):
            write_json(runs / "costs" / pair / f"{draft}-abc.json", {
                "c": c, "r": r, "t_verify": {g: 0.01 for g in r}, "t_target": 0.01, "t_draft": 0.0,
                "overhead": 0.25, "key": {"pair": pair, "draft": draft, "threads": 2, "device": "cpu", "dtype": "float32"}})
    # a newer table no prediction read (another notebook's measurement): not the one the summary shows
    write_json(runs / "costs" / "smollm2" / "distilled-new.json", {
        "c": 0.9, "r": {1: 1.5}, "t_verify": {1: 0.01}, "t_target": 0.01, "t_draft": 0.0,
        "key": {"pair": "smollm2", "draft": "distilled", "threads": 2, "device": "cpu", "dtype": "float32"}})
    future = time.time() + 100
    os.utime(runs / "costs" / "smollm2" / "distilled-new.json", (future, future))
    figures.mkdir()
    for name in ("m2_speedup_runs", "m2_speedup_runs-smollm2", "old_figure", "teaser", *GALLERY_EXTRA):
        (figures / f"{name}.png").write_bytes(png)
    os.utime(figures / "old_figure.png", (started - 3600, started - 3600))
    return root


def test_summary_files(run, capsys):
    s = report.write_report(run)
    out = capsys.readouterr().out
    saved = json.loads((run / "summary.json").read_text())
    assert saved["schema"] == report.SCHEMA and saved["selection"] == "referenced"
    assert saved == json.loads(json.dumps(s))
    labels = {(r["pair"], r["label"]) for r in saved["configurations"]}
    assert ("tiny", "spade-stale-g9-T0") not in labels and ("smollm2", "spade-ngram-g4-T1") in labels
    ngram = next(r for r in saved["configurations"] if r["label"] == "spade-ngram-g4-T0")
    assert ngram["configuration"] == "spade-ngram-g4" and ngram["role"] == "speculative"
    assert ngram["speedup_low"] == 2.31 and ngram["alpha_low"] is None and len(ngram["warnings"]) == 2
    assert ngram["warnings"][0].startswith("physical control:") and ngram["warnings"][1].startswith(
        "cost-model control: smollm2/spade-ngram-g4-T0")  # the physics first, then measured vs predicted
    # the repetition of each run's generations, from its summary.jsonl (none here for the others)
    ar0 = next(r for r in saved["configurations"] if r["pair"] == "smollm2" and r["label"] == "ar-T0")
    assert ar0["repetition"] == pytest.approx((13 / 17 + 0) / 2) and ar0["degenerate"] == 0.5
    assert ngram["repetition"] is None and ngram["degenerate"] is None
    assert set(report.COLUMNS) <= set(ar0)
    g1 = next(r for r in saved["configurations"] if r["label"] == "spade-distilled-g1-T0")
    assert len(g1["warnings"]) == 1 and "excludes the cost-model prediction 0.700x" in g1["warnings"][0]
    assert "overhead 0.200" in g1["warnings"][0]
    # every label unique per pair: the two gamma-12 runs say what tells them apart, and who printed them
    for pair in ("tiny", "smollm2"):
        ls = [r["label"] for r in saved["configurations"] if r["pair"] == pair]
        assert len(ls) == len(set(ls)), ls
    dup = {r["run"]: r for r in saved["configurations"] if r["run_label"] == "spade-distilled-g12-T1"}
    assert dup[DUP[0]]["label"] == "spade-distilled-g12-T1 [max_new_tokens=64]"
    assert dup[DUP[1]]["configuration"] == "spade-distilled-g12 [max_new_tokens=128]"
    assert dup[DUP[0]]["notebooks"] == ["smollm2/03_m2_speedup_runs"] and dup[DUP[1]]["notebooks"] == [
        "smollm2/05_whatif_replay"]
    assert [(c["label"], c["passed"], c["matches_prediction"]) for c in saved["controls"]] == [
        ("spade-null-g2-T0", True, True), ("spade-null-g4-T1", False, None)]
    # the cost tables are the files the predictions used, not the newest file of the folder
    assert saved["costs"]["smollm2"]["distilled"]["r"] == {"1": 1.01, "2": 0.9, "3": 1.1}
    assert set(saved["costs"]["smollm2"]) == {"distilled", "ngram"} and saved["costs"]["smollm2"]["distilled"]["used"]
    assert saved["costs"]["smollm2"]["distilled"]["file"].endswith("costs/smollm2/distilled-abc.json")
    assert saved["costs"]["smollm2"]["distilled"]["overhead"] == 0.25
    assert not saved["costs"]["tiny"]["distilled"]["used"]  # no tiny row names a file: the newest, marked unused
    # the wall time includes the pair builds
    assert [(b["name"], b["seconds"]) for b in saved["builds"]] == [("default", 120.0), ("smollm2", 180.0)]
    assert saved["run"]["seconds"] == pytest.approx(2 * 154.2 + 2 * 35.0 + 12.5 + 300.0)  # 05: papermill's 12.5 s
    w = saved["warnings"]
    assert any("smollm2/spade-ngram-g4-T0" in x and "tau" in x for x in w)
    assert any("smollm2/spade-null-g4-T1" in x and "null-draft control" in x for x in w)
    assert any(x.startswith("physical control: smollm2/distilled: r(g)") for x in w)
    assert any(x == "physical control: printed by the notebook itself (printed by smollm2/03_m2_speedup_runs)" for x in w)
    assert not any("a tally" in x for x in w)
    # a printed verdict without an interval is a verdict-control warning; one with its interval is not
    verdict = [x for x in w if x.startswith("verdict control:")]
    assert len(verdict) == 1 and "by 19.5 %" in verdict[0] and "smollm2/03_m2_speedup_runs" in verdict[0]
    assert not any("tiny/" in x for x in w)
    nbs = {(n["part"], n["name"]): n for n in saved["notebooks"]}
    assert nbs[("smollm2", "03_m2_speedup_runs")]["seconds"] == 154.2
    assert nbs[("embedded", "04_m3_rejection_diagnostics")]["html"] == "report/embedded/04_m3_rejection_diagnostics.html"
    assert saved["machine"]["cpu_model"] == "Test CPU 9000" and saved["run"]["commit"].startswith("0123456")
    assert sorted(Path(f).stem for f in saved["figures"]) == sorted(["m2_speedup_runs-smollm2", "m2_speedup_runs",
                                                                      *GALLERY_EXTRA])
    # the gallery: every figure once, by pair (default first, shared ones last), then by the notebook saving it
    gallery = [(g["pair"], g["notebook"], g["name"]) for g in saved["gallery"]]
    assert gallery == [("default", "03_m2_speedup_runs", "m2_speedup_runs"),
                       ("default", "04_m3_rejection_diagnostics", "m3_made_up"),
                       ("smollm2", "03_m2_speedup_runs", "m2_speedup_runs-smollm2"),
                       ("smollm2", "04_m3_rejection_diagnostics", "m3_made_up-smollm2"),
                       ("smollm2", None, "m9_orphan-smollm2"),
                       (None, "04_m3_rejection_diagnostics", "m2_alpha_overlap")]
    captions = {g["name"]: g["caption"] for g in saved["gallery"]}
    from spade_lib.plots.captions import CAPTIONS

    assert captions["m2_speedup_runs-smollm2"] == CAPTIONS["m2_speedup_runs"]
    assert captions["m3_made_up"] == "A made-up figure of tau per draft."  # the markdown before the cell
    assert captions["m9_orphan-smollm2"] == ""
    assert sorted(g["figure"] for g in saved["gallery"]) == sorted(saved["figures"])
    md = (run / "summary.md").read_text()
    assert "| smollm2 | humaneval-89abcdef | spade-ngram-g4 | 0 | 0.40 | 1.90 | 2.55x [2.31, 2.80] | 1.80 | – | – |" in md
    assert "| spade-ngram-g4 | 1 | 0.30 | 1.70 | 1.32x [1.20, 1.45] | 1.40 | 1.50x [1.40, 1.60] | 1.55 |" in md
    assert "| speedup | predicted | decode phase | predicted (decode) | note |" in md
    assert "0.40x [0.35, 0.45]" in md and "0.54x [0.50, 0.60] vs HF generate" in md
    assert "control (null draft" in md and "FAILS" in md and "Test CPU 9000" in md
    assert "- smollm2 `ar-T0`: repetition 0.38, 50% of generations degenerate" in md
    assert ("passes (not faster than autoregressive); predicted 0.900x (1 / (r(g) + o) a decode step, with the "
            "prompts' prefills), inside the interval") in md
    assert "| embedded/build default | 120 | ok |" in md and "of notebooks and pair builds" in md
    assert "distilled-new.json" not in md and "0.250" in md
    assert "spade-ngram-g4" in out and "2.55x [2.31, 2.80]" in out and "154" in out
    assert f"HTML report: {(run / 'report' / 'index.html').resolve()}" in out
    assert not (paths.RUNS_DIR / "summary.json").exists() and not (run / "embedded" / "summary.json").exists()


def test_html_report(run):
    report.write_report(run, quiet=True)
    index = (run / "report" / "index.html").read_text()
    for part in ("embedded", "smollm2"):
        for nb in ("03_m2_speedup_runs", "04_m3_rejection_diagnostics"):
            page = run / "report" / part / f"{nb}.html"
            assert f'href="{part}/{nb}.html"' in index
            assert "data:image/png;base64," in page.read_text()  # the figure is in the page itself
            assert 'href="../index.html"' in page.read_text()
    assert 'src="figures/m2_speedup_runs-smollm2.png"' in index and "old_figure" not in index
    # the gallery: a section per pair, in it one per notebook (linked to that pair's page), captioned figures
    from spade_lib.plots.captions import CAPTIONS

    tree = gallery_tree(index)
    assert [p for p, _ in tree] == ["default", "smollm2", ""]
    smollm2 = dict(tree)["smollm2"]
    assert [(nb, href) for nb, href, _ in smollm2] == [("03_m2_speedup_runs", ["smollm2/03_m2_speedup_runs.html"]),
                                                       ("04_m3_rejection_diagnostics",
                                                        ["smollm2/04_m3_rejection_diagnostics.html"]), ("", [])]
    assert smollm2[0][2] == [("figures/m2_speedup_runs-smollm2.png",
                              f"m2_speedup_runs-smollm2: {CAPTIONS['m2_speedup_runs']}")]
    assert dict(tree)["default"][0][1] == ["embedded/03_m2_speedup_runs.html"]
    assert dict(tree)["default"][1][2] == [("figures/m3_made_up.png", "m3_made_up: A made-up figure of tau per draft.")]
    shared = dict(tree)[""]  # saved under one name by every part's notebook 04: a link to each part's page
    assert shared[0][1] == ["embedded/04_m3_rejection_diagnostics.html", "smollm2/04_m3_rejection_diagnostics.html"]
    assert sum(len(figs) for _, nbs in tree for _, _, figs in nbs) == 6
    assert (run / "report" / "figures" / "m2_speedup_runs.png").read_bytes() == png_bytes()
    assert "2.55x [2.31, 2.80]" in index and "null-draft control" in index
    assert 'href="../summary.json"' in index


def gallery_tree(index: str) -> list:
    """The index's gallery as [(pair, [(notebook, [heading hrefs], [(img src, caption text)])])]."""
    from html.parser import HTMLParser

    class Gallery(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tree, self.where, self.text = [], None, None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "section" and a.get("class") == "pair":
                self.tree.append((a["data-pair"], []))
            elif tag == "section" and a.get("class") == "notebook":
                self.tree[-1][1].append((a["data-notebook"], [], []))
            elif tag == "h4":
                self.where = "h4"
            elif tag == "a" and self.where == "h4":
                self.tree[-1][1][-1][1].append(a["href"])
            elif tag == "img" and self.tree:
                self.tree[-1][1][-1][2].append([a["src"], ""])
            elif tag == "figcaption":
                self.where = "caption"

        def handle_endtag(self, tag):
            if tag in ("h4", "figcaption"):
                self.where = None

        def handle_data(self, data):
            if self.where == "caption":
                self.tree[-1][1][-1][2][-1][1] += data

    parser = Gallery()
    parser.feed(index)
    return [(p, [(nb, hrefs, [tuple(f) for f in figs]) for nb, hrefs, figs in nbs]) for p, nbs in parser.tree]


def test_a_run_without_speedups_is_still_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path / "runs")
    monkeypatch.setattr(paths, "FIGURES_DIR", tmp_path / "figures")
    folder = tmp_path / "nb"
    folder.mkdir()
    nbformat.write(notebook("tiny", [], png_bytes()), folder / "02_m2_acceptance_math.ipynb")
    assert report.main([str(folder), "--no-html"]) == 0
    s = json.loads((folder / "summary.json").read_text())
    assert s["configurations"] == [] and "no traces" in s["errors"][0] and s["notebooks"][0]["seconds"] == 12.5
    assert "(no speedups)" in capsys.readouterr().out and not (folder / "report").exists()
    assert report.main([str(tmp_path / "missing")]) == 1


def readme_copy(tmp_path) -> Path:
    readme = tmp_path / "repo" / "README.md"
    readme.parent.mkdir()
    shutil.copyfile(REPO / "README.md", readme)
    return readme


def test_readme_block(run, tmp_path):
    report.write_report(run, quiet=True)
    readme = readme_copy(tmp_path)
    before = readme.read_text()
    assert before.count(report.RESULTS_BEGIN) == 1 and before.count(report.RESULTS_END) == 1
    assert report.main(["readme", str(run), "--readme", str(readme)]) == 0
    after = readme.read_text()
    head, tail = before.split(report.RESULTS_BEGIN)[0], before.split(report.RESULTS_END)[1]
    assert after.startswith(head) and after.endswith(tail)
    block = after.split(report.RESULTS_BEGIN)[1].split(report.RESULTS_END)[0]
    assert "`spade-ngram-g4`, 2.55× [2.31, 2.80] over autoregressive" in block
    assert "0.54× [0.50, 0.60] of plain HF generate" in block
    assert ("`spade-ngram-g4`, 1.32× [1.20, 1.45] over autoregressive decoding (1.50× [1.40, 1.60] in the decode "
            "phase, both sides' prompt prefills out)") in block
    assert "the `distilled` draft at T = 0 (alpha 0.12–0.13) is faster than autoregressive beyond its interval " \
           "at 0 of 2 draft lengths and slower at 2" in block
    assert "commit `0123456`" in block and "Test CPU 9000" in block and "tiny" not in block
    assert "5 physical-control warnings and 2 runs whose measured interval excludes the cost-model prediction" in block
    assert "| `spade-ngram-g4` | 0.40 | 2.55× [2.31, 2.80] | 0.30 | 1.32× [1.20, 1.45] |" in block
    assert (readme.parent / "figures" / "teaser.png").read_bytes() == png_bytes()
    assert report.main(["readme", str(run), "--readme", str(readme)]) == 0 and readme.read_text() == after  # stable
    readme.write_text("no markers\n")
    assert report.main(["readme", str(run), "--readme", str(readme)]) == 1 and readme.read_text() == "no markers\n"


def test_readme_block_sentences_count_draft_lengths_not_variants():
    """A draft's sentence counts its draft lengths: two rules at one length are two variants, no sweep; a span
    of alphas that rounds to one value is printed once."""
    def row(cfg, draft, gamma, alpha, speedup, low, high):
        return {"pair": "smollm2", "suite": "humaneval-x", "T": 0.0, "role": "speculative", "method": "spade",
                "configuration": cfg, "draft": draft, "gamma": gamma, "alpha": alpha, "alpha_low": None,
                "alpha_high": None, "speedup": speedup, "speedup_low": low, "speedup_high": high}

    rows = [row("spade-embedded-g4-rule=text", "embedded", 4, 0.061, 0.75, 0.71, 0.80),
            row("spade-embedded-g4-rule=tli", "embedded", 4, 0.058, 0.77, 0.74, 0.80),
            row("spade-distilled-g2", "distilled", 2, 0.2, 0.9, 0.85, 0.95),
            row("spade-distilled-g4", "distilled", 4, 0.2, 1.1, 1.02, 1.2)]
    summary = {"configurations": rows, "machine": {"cpu_model": "Test CPU"}, "run": {"commit": "0123456789"},
               "controls": [], "warnings": [], "run_dir": "runs/notebooks/x", "generated": "2026-12-05T00:00"}
    block = report.readme_block(summary)
    assert "the `distilled` draft at T = 0 (alpha 0.20) is faster than autoregressive beyond its interval at 1 of " \
           "2 draft lengths and slower at 1" in block
    assert "`embedded` draft" not in block  # one length (4) under two rules: no sweep to summarise


def test_configurations_on_degenerate_text_make_no_claim():
    """Issue 56: a configuration whose generations are mostly loops (``degenerate`` > 0.5) shows no alpha, tau
    or speedup in the summary table or the README block, and the block says why; its pair's coherent
    temperature keeps its numbers."""
    def row(T, degenerate, speedup, role="speculative"):
        return {"pair": "smollm2", "suite": "s", "T": T, "role": role, "method": "spade", "control": False,
                "configuration": "spade-d-g4", "draft": "d", "gamma": 4, "alpha": 0.9, "alpha_low": 0.8,
                "alpha_high": 0.95, "tau": 3.0, "tau_low": 2.5, "tau_high": 3.5, "speedup": speedup,
                "speedup_low": speedup - 0.1, "speedup_high": speedup + 0.1, "predicted": 1.2, "warnings": [],
                "degenerate": degenerate}

    rows = [row(0.0, 0.9, 1.43), row(1.0, 0.0, 1.07), dict(row(0.0, 0.9, 1.0), role="baseline", speedup=None)]
    summary = {"configurations": rows, "machine": {"cpu_model": "Test CPU"}, "run": {"commit": "0123456789"},
               "controls": [], "warnings": [], "run_dir": "runs/notebooks/x", "generated": "2026-12-05T00:00"}
    table = report.table_rows(summary)
    assert [t["speedup"] for t in table] == [report.NOT_CLAIMED, "1.07x [0.97, 1.17]"]
    assert table[0]["alpha"] == table[0]["tau"] == report.NOT_CLAIMED and "90% of generations" in table[0]["note"]
    assert table[0]["decode phase"] == table[0]["predicted (decode)"] == report.NOT_CLAIMED
    block = report.readme_block(summary)
    assert "1.43" not in block and "1.07" in block
    assert "at T = 0 the generations are loops" in block and "fastest configuration is `spade-d-g4`, 1.07" in block
    assert report.claimed({"degenerate": None}) and report.claimed({"degenerate": 0.5})
    assert not report.claimed({"degenerate": 0.51})


def test_a_warning_the_summary_found_and_a_notebook_printed_counts_once():
    w = ["cost-model control: smollm2/spade-ngram-g4-T0 on humaneval-1 at T=0: measured 1.2x excludes 1.4x",
         "cost-model control: default/spade-ngram-g4-T0 on embedded-1 at T=0: measured 1.5x excludes 1.7x",
         "cost-model control: spade-ngram-g4-T0 at T=0: measured 1.2x excludes 1.41x (printed by smollm2/03_m2_x)",
         "physical control: printed by the notebook itself (printed by smollm2/03_m2_x)"]
    assert report._pair_warnings(w, "smollm2") == [w[0], w[3]]
    assert report._pair_warnings(w, "default") == [w[1]]
    assert report._warning_key(w[0]) == report._warning_key(w[2]) == (
        "cost-model control", "smollm2", "spade-ngram-g4-T0")
    assert report._warning_key(w[3]) == ("physical control", "smollm2", "printed by the notebook itself")
    other = "physical control: printed by another notebook (printed by smollm2/04_m3_x)"
    assert report._warning_key(other) != report._warning_key(w[3])  # another check, not a copy


def fake_papermill(input_path, output_path, **kw):
    nb = nbformat.read(input_path, as_version=4)
    nbformat.write(nb, output_path)


def test_runbook_record_and_report(tmp_path, monkeypatch, capsys):
    import papermill

    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path / "runs")
    monkeypatch.setattr(paths, "FIGURES_DIR", tmp_path / "figures")
    monkeypatch.setattr(papermill, "execute_notebook", fake_papermill)
    monkeypatch.delenv("SPADE_PROFILE", raising=False)
    out = tmp_path / "out"
    runbook.main(["--only", "01", "02", "--out", str(out)])
    record = json.loads((out / "runbook.json").read_text())
    assert [n["name"] for n in record["notebooks"]] == ["01_m1_build_benchmark", "02_m2_acceptance_math"]
    assert all(n["status"] == "ok" and n["seconds"] >= 0 for n in record["notebooks"]) and record["status"] == "ok"
    assert record["profile"] == "default" and record["only"] == ["01", "02"] and record["finished"]
    assert record["machine"]["threads"] >= 1 and "commit" in record
    assert (out / "summary.json").is_file() and 'href="02_m2_acceptance_math.html"' in (
        out / "report" / "index.html").read_text()
    assert 'href="index.html"' in (out / "report" / "02_m2_acceptance_math.html").read_text()
    assert "HTML report:" in capsys.readouterr().out

    def boom(*a, **k):
        raise RuntimeError("reporting broke")

    monkeypatch.setattr(report, "write_report", boom)
    runbook.main(["--only", "02", "--out", str(tmp_path / "again")])  # the notebooks ran: no exception
    err = capsys.readouterr().err
    assert "REPORT FAILED" in err and "reporting broke" in err and "python -m spade_lib.report" in err
    runbook.main(["--only", "02", "--out", str(tmp_path / "quiet"), "--no-report"])
    assert not (tmp_path / "quiet" / "summary.json").exists()


def test_runbook_builds_the_pairs_first_and_the_summary_counts_them(tmp_path, monkeypatch, capsys):
    import subprocess

    import papermill

    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path / "runs")
    monkeypatch.setattr(paths, "FIGURES_DIR", tmp_path / "figures")
    order = []
    monkeypatch.setattr(papermill, "execute_notebook", lambda i, o, **kw: order.append(Path(i).stem) or fake_papermill(i, o))
    monkeypatch.delenv("SPADE_PROFILE", raising=False)

    real_run = subprocess.run

    def fake_build(cmd, **kw):
        if cmd[:3] != [sys.executable, "-m", "spade_lib.zoo"]:
            return real_run(cmd, **kw)  # git and the like
        order.append(f"build {cmd[-1]}")
        time.sleep(0.05)
        return subprocess.CompletedProcess(cmd, 0 if cmd[-1] == "tiny" else 3)

    monkeypatch.setattr(subprocess, "run", fake_build)
    out = tmp_path / "out"
    runbook.main(["--only", "02", "--build", "tiny", "--out", str(out)])
    record = json.loads((out / "runbook.json").read_text())
    assert order == ["build tiny", "02_m2_acceptance_math"]  # the build first, alone
    assert [(b["name"], b["status"]) for b in record["builds"]] == [("tiny", "ok")] and record["builds"][0]["seconds"] >= 0.05
    s = json.loads((out / "summary.json").read_text())
    assert s["builds"][0]["name"] == "tiny"
    assert s["run"]["seconds"] == pytest.approx(record["builds"][0]["seconds"] + record["notebooks"][0]["seconds"])
    with pytest.raises(SystemExit):  # a failed build stops the run before any notebook
        runbook.main(["--only", "02", "--build", "smollm2", "--out", str(tmp_path / "failed"), "--no-report"])
    assert order[-1] == "build smollm2"
    assert json.loads((tmp_path / "failed" / "runbook.json").read_text())["status"] == "failed"
    with pytest.raises(SystemExit):  # an unknown pair: refused before anything runs
        runbook.main(["--only", "02", "--build", "no_such_pair", "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()
