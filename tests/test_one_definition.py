"""One definition per concept (issue 42), checked so that a re-introduced duplicate fails CI.

Each check greps the package's *code* (docstrings and comments, which state formulas, are left out) for
one concept defined in one place:

- ``tau``: the mean accepted length is :func:`spade_lib.measures.tau`; a mean of ``n + 1`` (or of
  ``accept_lengths``, ``mean_accepted + 1``, ``tokens / steps`` ...) anywhere else is a second copy
  (the README's Python blocks and ``benchmarks/`` too);
- the clock: :func:`spade_lib.devices.clock` is defined once, and ``time.perf_counter()`` inside a loop
  (a timing loop) appears only in the timing modules of :data:`TIMING_LOOPS`;
- ``pair_costs`` is defined once (``runs.costs``: the measured cost table);
- trace-based cost ratios (``metrics.cost_ratio`` / ``verify_cost_ratio``) go to ``c_trace`` / ``r_trace``,
  never to the measured table's ``c`` / ``r``.

Every check is also run on a planted duplicate in a temporary package, where it must fail.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "spade_lib"

TAU_HOME = "spade_lib/measures.py"
# A mean accepted length computed by hand, in code (patterns over a line with docstrings/comments blanked).
TAU_PATTERNS = {
    "sum of accept_lengths over a count": r"sum\([^\n]*accept_lengths[^\n]*\)\s*/",
    "mean of accept_lengths": r"mean\([^\n]*accept_lengths",
    "sum of accept_lengths per generation": r"accept_lengths[^\n]*np\.sum\(",
    "mean of n_accepted + 1": r"mean\([^\n]*n_accepted[\"'\]]*\s*\+\s*1",
    "(n_accepted + 1).mean()": r"n_accepted[\"'\]]*\s*\+\s*1\)\s*\.mean\(",
    "mean_accepted + 1": r"mean_accepted[\"'\]]*\s*\+\s*1",
    "a mean plus one": r"\.mean\(\)\)?\s*\+\s*\(?1(\.0)?\b",
    "mean of per-step tokens": r"\[[\"']tokens(_expected)?[\"']\]\.mean\(",
    "accepted lengths' mean": r"\blengths\.mean\(",
    "tokens over steps": r"\b(tokens|emitted)[\"'\]]*\s*/\s*\w*\[?[\"']?(steps|n_steps)\b",
    "new tokens over steps": r"new_tokens[^\n]*/\s*\w*\[?[\"']?n_steps\b",
}
# Known copies in files another developer owns right now: each must still match (a fixed one must be
# taken off this list), and nothing else may.
TAU_KNOWN: dict[str, str] = {}

CLOCK_CALLS = {"perf_counter", "perf_counter_ns", "process_time", "monotonic", "clock", "device_clock"}
TIMING_LOOPS = {  # modules whose loops read the clock, and why that is not a second timing loop
    "spade_lib/devices.py": "the clock and the one timing loop (time_in_turns)",
    "spade_lib/decoding/decode.py": "the decoder's per-step t_draft / t_verify (trace columns, not a timing loop)",
    "spade_lib/decoding/batch.py": "the batched decoders' per-step t_draft / t_verify (trace columns)",
    "spade_lib/decoding/batch_tree.py": "the batched tree decoder's per-step t_draft / t_verify (trace columns)",
    "spade_lib/whatif/align.py": "seconds to score each run (bookkeeping)",
    "spade_lib/whatif/sessions.py": "seconds per interleaved session (bookkeeping)",
    "spade_lib/runbook.py": "seconds per notebook (bookkeeping)",
    "spade_lib/zoo/__main__.py": "seconds to build a pair (bookkeeping)",
    "spade_lib/zoo/build.py": "build and training seconds in the manifest (bookkeeping)",
    "spade_lib/zoo/distill.py": "training-curve seconds (bookkeeping)",
    "spade_lib/zoo/train.py": "training-curve seconds (bookkeeping)",
    "spade_lib/zoo/head_train.py": "training budget guard and curve seconds (bookkeeping)",
}
CLOCK_HOME = "spade_lib/devices.py"
PAIR_COSTS_HOME = "spade_lib/runs/costs.py"
TRACE_COSTS = r"\[[\"'](c|r)[\"']\]\s*=\s*(verify_)?cost_ratio\("


# -- reading code -------------------------------------------------------------------------------------

def code_lines(source: str) -> list[str]:
    """``source``'s lines with docstrings / bare string statements and comments blanked (line numbers kept)."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for i in range(node.lineno - 1, node.end_lineno):
                lines[i] = ""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    return lines


