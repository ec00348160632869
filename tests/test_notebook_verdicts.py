"""Every verdict notebooks 02-05 can print stands on a measured interval (spade_lib.runs.verdicts.unsupported).

The report runs ``verdicts.unsupported`` on the outputs of executed notebooks; this test reads the notebooks'
*code*, so a bad sentence fails here before any run prints it. Each code cell is AST-parsed and every text it
can print is rendered: the arguments of ``print(...)`` and the strings appended to a list (``lines.append``,
joined and printed later). Rendering follows the text, not the values:

- a string literal is itself; an f-string's placeholder is the text its expression can hold (a name bound to
  sentences, below), else a number (``1.23``; ``12%`` for a ``%`` spec), so ``[{lo:.2f}, {hi:.2f}]`` reads
  as an interval, as it will when printed;
- ``a if c else b``, ``a or b``, ``{...: "x", ...: "y"}.get(k)`` and ``[..][i]`` are alternatives: each is
  checked as its own line (the branch the data pick must be sound whichever it is);
- ``s1 + s2`` and ``"sep".join(...)`` concatenate (every combination of alternatives, capped);
- a name is every string expression assigned to it anywhere in the notebook, a call of a function the
  notebook defines is its returned expressions; anything else (a value, a library call) is a number.

``test_a_planted_verdict_without_an_interval_is_caught`` plants bad lines in a notebook of its own, so the
check is shown to fail where it should. Where an executed copy of a notebook exists (the newest under
``RUNS_DIR/notebooks/``), its printed outputs are checked too.

Sentences that moved into the package (a notebook prints ``"\\n".join(narrative.summary_lines(...))``, which
this walk sees as a library call) are read where they are built: every module of :data:`SENTENCE_MODULES` is
walked the same way (its ``print`` calls and the lines it appends), and ``tests/test_narrative.py`` runs
:mod:`spade_lib.runs.narrative` itself on synthetic tables.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import nbformat
import pytest

from spade_lib import paths
from spade_lib.runs import verdicts

NOTEBOOKS = sorted(p for p in paths.NOTEBOOKS_DIR.glob("0[2-5]_*.ipynb"))
# modules that build the lines notebooks print (the notebook only joins and prints them)
SENTENCE_MODULES = ["spade_lib/runs/narrative.py", "spade_lib/runs/controls.py", "spade_lib/runs/cross_drafts.py",
                    "spade_lib/runs/greedy.py", "spade_lib/zoo/early_exit.py"]
# modules that compute whole sections of notebooks 04 and 05 (issue 42): they return tables and figures, and
# the notebooks word the results, so their sentences stay where the walk above reads them
SECTION_MODULES = {"spade_lib/diagnose/study.py": "study.run_drafts(", "spade_lib/diagnose/tree_study.py":
                   "tree_study.run(", "spade_lib/whatif/sessions.py": "sessions.run(",
                   "spade_lib/plots/whatif.py": "whatif_plots.predicted_tau("}
NUMBER = "1.23"
MAX_ALTERNATIVES = 64  # per expression: enough for every branch of the notebooks' sentences


class PrintedText:
    """The texts one notebook's code can print (module docstring)."""

    def __init__(self, sources: list[str]):
        self.trees = [ast.parse(_strip_magics(s)) for s in sources]
        self.assigned: dict[str, list[ast.expr]] = {}
        self.functions: dict[str, list[ast.expr]] = {}
        for tree in self.trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        self._bind(target, node.value)
                elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                    self._bind(node.target, node.value)
                elif isinstance(node, ast.FunctionDef):
                    self.functions[node.name] = [n.value for n in ast.walk(node)
                                                 if isinstance(n, ast.Return) and n.value is not None]

    def _bind(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            self.assigned.setdefault(target.id, []).append(value)
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):
                self._bind(t, v)

    def printed(self) -> list[tuple[int, str]]:
        """``(line number, text)`` of every alternative of every printed or appended text."""
        out = []
        for tree in self.trees:
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                if isinstance(func, ast.Name) and func.id == "print":
                    args = node.args
                elif isinstance(func, ast.Attribute) and func.attr == "append" and len(node.args) == 1:
                    args = node.args if self._is_text(node.args[0]) else []
                else:
                    continue
                for arg in args:
                    out += [(node.lineno, s) for s in self.render(arg)]
        return out

    def _is_text(self, e: ast.expr) -> bool:
        return isinstance(e, (ast.JoinedStr, ast.BinOp, ast.IfExp)) or (
            isinstance(e, ast.Constant) and isinstance(e.value, str))

    def render(self, e: ast.expr, depth: int = 0) -> list[str]:
        """The alternatives of ``e`` as printed text (module docstring)."""
        if depth > 12:
            return [NUMBER]
        r = lambda x: self.render(x, depth + 1)  # noqa: E731
        if isinstance(e, ast.Constant):
            return [e.value if isinstance(e.value, str) else NUMBER]
        if isinstance(e, ast.JoinedStr):
            return _product([r(v) if not isinstance(v, ast.FormattedValue) else self._placeholder(v, depth)
                             for v in e.values])
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
            return _product([r(e.left), r(e.right)])
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mod) and isinstance(e.left, ast.Constant):
            return [str(e.left.value).replace("%s", NUMBER).replace("%d", "1")]
        if isinstance(e, ast.IfExp):
            return _cap(r(e.body) + r(e.orelse))
        if isinstance(e, ast.BoolOp):
            return _cap([s for v in e.values for s in r(v)])
        if isinstance(e, ast.Dict):
            return _cap([s for v in e.values for s in r(v)])
        if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
            return _cap([s for v in e.elts for s in r(v)]) or [NUMBER]
        if isinstance(e, ast.Subscript):
            return r(e.value)
        if isinstance(e, ast.Name):
            values = self.assigned.get(e.id, [])
            texts = [s for v in values for s in r(v) if s != NUMBER]
            return _cap(texts) or [NUMBER]
        if isinstance(e, (ast.GeneratorExp, ast.ListComp)):
            return r(e.elt)
        if isinstance(e, ast.Call):
            f = e.func
            if isinstance(f, ast.Attribute) and f.attr == "join" and e.args:
                sep = r(f.value)
                return _product([r(e.args[0]), sep, r(e.args[0])])  # two elements show the separator
            if isinstance(f, ast.Attribute) and f.attr == "get" and isinstance(f.value, ast.Dict):
                return _cap(r(f.value) + (r(e.args[1]) if len(e.args) > 1 else []))
            if isinstance(f, ast.Attribute) and f.attr in ("format", "strip", "rstrip", "lstrip", "upper", "lower"):
                return r(f.value)
            if isinstance(f, ast.Name) and f.id in self.functions:
                return _cap([s for v in self.functions[f.id] for s in r(v)]) or [NUMBER]
            if isinstance(f, ast.Name) and f.id == "str" and e.args:
                return r(e.args[0])
        return [NUMBER]

    def _placeholder(self, v: ast.FormattedValue, depth: int) -> list[str]:
        """A placeholder's text: the strings its expression can hold (a name bound to sentences), else a number."""
        texts = [s for s in self.render(v.value, depth + 1) if s != NUMBER]
        return texts or [_number(v)]


