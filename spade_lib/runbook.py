"""Execute SPADE's numbered notebooks headlessly, in order, with papermill.

``python -m spade_lib.runbook`` (what ``make run`` calls) runs every ``notebooks/NN_*.ipynb`` into a fresh
``runs/notebooks/<timestamp>/`` (sources never overwritten; kernel named, working directory ``notebooks/``; tqdm
bars off in the kernels: ``TQDM_DISABLE``). It stops at the first failing notebook and exits non-zero, naming it
and the executed copy that holds the traceback. Options::

    python -m spade_lib.runbook [--only 03 04] [--profile smoke] [--params params/<name>] [-p NAME VALUE]
                                [--out DIR] [--no-report] [--build PAIR [PAIR ...]]

``--build default qwen2.5-coder`` first builds (or verifies) those pairs, each alone in a child process
(``python -m spade_lib.zoo NAME``) before any notebook starts; their wall times go into ``runbook.json``
(``builds``) and the summary's run time. ``--profile NAME`` sets ``SPADE_PROFILE`` (each notebook's
``setup_notebook`` fills what papermill does not pass from ``params/NAME/<notebook>.yaml``); ``--params DIR``
passes ``DIR/<notebook>.yaml`` as explicit parameters (``papermill ... -f DIR/<notebook>.yaml``); ``-p NAME
VALUE`` goes to every selected notebook (combine it with ``--only``: a notebook rejects undeclared names).

Everything is checked before papermill runs and before the output folder is made (:func:`check_parameters`):
the ``--params`` folder holds mappings; every name is an identifier declared in the notebook's ``parameters``
cell (papermill pastes names into code); values have the declared types and ranges; the profile exists.
``--out DIR`` executes into ``DIR`` (``make run``: ``<timestamp>/embedded`` and ``<timestamp>/qwen2.5-coder``),
which also gets ``runbook.json`` (rewritten after each notebook: profile, params, parameters, start/end,
commit, machine, each notebook's seconds and status) and, unless ``--no-report``, the run's summary and HTML
report (:mod:`spade_lib.report`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from datetime import datetime, timezone
from pathlib import Path

import yaml

from spade_lib import paths
from spade_lib.devices import clock

KERNEL = "python3"


def numbered_notebooks(directory: Path = paths.NOTEBOOKS_DIR) -> list[Path]:
    """The walk-through notebooks, ``NN_*.ipynb``, in order."""
    return sorted(p for p in directory.glob("[0-9][0-9]_*.ipynb"))


def _parameters_for(notebook: Path, params_dir: Path | None, extra: dict) -> dict:
    """Explicit papermill parameters for one notebook: ``params_dir/<stem>.yaml`` plus ``-p`` values."""
    values: dict = {}
    if params_dir is not None:
        path = Path(params_dir) / f"{notebook.stem}.yaml"
        if path.is_file():
            try:
                data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            except (yaml.YAMLError, UnicodeDecodeError) as e:
                raise ValueError(f"params_dir: {path} is not valid YAML: {e}") from None
            if not isinstance(data, dict):
                raise ValueError(f"params_dir: {path} must hold a flat mapping of parameter name -> value, "
                                 f"got {type(data).__name__}")
            values.update(data)
    values.update(extra)
    return values


def check_parameters(notebooks: list[Path], profile: str | None, params_dir: Path | None,
                     extra: dict) -> dict[Path, dict]:
    """Each notebook's explicit parameters, checked without running anything: names are identifiers
    declared in its ``parameters`` cell, values fit the declared types and ranges, the profile (if
    any) exists. Raises ``ValueError`` (``params.ParameterError``) naming the parameter."""
    from spade_lib.params import parameters_cell_source, parse_parameters_cell, resolve
    from spade_lib.validate import check_identifier

    if params_dir is not None and not Path(params_dir).is_dir():
        raise ValueError(f"params_dir: no such folder {params_dir} (known: "
                         f"{sorted(p.name for p in paths.PARAMS_DIR.iterdir() if p.is_dir())} under {paths.PARAMS_DIR})")
    out = {}
    for nb in notebooks:
        values = _parameters_for(nb, params_dir, extra)
        for name in values:
            check_identifier("parameter name", name)
        declared = parse_parameters_cell(parameters_cell_source(nb))
        resolve(declared, values, list(values), nb.stem, profile or os.environ.get("SPADE_PROFILE"))
        out[nb] = values
    return out


RECORD = "runbook.json"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_record(out_dir: Path, record: dict) -> None:
    from spade_lib.io import write_json

    write_json(out_dir / RECORD, record)


def _new_record(profile, params_dir, only, extra) -> dict:
    """What ``runbook.json`` starts with; a machine or commit that cannot be read is left ``None``."""
    from spade_lib import report
    from spade_lib.runs import timing

    record = {"profile": profile or os.environ.get("SPADE_PROFILE") or "default",
              "params": str(params_dir) if params_dir is not None else None, "only": only or None,
              "parameters": json.loads(json.dumps(extra or {}, default=str)), "started": _now(), "finished": None, "seconds": None,
              "status": "running", "commit": None, "dirty": None, "machine": None, "builds": [], "notebooks": []}
    try:
        record.update(timing.git_commit())
        record["machine"] = report.machine_info()
    except Exception as e:  # noqa: BLE001 - the record must never stop the run
        print(f"runbook: could not read the commit or the machine ({e})", file=sys.stderr)
    return record


def _build_pairs(names: list[str], out_dir: Path, record: dict, t_run: float) -> None:
    """``python -m spade_lib.zoo NAME`` for each pair, timed into ``record["builds"]``; a failed build ends
    the run (exit 1) after the record says so."""
    import subprocess

    for name in names:
        entry = {"name": name, "started": _now(), "seconds": None, "status": "running"}
        record["builds"].append(entry)
        _write_record(out_dir, record)
        print(f"==> building pair {name}", flush=True)
        start = clock()
        done = subprocess.run([sys.executable, "-m", "spade_lib.zoo", name], cwd=str(paths.REPO_ROOT), check=False)
        entry.update(seconds=round(clock() - start, 3), status="ok" if done.returncode == 0 else "failed")
        _write_record(out_dir, record)
        if done.returncode != 0:
            record.update(finished=_now(), seconds=round(clock() - t_run, 3), status="failed")
            _write_record(out_dir, record)
            print(f"\nFAILED: building pair {name} (python -m spade_lib.zoo {name}, exit {done.returncode})",
                  file=sys.stderr)
            raise SystemExit(1)
        print(f"    pair {name} ready in {entry['seconds']:.0f} s", flush=True)


def run_notebooks(
    only: list[str] | None = None,
    profile: str | None = None,
    params_dir: Path | None = None,
    extra: dict | None = None,
    out_dir: Path | None = None,
    builds: list[str] | None = None,
) -> Path:
    """Build the pairs in ``builds`` (each alone, timed), then execute the selected notebooks in order;
    return the run folder. Raises on the first failure."""
    import papermill as pm

    notebooks = numbered_notebooks()
    if only:
        notebooks = [nb for nb in notebooks if any(nb.name.startswith(o) for o in only)]
        if not notebooks:
            raise SystemExit(f"no notebook matches {only}; known: {[n.name for n in numbered_notebooks()]}")
    parameters = check_parameters(notebooks, profile, params_dir, extra or {})
    if builds:
        from spade_lib.zoo.pairs import all_pair_names

        known = all_pair_names()
        unknown = [b for b in builds if b not in known]
        if unknown:
            raise ValueError(f"builds: unknown pair(s) {unknown}; known: {known}")
    if profile:
        os.environ["SPADE_PROFILE"] = profile
    # executed notebooks are records, not consoles: their kernels (which inherit this environment) draw no tqdm
    # bars (tqdm reads TQDM_DISABLE); TQDM_DISABLE=0 in the caller's environment keeps them
    os.environ.setdefault("TQDM_DISABLE", "1")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = out_dir or paths.RUNS_DIR / "notebooks" / stamp
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    record = _new_record(profile, params_dir, only, extra)
    _write_record(out_dir, record)
    t_run = clock()
    _build_pairs(list(builds or []), out_dir, record, t_run)
    print(f"executing {len(notebooks)} notebook(s) into {out_dir} (profile={profile or 'default'})", flush=True)
    for nb in notebooks:
        output = out_dir / nb.name
        start = clock()
        entry = {"name": nb.stem, "started": _now(), "seconds": None, "status": "running"}
        record["notebooks"].append(entry)
        _write_record(out_dir, record)
        print(f"==> {nb.name}", flush=True)
        try:
            pm.execute_notebook(
                str(nb),
                str(output),
                parameters=parameters[nb],
                kernel_name=KERNEL,
                cwd=str(paths.NOTEBOOKS_DIR),
                progress_bar=True,
                log_output=False,
            )
        except Exception as exc:  # papermill raises PapermillExecutionError with the cell's traceback
            entry.update(seconds=round(clock() - start, 3), status="failed")
            record.update(finished=_now(), seconds=round(clock() - t_run, 3), status="failed")
            _write_record(out_dir, record)
            print(f"\nFAILED: {nb.name} — executed copy with the traceback: {output}\n{exc}", file=sys.stderr)
            raise SystemExit(1) from None
        entry.update(seconds=round(clock() - start, 3), status="ok")
        _write_record(out_dir, record)
        print(f"    {nb.name} done in {entry['seconds']:.0f} s", flush=True)
    record.update(finished=_now(), seconds=round(clock() - t_run, 3), status="ok")
    _write_record(out_dir, record)
    print(f"all notebooks executed; figures in {paths.FIGURES_DIR}, executed copies in {out_dir}")
    return out_dir


def report_run(out_dir: Path) -> bool:
    """The run's summary and HTML report (:func:`spade_lib.report.write_report`), printed; a failure is
    printed with its traceback and the command that retries it, and returns False (the notebooks ran)."""
    try:
        from spade_lib.report import write_report

        print(flush=True)
        write_report(out_dir)
        return True
    except Exception:  # noqa: BLE001 - reporting must not hide that every notebook ran
        traceback.print_exc()
        print(f"\nREPORT FAILED (the notebooks ran; their executed copies are in {out_dir}); retry with\n"
              f"    python -m spade_lib.report {out_dir}", file=sys.stderr)
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="notebook number prefixes to run, e.g. 01 03")
    parser.add_argument("--profile", help="parameter profile from params/<profile>.yaml (e.g. smoke)")
    parser.add_argument("--params", type=Path, help="folder of <notebook>.yaml parameter files (e.g. params/paper)")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="one parameter for every notebook (value parsed as YAML)")
    parser.add_argument("--out", type=Path, help="folder for the executed notebooks (default runs/notebooks/<timestamp>)")
    parser.add_argument("--no-report", action="store_true", help="skip the summary and HTML report at the end")
    parser.add_argument("--build", nargs="+", default=[], metavar="PAIR",
                        help="build (or verify) these pairs first, each alone and timed (e.g. default smollm2)")
    args = parser.parse_args(argv)
    try:
        extra = {name: yaml.safe_load(value) for name, value in args.parameter}
    except yaml.YAMLError as e:
        parser.error(f"-p: a value is not valid YAML: {e}")
    try:
        out_dir = run_notebooks(args.only, args.profile, args.params, extra, out_dir=args.out, builds=args.build)
    except ValueError as e:  # bad options: nothing was run or written
        parser.error(str(e))
    if not args.no_report:
        report_run(out_dir)


if __name__ == "__main__":
    main()
