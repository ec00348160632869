"""The results of a run on one page: ``summary.md``, ``summary.json`` and an HTML report.

``python -m spade_lib.report RUN_DIR [RUN_DIR ...]`` reads executed notebooks (the runbook's ``runs/notebooks/<stamp>/``
or ``make run``'s ``<stamp>/<part>/``) and writes, in the first run folder only, ``summary.json``, ``summary.md`` and
``report/index.html`` (notebooks as HTML ``report/[<part>/]NN_name.html``, the table, the gallery, figures copied to
``report/figures/``), from :func:`spade_lib.runs.compare.speedups` of ``SPADE_RUNS_DIR`` (``runs/``) over the runs the
notebooks print (``label -> traces/<pair>/<suite>/<run>``; else all). ``python -m spade_lib.report readme RUN_DIR``
rewrites README's ``<!-- results:begin -->`` .. ``<!-- results:end -->`` block and copies the headline pair's
``m2_speedup_runs-<pair>.png`` to ``figures/teaser.png``. ``summary.json``'s schema (``spade.summary/1``) and what
each field means: ``docs/features.md``, "The run summary". ``warnings``: the physical and two-sided cost-model
controls of :mod:`spade_lib.runs.controls` (and notebook lines starting ``physical control:``), and every
printed verdict without a measured interval (:mod:`spade_lib.runs.verdicts`).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import platform
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spade_lib import paths
from spade_lib.io import write_bytes, write_json, write_text

__all__ = ["RESULTS_BEGIN", "RESULTS_END", "SCHEMA", "machine_info", "main", "readme_block",
           "summarize", "update_readme", "write_html", "write_report"]

SCHEMA = "spade.summary/1"
RUNBOOK_RECORD = "runbook.json"
RESULTS_BEGIN = "<!-- results:begin -->"
RESULTS_END = "<!-- results:end -->"
TEASER = "m2_speedup_runs-{pair}"  # the teaser figure's stem, {pair} the block's pair
REPORT_DIR = "report"
COLUMNS = ["pair", "suite", "run", "baseline", "label", "method", "draft", "policy", "gamma", "T", "tokens_per_s",
           "alpha", "alpha_low", "alpha_high", "tau", "tau_low", "tau_high", "speedup", "speedup_low",
           "speedup_high", "predicted", "speedup_decode", "speedup_decode_low", "speedup_decode_high",
           "predicted_steady", "r", "overhead", "r_source", "loop_level", "stalls", "costs_file", "vs_hf",
           "vs_hf_low", "vs_hf_high", "repetition", "degenerate"]
METHOD_ORDER = {"ar": 0, "hf": 1, "spade": 2, "hf_assisted": 3}
_RUN_REF = re.compile(r"traces/([^/\s'\"]+)/([^/\s'\"]+)/([^/\s'\"]+)")
_PER_PAIR_FIGURE = re.compile(r"""figure_name\(\s*["'](m\d_\w+)["']""")  # E.figure_name("m2_x"[, pair])
_PLAIN_FIGURE = re.compile(r"""save_figure\(\s*[^,()]+,\s*["'](m\d_\w+)["']""")  # save_figure(fig, "m2_x")


# ---------------------------------------------------------------------------------- the machine, the commit

def machine_info() -> dict[str, Any]:
    """CPU (:meth:`spade_lib.devices.CpuInfo.label`: model, family/model, AVX-512, L3), CPU count, torch's intra-op thread
    count, torch, Python and platform."""
    import torch

    from spade_lib.devices import cpu

    return {"cpu_model": cpu().label(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform()}


def _git_commit() -> dict[str, Any]:
    from spade_lib.runs.timing import git_commit

    return git_commit()


# ---------------------------------------------------------------------------------- reading a run folder

def _notebooks(folder: Path) -> list[Path]:
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))


def _parts(run_dirs: list[Path]) -> list[tuple[str, Path]]:
    """(name, folder) of every folder of executed notebooks: a run folder itself, or its subfolders."""
    out = []
    for d in run_dirs:
        if not d.is_dir():
            raise FileNotFoundError(f"run_dir: no such folder {d}")
        found = [(d.name if len(run_dirs) > 1 else "", d)] if _notebooks(d) else [
            (f"{d.name}/{s.name}" if len(run_dirs) > 1 else s.name, s)
            for s in sorted(p for p in d.iterdir() if p.is_dir() and p.name != REPORT_DIR) if _notebooks(s)]
        if not found:
            raise FileNotFoundError(f"run_dir: no executed notebooks (NN_*.ipynb) in {d} or its subfolders")
        out.extend(found)
    return out


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _outputs_text(nb) -> str:
    """Every text output of a notebook (streams, plain-text results and errors), joined."""
    chunks = []
    for cell in nb.cells:
        for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if o.get("output_type") == "stream":
                chunks.append(o.get("text", ""))
            elif o.get("output_type") == "error":
                chunks.append(f"{o.get('ename')}: {o.get('evalue')}")
            else:
                chunks.append(o.get("data", {}).get("text/plain", ""))
    return "\n".join(c if isinstance(c, str) else "".join(c) for c in chunks)


def _relative(path: Path, root: Path = paths.REPO_ROOT) -> str:
    """``path`` relative to ``root``; a path under another checkout's ``runs/`` (a fresh clone's run read
    from here) from its ``runs/`` folder on, so no machine's absolute path reaches a summary or README."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(root))
    except ValueError:
        parts = p.parts
        return str(Path(*parts[parts.index("runs"):])) if "runs" in parts else str(p)


def _num(x) -> float | None:
    """A JSON number, or None for missing and NaN."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _plain(x):
    """numpy/pandas scalars as plain Python (NaN as None) for JSON."""
    if isinstance(x, (bool, str)) or x is None:
        return x
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    return x


def _role(method: str, draft: str) -> str:
    from spade_lib.runs.controls import NULL_DRAFT

    if method == "ar":
        return "baseline"
    if method == "hf":
        return "hf"
    return "control" if draft == NULL_DRAFT else "speculative"


def _configurations(runs_dir: Path, referenced: dict[tuple[str, str, str], dict[str, None]],
                    errors: list[str]) -> tuple[list, str]:
    """Rows of :func:`spade_lib.runs.compare.speedups` (the referenced runs, else all), as JSON dicts,
    pairs in the order the notebooks name them."""
    from spade_lib.runs import compare, controls

    try:
        table = compare.speedups(runs_dir)
    except FileNotFoundError as e:
        errors.append(f"no speedups: {e}")
        return [], "none"
    selection = "all"
    if referenced:
        keep = [(p, s, r) in referenced for p, s, r in zip(table["pair"], table["suite"], table["run"])]
        if any(keep):
            table, selection = table[keep], "referenced"
    table = table.reindex(columns=COLUMNS)
    rows = []
    for rec in table.to_dict("records"):
        row = {k: _plain(v) for k, v in rec.items()}
        row["gamma"] = int(row["gamma"]) if row.get("gamma") is not None else None
        row["run_label"] = row["label"]
        row["role"] = _role(row["method"], row["draft"])
        row["control"] = row["role"] == "control"
        row["notebooks"] = list(referenced.get((row["pair"], row["suite"], row["run"])) or [])
        rows.append(row)
    _unique_labels(rows, runs_dir)
    repetition: dict[Path, tuple] = {}
    for row in rows:
        folder = runs_dir / "traces" / str(row["pair"]).replace("/", "--") / str(row["suite"]) / str(row["run"])
        if folder not in repetition:
            repetition[folder] = _repetition(folder, errors)
        row["repetition"], row["degenerate"] = repetition[folder]
    for row, rec in zip(rows, table.to_dict("records")):
        row["configuration"] = re.sub(r"-T[^-]*$", "", str(row["run_label"])) + str(row["label"])[len(str(row["run_label"])):]
        row["warnings"] = controls.speedup_warnings([{**rec, "label": row["label"]}])
    order = {p: i for i, p in enumerate(dict.fromkeys(p for p, _, _ in referenced))}
    rows.sort(key=lambda r: (order.get(r["pair"], len(order)), r["pair"], r["suite"], r["T"], METHOD_ORDER.get(r["method"], 9), r["draft"] or "",
                             r["gamma"] or 0, r["label"], r["baseline"]))
    return rows, selection


def _repetition(run_folder: Path, errors: list[str]) -> tuple[float | None, float | None]:
    """(mean 4-gram repetition, share of degenerate generations) of a run's ``summary.jsonl``
    (:func:`spade_lib.diagnose.repetition.repetition_by_generation`); ``(None, None)`` without one."""
    from spade_lib.diagnose.repetition import repetition_by_generation
    from spade_lib.runs.store import read_summary

    if not (run_folder / "summary.jsonl").is_file():
        return None, None
    try:
        g = repetition_by_generation(read_summary(run_folder))
    except (OSError, ValueError) as e:
        errors.append(f"{_relative(run_folder)}: no repetition rate ({e})")
        return None, None
    judged = g["repetition"].notna()
    if not judged.any():
        return None, None
    return _num(g.loc[judged, "repetition"].mean()), _num(g.loc[judged, "degenerate"].mean())


def _unique_labels(rows: list[dict], runs_dir: Path) -> None:
    """Give every row of a pair a label no other row of that pair has (two runs of one configuration
    label, e.g. notebook 03's and 05's ``spade-distilled-g12-T1`` over other prompts or lengths): a
    label shared by several rows gets, in brackets, what tells them apart -- the run settings that
    differ (from each run's ``metadata.json``: config fields, the number of prompts), else the suite,
    else the baseline, else the run folder's hash."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["pair"], r["label"]), []).append(r)
    for (pair, label), group in groups.items():
        if len(group) < 2:
            continue
        facts = []
        for r in group:
            meta = _read_json(runs_dir / "traces" / str(pair).replace("/", "--") / str(r["suite"]) / str(r["run"])
                              / "metadata.json")
            f = {k: v for k, v in (meta.get("config") or {}).items() if k not in ("warmup", "repeats")}
            if isinstance(meta.get("suite"), dict) and "n_prompts" in meta["suite"]:
                f["prompts"] = meta["suite"]["n_prompts"]
            facts.append(f)
        keys = sorted({k for f in facts for k in f if len({json.dumps(g.get(k), sort_keys=True) for g in facts}) > 1})
        for r, f in zip(group, facts):
            if keys:
                tag = ", ".join(f"{k}={f.get(k)}" for k in keys[:3])
            elif len({x["suite"] for x in group}) > 1:
                tag = f"suite {r['suite']}"
            elif len({x["baseline"] for x in group}) > 1:
                tag = f"vs {r['baseline']}"
            else:
                tag = f"run {str(r['run']).rsplit('-', 1)[-1]}"
            r["label"] = f"{label} [{tag}]"
        if len({r["label"] for r in group}) < len(group):  # still shared: the run folders tell them apart
            for r in group:
                r["label"] = f"{r['label'][:-1]}; run {str(r['run']).rsplit('-', 1)[-1]}]"


def _cost_entry(t: dict, f: Path, runs_dir: Path, used: bool) -> dict:
    return {"c": _num(t.get("c")), "r": {int(g): _num(v) for g, v in sorted(t["r"].items())},
            "overhead": _num(t.get("overhead")), "threads": t["key"].get("threads"), "device": t["key"].get("device"),
            "dtype": t["key"].get("dtype"), "file": _relative(f, runs_dir), "used": used}


def _costs(runs_dir: Path, rows: list[dict], errors: list[str]) -> dict[str, dict]:
    """The cost tables per pair and draft: those that priced the rows' predictions (``costs_file`` of
    :func:`spade_lib.runs.compare.speedups`, ``used``), and for a pair whose rows name none, the newest
    per draft under ``runs/costs/<pair>/`` (:func:`spade_lib.runs.costs.select_costs`, ``used`` False)."""
    from spade_lib.runs.costs import read_costs, select_costs

    out: dict[str, dict] = {}
    for pair in dict.fromkeys(r["pair"] for r in rows):
        files = list(dict.fromkeys(r["costs_file"] for r in rows if r["pair"] == pair and r.get("costs_file")))
        entries: dict[str, dict] = {}
        for name in files:
            f = Path(name)
            try:
                t = read_costs(f)
                draft = t["key"]["draft"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                errors.append(f"cost table {f}: unreadable ({e})")
                continue
            key = draft if draft not in entries else f"{draft} [{f.stem}]"
            entries[key] = _cost_entry(t, f, runs_dir, True)
        if not files:
            for draft, t in select_costs(runs_dir / "costs" / str(pair).replace("/", "--")).items():
                entries[draft] = _cost_entry(t, Path(t["file"]), runs_dir, False)
        if entries:
            out[pair] = dict(sorted(entries.items()))
    return out


def _figures(parts_meta: list[dict], notebooks_started: list[float], figures_dir: Path) -> list[Path]:
    """PNG figures written since the run started (all of them when the start is unknown)."""
    starts = [datetime.fromisoformat(p["started"]).timestamp() for p in parts_meta if p.get("started")]
    starts = starts or notebooks_started
    since = min(starts) - 5 if starts else -math.inf
    return [f for f in sorted(figures_dir.glob("*.png")) if f.name != "teaser.png" and f.stat().st_mtime >= since]


def _saved_figures(nb) -> dict[str, tuple[bool, str]]:
    """Figure base name -> (saved per pair, the markdown cell before the saving cell) for every figure the
    code of notebook ``nb`` saves, in the order it saves them."""
    out: dict[str, tuple[bool, str]] = {}
    markdown = ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            markdown = cell.source
        elif cell.cell_type == "code" and "save_figure" in cell.source:
            for per_pair, pattern in ((True, _PER_PAIR_FIGURE), (False, _PLAIN_FIGURE)):
                for m in pattern.finditer(cell.source):
                    out.setdefault(m.group(1), (per_pair, markdown))
    return out


def _first_sentence(markdown: str) -> str:
    """The first sentence of the first paragraph of ``markdown`` that is not a heading, as plain text."""
    for para in re.split(r"\n\s*\n", markdown or ""):
        text = " ".join(line.strip() for line in para.splitlines() if not line.lstrip().startswith("#")).strip()
        if text:
            text = re.sub(r"[*`_]{1,2}(\S[^*`]*?)[*`_]{1,2}", r"\1", text)
            return re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    return ""


def _gallery(figures: list[Path], saved: dict[str, dict[str, tuple[bool, str]]]) -> list[dict]:
    """The gallery entries of the module docstring for ``figures``, given what each notebook saves
    (``saved``: notebook stem -> :func:`_saved_figures`), sorted by pair, notebook and saving order."""
    from spade_lib.plots.captions import caption

    bases: dict[str, tuple[str, int, bool, str]] = {}
    for nb_name in sorted(saved):
        for i, (base, (per_pair, markdown)) in enumerate(saved[nb_name].items()):
            bases.setdefault(base, (nb_name, i, per_pair, markdown))
    entries = []
    for f in figures:
        stem = Path(f).stem
        base = max((b for b in bases if stem == b or stem.startswith(b + "-")), key=len, default=None)
        if base is not None:
            nb_name, order, per_pair, markdown = bases[base]
            pair = stem[len(base) + 1:] or ("default" if per_pair else None)
        else:
            nb_name, order, markdown = None, 0, ""
            base, _, suffix = stem.partition("-")
            pair = suffix or None
        entries.append({"figure": str(f), "name": stem, "pair": pair, "notebook": nb_name,
                        "caption": caption(stem) or _first_sentence(markdown) or "", "_order": order})
    pairs = list(dict.fromkeys(sorted((e["pair"] for e in entries if e["pair"] is not None),
                                      key=lambda p: (p != "default", p))))
    entries.sort(key=lambda e: (pairs.index(e["pair"]) if e["pair"] is not None else len(pairs),
                                e["notebook"] is None, e["notebook"] or "", e.pop("_order"), e["name"]))
    return entries


def summarize(run_dirs, *, runs_dir: str | Path | None = None,
              figures_dir: str | Path | None = None) -> dict[str, Any]:
    """The summary of one run (a list of folders is one run: their notebooks are reported together) as
    the ``summary.json`` object of the module docstring, without writing anything. The ``figures``
    entry holds absolute paths of the source figures here; :func:`write_report` rewrites it."""
    import nbformat

    from spade_lib.runs import controls, verdicts

    run_dirs = [Path(d) for d in ([run_dirs] if isinstance(run_dirs, (str, os.PathLike)) else run_dirs)]
    runs_dir = Path(runs_dir) if runs_dir is not None else paths.RUNS_DIR
    figures_dir = Path(figures_dir) if figures_dir is not None else paths.FIGURES_DIR
    errors: list[str] = []
    parts_meta, notebooks, referenced, nb_warnings, nb_started, builds = [], [], {}, [], [], []
    saved: dict[str, dict[str, tuple[bool, str]]] = {}  # notebook stem -> the figures its code saves
    for name, folder in _parts(run_dirs):
        record = _read_json(folder / RUNBOOK_RECORD)
        builds += [{"part": name, "name": str(b.get("name")), "seconds": _num(b.get("seconds")),
                    "status": b.get("status") or "?"} for b in record.get("builds") or [] if isinstance(b, dict)]
        seconds = {n.get("name"): n for n in record.get("notebooks", []) if isinstance(n, dict)}
        parts_meta.append({"name": name, "folder": _relative(folder, run_dirs[0].resolve()),
                           **{k: record.get(k) for k in ("profile", "params", "only", "status", "started",
                                                         "finished", "seconds", "commit", "dirty")},
                           "machine": record.get("machine")})
        for path in _notebooks(folder):
            try:
                nb = nbformat.read(path, as_version=4)
            except Exception as e:  # a notebook cut short by a crash: name it, report the rest
                errors.append(f"{path}: unreadable notebook ({e})")
                continue
            pm = nb.metadata.get("papermill", {}) or {}
            entry = seconds.get(path.stem, {})
            secs = entry.get("seconds", pm.get("duration"))
            status = entry.get("status") or ("failed" if pm.get("exception") else "ok")
            if pm.get("start_time"):
                try:
                    nb_started.append(datetime.fromisoformat(pm["start_time"]).timestamp())
                except ValueError:
                    pass
            for base, how in _saved_figures(nb).items():
                saved.setdefault(path.stem, {}).setdefault(base, how)
            text = _outputs_text(nb)
            for ref in _RUN_REF.findall(text):
                referenced.setdefault(ref, {})[f"{name + '/' if name else ''}{path.stem}"] = None
            for line in text.splitlines():
                # a warning is "physical control: ..." or "cost-model control: ..." (a notebook may mark it, e.g.
                # "!!! physical control: ..."); a tally such as "physical controls: 0 violation(s)" is not one
                warning = line.strip().lstrip("!").strip()
                if warning.startswith((controls.PREFIX + ":", controls.MODEL_PREFIX + ":")):
                    nb_warnings.append(f"{warning} (printed by {name + '/' if name else ''}{path.stem})")
            # a printed verdict ("beats", "flat", "worth timing", ...) needs a measured interval on its line
            nb_warnings += verdicts.warnings(text, f"{name + '/' if name else ''}{path.stem}")
            html_name = f"{REPORT_DIR}/{name + '/' if name else ''}{path.stem}.html"
            notebooks.append({"part": name, "name": path.stem, "file": _relative(path, run_dirs[0].resolve()),
                              "seconds": _num(secs), "status": status, "html": html_name,
                              "pair": (pm.get("parameters") or {}).get("pair")})

    rows, selection = _configurations(runs_dir, referenced, errors)
    costs = _costs(runs_dir, rows, errors)
    warnings = [w for r in rows for w in r["warnings"]]
    for pair, by_draft in costs.items():
        warnings += controls.cost_warnings(by_draft, pair=pair)
    seen = {_warning_key(w) for w in warnings}  # a notebook's printed copy of a check listed above counts once
    for w in nb_warnings:
        key = _warning_key(w)
        if key not in seen:
            seen.add(key)
            warnings.append(w)
    # passed: the physics (<= 1x); matches_prediction: the cost model's prediction (1 / (r(g) + o) per decode
    # step, the prompts' prefills added as measured) inside the interval
    control_rows = [{k: r.get(k) for k in ("pair", "suite", "label", "T", "speedup", "speedup_low", "speedup_high",
                                            "predicted")}
                    | {"passed": not any(w.startswith(controls.PREFIX + ":") for w in r["warnings"]),
                       "matches_prediction": None if r.get("predicted") is None else
                       not any(w.startswith(controls.MODEL_PREFIX + ":") for w in r["warnings"])}
                    for r in rows if r["control"]]

    started = [p["started"] for p in parts_meta if p.get("started")]
    finished = [p["finished"] for p in parts_meta if p.get("finished")]
    first = next((p for p in parts_meta if p.get("commit")), None)
    commit = ({"commit": first["commit"], "dirty": first.get("dirty")} if first else _git_commit())
    machine = next((p["machine"] for p in parts_meta if p.get("machine")), None) or machine_info()
    secs = [n["seconds"] for n in notebooks + builds if n["seconds"] is not None]  # the pair builds count too
    for p in parts_meta:
        p.pop("machine")
    figures = _figures(parts_meta, nb_started, figures_dir)
    return {
        "schema": SCHEMA,
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "run_dir": _relative(run_dirs[0]),
        "runs_dir": _relative(runs_dir),
        "selection": selection,
        "run": {**commit, "started": min(started) if started else None, "finished": max(finished) if finished else None,
                "seconds": sum(secs) if secs else None, "parts": parts_meta},
        "machine": machine,
        "notebooks": notebooks,
        "builds": builds,
        "configurations": rows,
        "controls": control_rows,
        "costs": costs,
        "warnings": warnings,
        "figures": [str(f) for f in figures],
        "gallery": _gallery(figures, saved),
        "report": f"{REPORT_DIR}/index.html",
        "errors": errors,
    }


# ---------------------------------------------------------------------------------- rendering

def _fmt(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _with_interval(row: dict, key: str, digits: int = 2, suffix: str = "") -> str:
    v, lo, hi = row.get(key), row.get(f"{key}_low"), row.get(f"{key}_high")
    if v is None:
        return "–"
    s = f"{v:.{digits}f}{suffix}"
    return s + (f" [{lo:.{digits}f}, {hi:.{digits}f}]" if lo is not None and hi is not None else "")


def _note(row: dict) -> str:
    notes = []
    if row["control"]:
        notes.append("control (null draft: always rejected, must be <= 1x)")
    if row["method"] == "hf":
        notes.append("plain HF generate")
    if row["method"] == "hf_assisted" and row.get("vs_hf") is not None:
        notes.append(f"{_with_interval(row, 'vs_hf', suffix='x')} vs HF generate")
    if row["warnings"]:
        notes.append("WARNING: see below")
    return "; ".join(notes)


DEGENERATE_SHARE = 0.5  # a configuration whose generations are more than this share loops makes no claim
NOT_CLAIMED = "not claimed"


def claimed(row: dict) -> bool:
    """Whether a configuration's alpha, tau and speedup are results: not when more than
    :data:`DEGENERATE_SHARE` of its generations are loops (``degenerate``: draft and target agree on a loop, so
    the acceptance and the speedup measure the loop, not the pair). Unknown (``None``) counts as claimed."""
    share = row.get("degenerate")
    return share is None or share <= DEGENERATE_SHARE


def table_rows(summary: dict) -> list[dict[str, str]]:
    """The summary table as strings: one row per non-baseline configuration and temperature; a configuration
    on degenerate text (:func:`claimed`) shows :data:`NOT_CLAIMED` and why instead of its numbers."""
    out = []
    for r in summary["configurations"]:
        if r["role"] == "baseline":
            continue
        row = {"pair": r["pair"], "suite": r["suite"], "configuration": r["configuration"], "T": f"{r['T']:g}",
               "alpha": _with_interval(r, "alpha"), "tau": _with_interval(r, "tau"),
               "speedup": _with_interval(r, "speedup", suffix="x"), "predicted": _fmt(r.get("predicted")),
               "decode phase": _with_interval(r, "speedup_decode", suffix="x"),
               "predicted (decode)": _fmt(r.get("predicted_steady")), "note": _note(r)}
        if not claimed(r):
            row.update({k: NOT_CLAIMED for k in ("alpha", "tau", "speedup", "predicted", "decode phase",
                                                 "predicted (decode)")},
                       note=f"degenerate text: {r['degenerate']:.0%} of generations are loops")
        out.append(row)
    return out


def _run_line(summary: dict) -> str:
    run, m = summary["run"], summary["machine"] or {}
    commit = (run.get("commit") or "unknown")[:12] + (" (uncommitted changes)" if run.get("dirty") else "")
    when = run.get("started") or summary["generated"]
    return (f"commit {commit}, started {when}; machine: {m.get('cpu_model')} ({m.get('cpu_count')} CPUs, "
            f"{m.get('threads')} torch threads), torch {m.get('torch')}, Python {m.get('python')}")


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    esc = [[c.replace("|", "\\|") for c in r] for r in rows]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |",
            *("| " + " | ".join(r) + " |" for r in esc)]


COST_HEADER = ["pair", "draft", "c", "r(g)", "loop overhead o", "threads", "file"]
# the speedup table of summary.md and the HTML report (keys of table_rows)
SUMMARY_HEADER = ["pair", "suite", "configuration", "T", "alpha", "tau", "speedup", "predicted", "decode phase",
                  "predicted (decode)", "note"]


def _cost_lines(summary: dict) -> list[list[str]]:
    out = []
    for pair, by_draft in summary["costs"].items():
        for draft, t in by_draft.items():
            r = {int(g): v for g, v in t["r"].items()}
            out.append([pair, draft, _fmt(t["c"], 3),
                        " ".join(f"{_fmt(v)}" for v in r.values()) + (f" (g = 1..{max(r)})" if r else ""),
                        _fmt(t.get("overhead"), 3), str(t.get("threads")),
                        str(t.get("file")) + ("" if t.get("used", True) else " (no prediction used it)")])
    return out


def _notebook_lines(summary: dict) -> list[list[str]]:
    builds = [[(b["part"] + "/" if b["part"] else "") + f"build {b['name']}", _fmt(b["seconds"], 0), b["status"]]
              for b in summary.get("builds") or []]
    return builds + [[(n["part"] + "/" if n["part"] else "") + n["name"], _fmt(n["seconds"], 0), n["status"]]
                     for n in summary["notebooks"]]


def render_markdown(summary: dict) -> str:
    """``summary.md``."""
    lines = [f"# SPADE run summary: `{summary['run_dir']}`", "", _run_line(summary) + ".", ""]
    lines += ["## Speedup over autoregressive decoding", "",
              "Per pair, configuration and temperature: alpha, tau and the speedup over the autoregressive run "
              "of the same interleaved session (ratio of totals), with 95 % bootstrap intervals where measured; "
              "`predicted` from the measured alpha, c and r(g); `decode phase`: the same ratio with each side's "
              "prompt prefill taken out (the speculative side's holds its draft's too), against the cost model per "
              "decode step, `predicted (decode)`. "
              + ("Runs: those the executed notebooks name." if summary["selection"] == "referenced" else
                 f"Runs: every finished run under `{summary['runs_dir']}`."), ""]
    rows = table_rows(summary)
    if rows:
        header = SUMMARY_HEADER
        lines += _md_table(header, [[r[h] for h in header] for r in rows])
    else:
        lines.append("No speedups: no finished run with an autoregressive baseline.")
    looped = [r for r in summary["configurations"] if r["role"] == "baseline" and r.get("repetition") is not None]
    if looped:
        lines += ["", "## Repetition of the generations (autoregressive baselines)", "",
                  "Mean 4-gram repetition rate of the generations and the share that are loops (more than half "
                  "of their 4-grams repeated); near 1, the speedups of that temperature are measured on loops.", ""]
        lines += [f"- {r['pair']} `{r['label']}`: repetition {r['repetition']:.2f}, "
                  f"{r['degenerate']:.0%} of generations degenerate" for r in looped]
    lines += ["", "## Null-draft control", ""]
    if summary["controls"]:
        lines += [f"- {c['pair']} `{c['label']}`: {_with_interval(c, 'speedup', suffix='x')} — "
                  + ("passes (not faster than autoregressive)" if c["passed"] else "FAILS (faster than autoregressive)")
                  + ("" if c.get("matches_prediction") is None else
                     f"; predicted {_fmt(c.get('predicted'), 3)}x (1 / (r(g) + o) a decode step, with the prompts' "
                     "prefills), "
                     + ("inside the interval" if c["matches_prediction"] else "OUTSIDE the interval"))
                  for c in summary["controls"]]
    else:
        lines.append("No null-draft configuration in this run.")
    lines += ["", "## Costs: c, r(g) and the loop overhead (paired micro-benchmarks, `runs/costs/`)", "",
              "The tables that priced the predictions above (`predicted`: tau / (gamma c + r(gamma) + o) tokens per AR "
              "step while decoding, with the prompts' prefills added as they were measured).", ""]
    lines += _md_table(COST_HEADER, _cost_lines(summary)) if summary["costs"] else ["No cost tables."]
    lines += ["", "## Physical-control and cost-model warnings", ""]
    lines += [f"- {w}" for w in summary["warnings"]] or ["None."]
    lines += ["", "## Notebooks and pair builds (wall time)", ""]
    lines += _md_table(["notebook", "seconds", "status"], _notebook_lines(summary))
    if summary["run"].get("seconds") is not None:
        lines += ["", f"Total: {summary['run']['seconds']:.0f} s of notebooks and pair builds."]
    if summary["errors"]:
        lines += ["", "## Problems reading the run", "", *(f"- {e}" for e in summary["errors"])]
    lines += ["", f"HTML report: `{summary['report']}`.", ""]
    return "\n".join(lines)


def _text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)]


def render_text(summary: dict) -> str:
    """What the command prints: the summary table, the controls, costs, times and warnings."""
    lines = [f"SPADE run summary: {summary['run_dir']}", _run_line(summary), ""]
    rows = table_rows(summary)
    header = ["pair", "configuration", "T", "alpha", "tau", "speedup over AR [95 %]", "predicted", "decode phase",
              "predicted (decode)", "note"]
    keys = ["pair", "configuration", "T", "alpha", "tau", "speedup", "predicted", "decode phase", "predicted (decode)",
            "note"]
    lines += _text_table(header, [[r[k] for k in keys] for r in rows]) if rows else ["(no speedups)"]
    if summary["costs"]:
        lines += ["", *_text_table(COST_HEADER, _cost_lines(summary))]
    lines += ["", *_text_table(["notebook", "seconds", "status"], _notebook_lines(summary))]
    if not summary["controls"]:
        lines += ["", "null-draft control: not in this run"]
    lines += ["", f"physical-control and cost-model warnings: {len(summary['warnings'])}",
              *(f"  {w}" for w in summary["warnings"])]
    lines += [f"problem: {e}" for e in summary["errors"]]
    return "\n".join(lines)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f3f3f3}.warn{color:#a00}.fig{display:inline-block;margin:6px;
vertical-align:top;max-width:560px;font-size:12px}.fig img{max-width:560px;border:1px solid #ddd}
figcaption{margin-top:3px}section.pair{border-top:1px solid #ccc;margin-top:1em}h4{margin:.8em 0 .2em}
code{background:#f5f5f5}"""


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    return ("<table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows) + "</tbody></table>")


def _render_gallery(summary: dict, figures: list[str]) -> str:
    """The figures as ``<section class="pair">`` per pair (figures shared by every pair last), in it a
    ``<section class="notebook">`` per notebook that saved them (linked to its page), each figure a
    ``<figure>`` with its caption; ``figures`` are the image paths relative to ``report/``, in
    ``summary["figures"]``'s order."""
    from itertools import groupby

    e = html.escape
    gallery = summary.get("gallery")
    if gallery is None or len(gallery) != len(figures):  # a summary written before the gallery existed
        gallery = _gallery([Path(f) for f in figures], {})
    src = dict(zip(summary.get("figures") or figures, figures))
    pages = [n for n in summary.get("notebooks") or [] if n.get("html")]

    def heading(notebook: str | None, pair: str | None) -> str:
        """The notebook's name, linked to its page in the part that ran ``pair`` (to every part's page
        when the pair does not tell one: a figure shared by every pair)."""
        if notebook is None:
            return "other figures (no executed notebook saves them)"
        same = [n for n in pages if n["name"] == notebook]
        match = [n for n in same if (n.get("pair") or "default") == pair]
        if len(match) == 1 or len(same) == 1:
            return f'<a href="{e((match or same)[0]["html"].removeprefix(REPORT_DIR + "/"))}">{e(notebook)}</a>'
        return e(notebook) + "".join(f' <a href="{e(n["html"].removeprefix(REPORT_DIR + "/"))}">[{e(n["part"])}]</a>'
                                     for n in same)

    out = []
    for pair, in_pair in groupby(gallery, key=lambda g: g["pair"]):
        title = f"pair {pair}" if pair is not None else "the same for every pair (one file per run)"
        out.append(f'<section class="pair" data-pair="{e(pair or "")}"><h3>{e(title)}</h3>')
        for notebook, in_nb in groupby(in_pair, key=lambda g: g["notebook"]):
            out.append(f'<section class="notebook" data-notebook="{e(notebook or "")}"><h4>{heading(notebook, pair)}'
                       "</h4>")
            for g in in_nb:
                f = src.get(g["figure"], g["figure"].removeprefix(REPORT_DIR + "/"))
                out.append(f'<figure class="fig"><a href="{e(f)}"><img src="{e(f)}" alt="{e(g["name"])}"></a>'
                           f"<figcaption><code>{e(g['name'])}</code>"
                           f"{': ' + e(g['caption']) if g['caption'] else ''}</figcaption></figure>")
            out.append("</section>")
        out.append("</section>")
    return "".join(out) or "<p>No figures.</p>"


def render_index(summary: dict, figures: list[str]) -> str:
    """``report/index.html``: links relative to ``report/``; the figures as :func:`_render_gallery`."""
    e = html.escape
    rows = table_rows(summary)
    header = SUMMARY_HEADER
    def link(n):
        name = e((n["part"] + "/" if n["part"] else "") + n["name"])
        return f"<a href=\"{e(n['html'].removeprefix(REPORT_DIR + '/'))}\">{name}</a>" if n["html"] else name

    nb_rows = "".join(f"<tr><td>{e((b['part'] + '/' if b['part'] else '') + 'build ' + b['name'])}</td>"
                      f"<td>{e(_fmt(b['seconds'], 0))}</td><td>{e(b['status'])}</td></tr>"
                      for b in summary.get("builds") or [])
    nb_rows += "".join(f"<tr><td>{link(n)}</td><td>{e(_fmt(n['seconds'], 0))}</td><td>{e(n['status'])}</td></tr>"
                       for n in summary["notebooks"])
    warnings = "".join(f"<li class=\"warn\">{e(w)}</li>" for w in summary["warnings"]) or "<li>None.</li>"
    figs = _render_gallery(summary, figures)
    costs = _html_table(COST_HEADER, _cost_lines(summary)) if summary["costs"] else (
        "<p>No cost tables.</p>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>SPADE run {e(summary['run_dir'])}</title>
<style>{_CSS}</style></head><body>
<h1>SPADE run <code>{e(summary['run_dir'])}</code></h1>
<p>{e(_run_line(summary))}. Machine-readable: <a href="../summary.json">summary.json</a>,
<a href="../summary.md">summary.md</a>.</p>
<h2>Notebooks and pair builds</h2>
<table><thead><tr><th>notebook</th><th>seconds</th><th>status</th></tr></thead><tbody>{nb_rows}</tbody></table>
<h2>Speedup over autoregressive decoding (95 % intervals)</h2>
{_html_table(header, [[r[h] for h in header] for r in rows]) if rows else '<p>No speedups.</p>'}
<h2>Costs: c, r(g) and the loop overhead (the tables the predictions used)</h2>
{costs}
<h2>Physical-control and cost-model warnings</h2>
<ul>{warnings}</ul>
<h2>Figures</h2>
{figs}
</body></html>
"""


# ---------------------------------------------------------------------------------- writing

def _with_backlink(page: str, href: str) -> str:
    """``page`` with a link to the report's index right after ``<body ...>``."""
    at = page.find("<body")
    end = page.find(">", at) + 1 if at >= 0 else 0
    link = (f'<p style="font:13px system-ui,sans-serif;margin:8px 16px"><a href="{html.escape(href)}">'
            "&larr; SPADE run report</a></p>")
    return page[:end] + link + page[end:]


def write_html(summary: dict, run_dir: Path) -> Path:
    """Every notebook of the summary as ``run_dir/report/...html`` (nbconvert's lab template, images
    embedded), the figures copied to ``report/figures/``, and ``report/index.html``."""
    import nbformat
    from nbconvert import HTMLExporter

    run_dir = Path(run_dir).resolve()
    report = run_dir / REPORT_DIR
    exporter = HTMLExporter(template_name="lab", embed_images=True)
    for n in summary["notebooks"]:
        try:
            body, _ = exporter.from_notebook_node(nbformat.read(run_dir / n["file"], as_version=4))
        except Exception as e:  # one notebook that does not convert must not cost the others
            summary["errors"].append(f"{n['file']}: not converted to HTML ({type(e).__name__}: {e})")
            n["html"] = None
            continue
        up = "../" * (n["html"].count("/") - 1)
        write_text(run_dir / n["html"], _with_backlink(body, f"{up}index.html"))
    figures, moved = [], {}
    for f in map(Path, summary["figures"]):
        source = str(f)
        if f.is_absolute():
            write_bytes(report / "figures" / f.name, f.read_bytes())
            f = Path(REPORT_DIR) / "figures" / f.name
        figures.append(str(f))
        moved[source] = str(f)
    summary["figures"] = figures
    for entry in summary.get("gallery") or []:
        entry["figure"] = moved.get(entry["figure"], entry["figure"])
    index = report / "index.html"
    write_text(index, render_index(summary, [f.removeprefix(REPORT_DIR + "/") for f in figures]))
    return index


def write_report(run_dirs, *, runs_dir=None, figures_dir=None, html: bool = True, quiet: bool = False) -> dict:
    """:func:`summarize` the run, write ``summary.json``, ``summary.md`` and (``html``) the HTML report
    into the first run folder, print the summary (unless ``quiet``) and return it."""
    run_dirs = [Path(d) for d in ([run_dirs] if isinstance(run_dirs, (str, os.PathLike)) else run_dirs)]
    summary = summarize(run_dirs, runs_dir=runs_dir, figures_dir=figures_dir)
    out = run_dirs[0]
    if html:
        index = write_html(summary, out)
    else:
        summary["report"], summary["figures"], summary["gallery"], index = None, [], [], None
    write_json(out / "summary.json", summary)
    write_text(out / "summary.md", render_markdown(summary))
    if not quiet:
        print(render_text(summary))
        print(f"\nsummary: {out / 'summary.md'} (machine-readable: {out / 'summary.json'})")
        if index is not None:
            print(f"HTML report: {index.resolve()}")
    return summary


# ---------------------------------------------------------------------------------- the README block

def _pick_pair(summary: dict, pair: str | None) -> str:
    pairs = list(dict.fromkeys(r["pair"] for r in summary["configurations"]))
    if not pairs:
        raise ValueError("summary.json holds no configurations: nothing to write into the README")
    if pair is None:  # the registry's headline pair, else the first real pair, else the last pair run
        from spade_lib.zoo.registry import real_pair, real_pairs

        real = [p for p in real_pairs() if p in pairs]
        lead = [p for p in real if real_pair(p).headline]
        return (lead or real or pairs[-1:])[0]
    if pair not in pairs:
        raise ValueError(f"pair: {pair!r} is not in the summary (pairs: {pairs})")
    return pair


def _x(row: dict, key: str = "speedup") -> str:
    return _with_interval(row, key, suffix="×")


def _warning_key(warning: str) -> tuple[str, str, str]:
    """``(kind, pair, run label)`` of a warning: the summary's own checks name the run as ``"<kind>: <pair>/<run
    label> ..."``, a notebook's printed copy as ``"<kind>: <run label> ... (printed by <pair>/<notebook>)"``; both
    are one check. A warning that names no run keys on its whole text."""
    m = re.search(r" \(printed by ([^/)]+)/[^)]*\)$", warning)
    body = warning[:m.start()] if m else warning
    kind, _, rest = body.partition(": ")
    label = rest.split(" ", 1)[0]
    owner, _, run = label.rpartition("/")
    if not owner and m is None:
        return kind, "", rest  # nothing says whose run it is: only an identical text is the same warning
    return kind, owner or (m.group(1) if m else ""), run if (owner or " at T=" in rest) else rest


def _pair_warnings(warnings: list[str], pair: str) -> list[str]:
    """The warnings of ``pair``, each check of one run counted once (:func:`_warning_key`; the first one listed
    is kept)."""
    seen, out = set(), []
    for w in warnings:
        key = _warning_key(w)
        if key[1] != pair or key in seen:
            continue
        seen.add(key)
        out.append(w)
    return out


def readme_block(summary: dict, *, pair: str | None = None, teaser: str = TEASER) -> str:
    """The README's results block (markers included) for one pair of the summary: the teaser, sentences
    printed from the numbers, a table, and the run, commit, date and machine they come from."""
    pair = _pick_pair(summary, pair)
    teaser = teaser.format(pair=pair)
    rows = [r for r in summary["configurations"] if r["pair"] == pair]
    suite = rows[0]["suite"]
    m, run = summary["machine"] or {}, summary["run"]
    temps = sorted({r["T"] for r in rows})
    spec = [r for r in rows if r["role"] == "speculative" and r["speedup"] is not None and claimed(r)]
    sentences = [f"at T = {T:g} the generations are loops (more than {DEGENERATE_SHARE:.0%} degenerate), so no "
                 "speed or acceptance is claimed" for T in sorted({r["T"] for r in rows if not claimed(r)})]
    for T in temps:
        at = [r for r in spec if r["T"] == T]
        if at:
            best = max(at, key=lambda r: r["speedup"])
            decode = ("" if best.get("speedup_decode") is None else
                      f" ({_x(best, 'speedup_decode')} in the decode phase, both sides' prompt prefills out)")
            sentences.append(f"at T = {T:g} the fastest configuration is `{best['configuration']}`, "
                             f"{_x(best)} over autoregressive decoding" + decode)
    # one sentence per draft and variant (its label without the draft length: a rule, a tree) over its lengths
    def variant(r: dict) -> str:
        extra = r["configuration"].replace(f"{r['method']}-{r['draft']}-g{r['gamma']}", "", 1).strip("-")
        return f"the `{r['draft']}` draft" + (f" ({extra})" if extra else "")

    for name in dict.fromkeys(variant(r) for r in spec if r["method"] == "spade"):
        at = [r for r in spec if r["method"] == "spade" and variant(r) == name]
        for T in temps:
            d = [r for r in at if r["T"] == T]
            if len({r.get("gamma") for r in d}) < 2:
                continue
            above = sum(r["speedup_low"] is not None and r["speedup_low"] > 1 for r in d)
            below = sum(r["speedup_high"] is not None and r["speedup_high"] < 1 for r in d)
            alpha = [r["alpha"] for r in d if r["alpha"] is not None]
            if alpha:
                span = f"{min(alpha):.2f}" if f"{min(alpha):.2f}" == f"{max(alpha):.2f}" else \
                    f"{min(alpha):.2f}–{max(alpha):.2f}"
                sentences.append(f"{name} at T = {T:g} (alpha {span}) is faster than autoregressive beyond its "
                                 f"interval at {above} of {len(d)} draft lengths and slower at {below}")
    for r in rows:
        if r["method"] == "hf_assisted" and r.get("vs_hf") is not None and claimed(r):
            sentences.append(f"HF assisted generation (`{r['configuration']}`, T = {r['T']:g}) runs at "
                             f"{_x(r, 'vs_hf')} of plain HF generate")
    for c in summary["controls"]:
        if c["pair"] == pair:
            sentences.append(f"the null-draft control (T = {c['T']:g}) runs at {_x(c)}"
                             + ("" if c["passed"] else ", faster than autoregressive: a defect of the baseline"))
    from spade_lib.runs.controls import MODEL_PREFIX, PREFIX

    warned = _pair_warnings(summary["warnings"], pair)
    model = [w for w in warned if w.startswith(MODEL_PREFIX + ":")]
    n_phys = len([w for w in warned if w.startswith(PREFIX + ":")])
    sentences.append(f"{n_phys} physical-control warning{'s' * (n_phys != 1)} and {len(model)} run"
                     f"{'s' * (len(model) != 1)} whose measured interval excludes the cost-model prediction "
                     f"for this pair")
    sentences = [s for s in sentences if s]
    by_cfg: dict[str, dict] = {}
    for r in rows:
        if r["role"] != "baseline":
            by_cfg.setdefault(r["configuration"], {})[r["T"]] = r
    header = ["configuration"] + [h for T in temps for h in (f"alpha T={T:g}", f"speedup T={T:g}")]
    def cells(v: dict, T: float) -> tuple[str, str]:
        if T not in v:
            return "–", "–"
        return (_with_interval(v[T], "alpha"), _x(v[T])) if claimed(v[T]) else (NOT_CLAIMED, NOT_CLAIMED)

    table = [[f"`{cfg}`"] + [c for T in temps for c in cells(v, T)] for cfg, v in by_cfg.items()]
    commit = (run.get("commit") or "unknown")[:7] + (" + uncommitted changes" if run.get("dirty") else "")
    machine = f"{m.get('cpu_model')}, {m.get('threads')} torch threads, torch {m.get('torch')}, Python {m.get('python')}"
    lines = [RESULTS_BEGIN,
             f"<!-- written by `python -m spade_lib.report readme {summary['run_dir']}` from its summary.json: "
             "do not edit by hand -->",
             f"![Speedup over autoregressive decoding of {pair} on {suite}, with 95 % bootstrap intervals and the "
             f"cost-model prediction (figures/{teaser}.png of the run below)](figures/teaser.png)", "",
             f"*{pair} on `{suite}` (`figures/{teaser}.png`; run `{summary['run_dir']}`, commit `{commit}`, "
             f"{(run.get('started') or summary['generated'])[:10]}; {machine}): " + "; ".join(sentences) + ".*", "",
             *_md_table(header, table), "",
             f"All numbers: `{summary['run_dir']}/summary.md`, per notebook: `{summary['run_dir']}/report/index.html` "
             f"(`make run` writes both).", RESULTS_END]
    return "\n".join(lines)


def update_readme(run_dir, *, readme: str | Path | None = None, pair: str | None = None, teaser: str = TEASER,
                  figures_dir: str | Path | None = None) -> Path:
    """Rewrite the results block of ``readme`` (``README.md``) from ``run_dir/summary.json`` and copy
    the run's ``<teaser>.png`` (its report copy, else ``figures_dir``) to ``figures/teaser.png`` beside
    the README. Checks everything before writing either file."""
    run_dir = Path(run_dir)
    readme = Path(readme) if readme is not None else paths.REPO_ROOT / "README.md"
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"run_dir: no summary.json in {run_dir} (run `python -m spade_lib.report {run_dir}`)")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    if summary.get("schema") != SCHEMA:
        raise ValueError(f"{summary_path}: schema {summary.get('schema')!r}, expected {SCHEMA!r}")
    text = readme.read_text(encoding="utf-8")
    if text.count(RESULTS_BEGIN) != 1 or text.count(RESULTS_END) != 1 or text.index(RESULTS_BEGIN) > text.index(RESULTS_END):
        raise ValueError(f"{readme}: needs exactly one {RESULTS_BEGIN} ... {RESULTS_END} block")
    figures_dir = Path(figures_dir) if figures_dir is not None else paths.FIGURES_DIR
    pair = _pick_pair(summary, pair)
    teaser = teaser.format(pair=pair)
    source = next((f for f in (run_dir / REPORT_DIR / "figures" / f"{teaser}.png", figures_dir / f"{teaser}.png")
                   if f.is_file()), None)
    if source is None:
        raise FileNotFoundError(f"teaser: no {teaser}.png in {run_dir / REPORT_DIR / 'figures'} or {figures_dir}")
    block = readme_block(summary, pair=pair, teaser=teaser)
    head, rest = text.split(RESULTS_BEGIN, 1)
    tail = rest.split(RESULTS_END, 1)[1]
    write_bytes(readme.parent / "figures" / "teaser.png", source.read_bytes())
    write_text(readme, head + block + tail)
    return readme


# ---------------------------------------------------------------------------------- command line

def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["readme"]:
        ap = argparse.ArgumentParser(prog="python -m spade_lib.report readme",
                                     description="Rewrite README.md's results block from RUN_DIR/summary.json and "
                                                 "copy the run's teaser figure to figures/teaser.png.")
        ap.add_argument("run_dir", type=Path)
        ap.add_argument("--readme", type=Path, help="the README to rewrite (default: the repository's)")
        ap.add_argument("--pair", help="the pair the block describes (default: smollm2 if in the run, else the last)")
        ap.add_argument("--teaser", default=TEASER, help=f"figure stem copied to figures/teaser.png ({TEASER})")
        args = ap.parse_args(argv[1:])
        try:
            path = update_readme(args.run_dir, readme=args.readme, pair=args.pair, teaser=args.teaser)
        except (FileNotFoundError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"rewrote the results block of {path} and {path.parent / 'figures' / 'teaser.png'} from {args.run_dir}")
        return 0
    ap = argparse.ArgumentParser(prog="python -m spade_lib.report", description=__doc__.split("\n\n")[0],
                                 epilog="python -m spade_lib.report readme RUN_DIR: rewrite README.md's results block")
    ap.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                    help="folder of executed notebooks (or of such folders); the report goes into the first")
    ap.add_argument("--runs", type=Path, help="runs folder with traces/ and costs/ (default: SPADE_RUNS_DIR or runs/)")
    ap.add_argument("--no-html", action="store_true", help="only summary.md and summary.json")
    args = ap.parse_args(argv)
    try:
        write_report(args.run_dirs, runs_dir=args.runs, html=not args.no_html)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