def python_files(root: Path, *dirs: str) -> dict[str, str]:
    """``{path relative to root: source}`` of every ``.py`` file under ``root / d`` for each ``d``."""
    out = {}
    for d in dirs:
        for f in sorted((root / d).rglob("*.py")):
            out[f.relative_to(root).as_posix()] = f.read_text()
    return out


def readme_python(text: str) -> str:
    """The README's fenced Python blocks, other lines blank (line numbers kept)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            inside = line.strip() == "```python"
            out.append("")
            continue
        out.append(line if inside else "")
    return "\n".join(out)


# -- the checks: each returns violations "path:line: what" ----------------------------------------------

def tau_copies(files: dict[str, str]) -> list[str]:
    found = []
    for path, source in files.items():
        if path == TAU_HOME:
            continue
        for i, line in enumerate(code_lines(source), start=1):
            for what, pattern in TAU_PATTERNS.items():
                if re.search(pattern, line):
                    found.append(f"{path}:{i}: {what}: {line.strip()}")
    return found


def clock_copies(files: dict[str, str]) -> list[str]:
    found = []
    for path, source in files.items():
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("clock", "_clock") \
                    and not (path == CLOCK_HOME and node.name == "clock"):
                found.append(f"{path}:{node.lineno}: def {node.name}: a second clock (use devices.clock)")
        if path in TIMING_LOOPS:
            continue
        for loop in ast.walk(tree):
            if isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
                for n in ast.walk(loop):
                    if isinstance(n, ast.Call):
                        name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
                        if name in CLOCK_CALLS:
                            found.append(f"{path}:{n.lineno}: {name}() in a loop outside the timing modules")
    return sorted(set(found))


def pair_costs_copies(files: dict[str, str]) -> list[str]:
    found = []
    for path, source in files.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "pair_costs" \
                    and path != PAIR_COSTS_HOME:
                found.append(f"{path}:{node.lineno}: def pair_costs (the cost table is runs.costs.pair_costs)")
    return found


def trace_cost_columns(files: dict[str, str]) -> list[str]:
    return [f"{path}:{i}: a trace-based ratio in c / r (name it c_trace / r_trace): {line.strip()}"
            for path, source in files.items() for i, line in enumerate(code_lines(source), start=1)
            if re.search(TRACE_COSTS, line)]


CHECKS = {"tau": tau_copies, "clock": clock_copies, "pair_costs": pair_costs_copies,
          "trace_costs": trace_cost_columns}


# -- the package -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def package() -> dict[str, str]:
    return python_files(REPO, PACKAGE)


def test_tau_is_computed_only_by_measures_tau(package):
    files = {**package, **python_files(REPO, "benchmarks"),
             "README.md": readme_python((REPO / "README.md").read_text())}
    found = tau_copies(files)
    unknown = [v for v in found if v.split(":")[0] not in TAU_KNOWN]
    assert not unknown, "tau computed outside spade_lib.measures.tau:\n" + "\n".join(unknown)
    fixed = [p for p in TAU_KNOWN if not any(v.startswith(p + ":") for v in found)]
    assert not fixed, f"no longer a copy of tau, take it off TAU_KNOWN: {fixed}"


@pytest.mark.parametrize("check", ["clock", "pair_costs", "trace_costs"])
def test_one_definition(package, check):
    found = CHECKS[check](package)
    assert not found, "\n".join(found)


def test_the_homes_exist(package):
    """The one definitions are where the checks say (a moved one must move the check too)."""
    assert re.search(r"^def tau\(", package[TAU_HOME], re.M)
    assert re.search(r"^def clock\(", package[CLOCK_HOME], re.M)
    assert re.search(r"^def pair_costs\(", package[PAIR_COSTS_HOME], re.M)
    assert re.search(r"^def time_in_turns\(", package[CLOCK_HOME], re.M)
    assert all(p in package for p in TIMING_LOOPS)


# -- the checker against planted duplicates --------------------------------------------------------------

PLANTED = {
    "tau": [
        'def f(out):\n    return sum(out.accept_lengths) / out.n_steps\n',
        'def f(summary):\n    return float(np.mean(np.concatenate([a for a in summary["accept_lengths"]])))\n',
        'def f(steps):\n    return float((steps["n_accepted"] + 1).mean())\n',
        'def f(results):\n    return float(np.mean([s.n_accepted + 1 for r in results for s in r.steps]))\n',
        'def f(out):\n    out["tau"] = out["mean_accepted"] + 1.0\n',
        'def f(steps):\n    return float(steps.mean()) + 1.0\n',
        'def f(grp):\n    return {"tau": float(grp["tokens"].mean())}\n',
        'def f(lengths):\n    return float(lengths.mean())\n',
        'def f(out):\n    out["tau"] = out["emitted"] / out["steps"]\n',
        'def f(tokens, steps):\n    tau = tokens / steps\n    return tau\n',
        'def f(summary, n_steps):\n    return float(summary["new_tokens"].sum()) / n_steps\n',
        'def f(s):\n    return s["accept_lengths"].map(lambda x: float(np.sum(x)))\n',
    ],
    "clock": [
        'import time\n\ndef _clock(device):\n    return time.perf_counter()\n',
        'import time\n\ndef clock():\n    return time.perf_counter()\n',
        'import time\n\ndef bench(f):\n    out = []\n    for _ in range(5):\n        t0 = time.perf_counter()\n'
        '        f()\n        out.append(time.perf_counter() - t0)\n    return out\n',
        'from time import process_time\n\ndef bench(f):\n    while True:\n        t0 = process_time()\n'
        '        f()\n        return process_time() - t0\n',
    ],
    "pair_costs": ['def pair_costs(manifest, draft):\n    return manifest["costs"][draft]\n'],
    "trace_costs": ['def f(out, trace, ar):\n    out["c"] = cost_ratio(trace, ar)\n',
                    'def f(out, trace, ar):\n    out["r"] = verify_cost_ratio(trace, ar)\n'],
}
CLEAN = {  # the one definitions themselves and look-alikes that are not copies: no check may flag them
    TAU_HOME: 'import numpy as np\n\ndef tau(accepted, steps, *, with_bonus=True):\n'
              '    """``tau = mean_s (N_s + 1)``; ``tokens / steps``; ``(n_accepted + 1).mean()``."""\n'
              '    tokens = accepted + steps if with_bonus else accepted\n    return np.true_divide(tokens, steps)\n',
    CLOCK_HOME: 'import time\n\ndef clock(device=None):\n    return time.perf_counter()\n',
    PAIR_COSTS_HOME: 'def pair_costs(pair, drafts, gamma):\n    return {}\n',
    "spade_lib/other.py": 'import time\n\ndef f(steps, out, trace, ar):\n'
                          '    """A docstring may say tau = mean(n + 1) = sum(accept_lengths) / n_steps."""\n'
                          '    lengths = [s.n_accepted + 1 for s in steps]  # accept lengths, one per step\n'
                          '    out["c_trace"] = cost_ratio(trace, ar)  # out["c"] = cost_ratio(...) is the bug\n'
                          '    t0 = time.perf_counter()  # one reading outside a loop: a duration\n'
                          '    return lengths, time.perf_counter() - t0\n',
}


def _package(tmp_path: Path, extra: dict[str, str]) -> dict[str, str]:
    for path, source in {**CLEAN, **extra}.items():
        f = tmp_path / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(source)
    return python_files(tmp_path, PACKAGE)


def test_a_clean_package_passes_every_check(tmp_path):
    files = _package(tmp_path, {})
    for name, check in CHECKS.items():
        assert check(files) == [], name


@pytest.mark.parametrize("check,source", [(c, s) for c, sources in PLANTED.items() for s in sources])
def test_a_planted_duplicate_fails_its_check(tmp_path, check, source):
    files = _package(tmp_path, {"spade_lib/planted.py": source})
    found = CHECKS[check](files)
    assert found and all(v.startswith("spade_lib/planted.py:") for v in found), (check, source, found)


def test_the_readme_example_is_checked_too():
    text = "Prose: sum(out.accept_lengths) / out.n_steps\n```python\nprint(out.tau)\n```\n"
    assert tau_copies({"README.md": readme_python(text)}) == []
    planted = text + "```python\nprint(sum(out.accept_lengths) / out.n_steps)\n```\n"
    assert tau_copies({"README.md": readme_python(planted)}) == ["README.md:6: sum of accept_lengths over a count: "
                                                                 "print(sum(out.accept_lengths) / out.n_steps)"]