def _number(v: ast.FormattedValue) -> str:
    spec = "".join(p.value for p in getattr(v.format_spec, "values", []) if isinstance(p, ast.Constant))
    return "12%" if spec.endswith("%") else NUMBER


def _product(parts: list[list[str]]) -> list[str]:
    return _cap(["".join(c) for c in itertools.islice(itertools.product(*parts), MAX_ALTERNATIVES)])


def _cap(texts: list[str]) -> list[str]:
    return list(dict.fromkeys(texts))[:MAX_ALTERNATIVES]


def _strip_magics(source: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def code_cells(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def bad_lines(sources: list[str]) -> list[tuple[int, str]]:
    """The printed texts (line number in their cell, text line) that ``verdicts.unsupported`` flags."""
    out = []
    for lineno, text in PrintedText(sources).printed():
        out += [(lineno, line) for line in verdicts.unsupported(text)]
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_printed_verdict_stands_on_an_interval(path):
    sources = code_cells(path)
    texts = PrintedText(sources).printed()
    assert len(texts) >= 3, f"{path.stem}: the extractor found only {len(texts)} printed texts"
    bad = bad_lines(sources)
    assert not bad, f"{path.stem} can print verdicts without a measured interval:\n" + "\n".join(
        f"  cell line {n}: {line}" for n, line in bad)


@pytest.mark.parametrize("module", SENTENCE_MODULES)
def test_every_verdict_the_package_builds_for_a_notebook_stands_on_an_interval(module):
    source = (paths.REPO_ROOT / module).read_text(encoding="utf-8")
    assert len(PrintedText([source]).printed()) >= 1, f"{module}: the extractor found no line it builds"
    bad = bad_lines([source])
    assert not bad, f"{module} can build verdicts without a measured interval:\n" + "\n".join(
        f"  line {n}: {line}" for n, line in bad)


def test_the_notebooks_print_the_package_sentences_they_rely_on():
    """Notebook 03 prints what the sentence modules build: if a notebook stopped calling them, the check above
    would be checking text nobody prints (and the notebook's own would go unchecked)."""
    source = "\n".join(code_cells(paths.NOTEBOOKS_DIR / "03_m2_speedup_runs.ipynb"))
    for call in ("narrative.summary_lines(", "narrative.batch_lines(", "controls.session_report(", "sweep_lines(",
                 "xd.cross_report(", "xd.generator_lines(", "greedy_check("):
        assert call in source, call


def test_a_planted_verdict_in_a_module_is_caught():
    planted = '''
def lines_for(table):
    lines = []
    for _, r in table.iterrows():
        lines.append(f"{r['label']}: SPADE beats HF assisted generation ({r['speedup']:.2f}x)")
        lines.append(f"{r['label']}: {r['speedup']:.2f}x [{r['low']:.2f}, {r['high']:.2f}], so it pays")
    return lines
'''
    bad = [line for _, line in bad_lines([planted])]
    assert len(bad) == 1 and "beats HF assisted" in bad[0]


@pytest.mark.parametrize("module", sorted(SECTION_MODULES))
def test_the_section_modules_of_notebooks_04_05_build_no_printed_text(module):
    """A module a notebook calls for a whole section builds no line it prints: if one starts to (a ``print``,
    an appended sentence), it joins :data:`SENTENCE_MODULES`, whose verdicts are checked where they are built."""
    source = (paths.REPO_ROOT / module).read_text(encoding="utf-8")
    texts = PrintedText([source]).printed()
    assert not texts or module in SENTENCE_MODULES, (
        f"{module} builds printed text {texts[:3]}: add it to SENTENCE_MODULES so its verdicts are checked")
    notebooks = "\n".join(s for p in NOTEBOOKS if p.stem[:2] in ("04", "05") for s in code_cells(p))
    assert SECTION_MODULES[module] in notebooks, f"notebooks 04/05 no longer call {module}"


def test_a_section_module_that_builds_a_sentence_is_seen():
    planted = '''
def run(pair, suite):
    rows = []
    print(f"{len(rows)} runs ready")
    rows.append(f"tree beats chain ({tau:.2f})")
    return rows
'''
    assert len(PrintedText([planted]).printed()) == 2


def test_the_walkthrough_notebooks_are_all_checked():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["02", "03", "04", "05"]


def test_a_planted_verdict_without_an_interval_is_caught():
    """Bad lines planted in each form the notebooks use are flagged; their sound twins are not."""
    planted = '''
def interval(r):
    return f"{r['speedup']:.2f}x [{r['speedup_low']:.2f}, {r['speedup_high']:.2f}]"

word = "beats" if gain > 0 else "trails"
lines = []
print(f"T={T:g}: the tree beats the chain ({tau:.2f} vs {tau_c:.2f})")
print(f"the best rule {word} the fixed gamma by {gain:+.1%}")
lines.append(f"{d}: conditional acceptance flat at {a:.3f} (the i.i.d. model holds)")
print("\\n".join(lines))
print("speedup " + ("stops paying at B = 4" if stop else "still pays") + f" ({s:.2f}x)")
'''
    bad = [line for _, line in bad_lines([planted])]
    assert len(bad) == 5, bad
    assert any("the tree beats the chain" in b for b in bad)
    assert any("best rule beats the fixed gamma" in b for b in bad)  # found through the name `word`
    assert any("model holds" in b for b in bad)                      # an appended line
    assert sum("paying" in b or "pays" in b for b in bad) == 2       # both branches of the conditional
    sound = '''
def interval(r):
    return f"{r['speedup']:.2f}x [{r['speedup_low']:.2f}, {r['speedup_high']:.2f}]"

print(f"T={T:g}: the tree beats the chain: {interval(tree)} against {interval(chain)}")
print(f"stops paying at B = {b}: {s:.2f}x [{lo:.2f}, {hi:.2f}] lies below 1" if b else "cannot tell where it stops paying")
print(f"predicted {p:.2f}x at its best gamma (not timed: a prediction, not a verdict)")
'''
    assert bad_lines([sound]) == []


def _newest_executed(stem: str) -> Path | None:
    found = sorted((p for p in (paths.RUNS_DIR / "notebooks").glob(f"**/{stem}.ipynb")), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_executed_outputs_carry_no_unsupported_verdict(path):
    executed = _newest_executed(path.stem)
    if executed is None:
        pytest.skip(f"no executed copy of {path.stem} under {paths.RUNS_DIR / 'notebooks'}")
    nb = nbformat.read(executed, as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                     if o.get("output_type") == "stream" and o.get("name") == "stdout")
    assert not verdicts.unsupported(text), f"{executed}: {verdicts.unsupported(text)}"
