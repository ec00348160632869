"""Notebook parameters: declared once, validated strictly, with named profiles.

Every SPADE notebook declares its parameters in one cell tagged ``parameters`` whose first line is
``# SPADE parameters``, one annotated assignment per line, and calls :func:`setup_notebook` in the next cell::

    # SPADE parameters
    n_prompts: int = 8  # prompts per category
    pair: str = "default"  # embedded pair name; range: one of ["tiny", "default"]
    gamma: int = 4  # draft length; range: [1, inf)

:func:`setup_notebook` reads this cell and papermill's injected-overrides cell back from IPython's history (``In``;
where none is kept, as under nbval, from ``notebooks/<notebook>.ipynb``, nothing injected), then (1) rejects injected
names the notebook does not declare, listing the declared ones (papermill only warns); (2) applies the profile
``SPADE_PROFILE`` (or a declared ``profile`` parameter): ``params/<profile>/<notebook stem>.yaml`` (a flat mapping, as
``papermill -f`` takes) replaces the defaults of every parameter papermill did *not* inject; (3) checks each value
against its annotation (``int``, ``float``, ``str``, ``bool``, ``list[...]``, ``dict``, ``X | None``; ints accepted as
floats); (4) checks it against its range, before the notebook prints anything; (5) sets the plotting style and
returns a :class:`NotebookParams` namespace, also written into the notebook's globals.

**Ranges** follow the description in the comment as ``range: <spec>``: an interval ``[a, b]``, ``(a, b]``, ``[a, b)``
or ``(a, b)``, with ``inf`` / ``-inf`` allowed as bounds (``range: (0, inf)``); a choice ``one of [<literal>, ...]``;
or comparisons ``> a``, ``< b`` (also ``>= a``, ``<= b``) combined with ``and``. Prefer intervals: papermill's
``--help-notebook`` drops a parameter line with two ``=`` signs, so ``>=`` hides it (``tests/test_notebooks.py``
checks every parameter stays listed). A range applies to a number, to every element of a ``list[...]``, never to
``None`` (for ``X | None``); a malformed range is an error when the cell is parsed.
"""

from __future__ import annotations

import ast
import os
import types
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from spade_lib.paths import NOTEBOOKS_DIR, PARAMS_DIR

MARKER = "# SPADE parameters"
PAPERMILL_MARKER = "# Parameters"


class ParameterError(ValueError):
    """A notebook parameter is unknown or has a value of the wrong type."""


@dataclass(frozen=True)
class Declared:
    name: str
    annotation: str
    default: Any
    comment: str
    range: str | None = None  # the ``range:`` spec of the comment (see the module docstring)


class NotebookParams(types.SimpleNamespace):
    """The resolved parameters of one notebook run (attribute access, ``dict(vars(P))``)."""

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def parse_parameters_cell(source: str) -> dict[str, Declared]:
    """Parse a ``parameters`` cell: annotated assignments with literal defaults and a comment."""
    if not source.lstrip().startswith(MARKER):
        raise ParameterError(f"a SPADE parameters cell must start with {MARKER!r}")
    declared: dict[str, Declared] = {}
    lines = source.splitlines()
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            line = lines[node.lineno - 1]
            comment = line.split("#", 1)[1].strip() if "#" in line[node.value.end_col_offset:] else ""
            rng = comment.rsplit("range:", 1)[1].strip() if "range:" in comment else None
            if rng is not None:
                _parse_range(rng, node.target.id)  # malformed ranges fail here
            declared[node.target.id] = Declared(
                name=node.target.id,
                annotation=ast.unparse(node.annotation),
                default=ast.literal_eval(node.value),
                comment=comment,
                range=rng,
            )
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            raise ParameterError(
                f"line {node.lineno} of the parameters cell: every parameter needs a type annotation "
                "and a literal default, e.g. `n_prompts: int = 8  # prompts per category`"
            )
    return declared


_OPS = {">=": lambda v, b: v >= b, ">": lambda v, b: v > b, "<=": lambda v, b: v <= b, "<": lambda v, b: v < b}


def _bound(text: str) -> float | int:
    text = text.strip()
    if text in ("inf", "+inf", "-inf"):
        return float(text)
    value = ast.literal_eval(text)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(text)
    return value


def _parse_range(spec: str, name: str) -> list[tuple[str, Any]]:
    """``spec`` as a list of ``(op, bound)`` tests (``op`` in ``_OPS`` or ``"in"``)."""
    spec = spec.strip()
    try:
        if spec.startswith("one of"):
            choices = ast.literal_eval(spec[len("one of"):].strip())
            if not isinstance(choices, (list, tuple, set)) or not choices:
                raise ValueError
            return [("in", list(choices))]
        if spec[:1] in "[(" and spec[-1:] in "])":
            lo, hi = (_bound(x) for x in spec[1:-1].split(","))
            return [(">=" if spec[0] == "[" else ">", lo), ("<=" if spec[-1] == "]" else "<", hi)]
        tests = []
        for part in spec.split(" and "):
            part = part.strip()
            op = next(o for o in (">=", "<=", ">", "<") if part.startswith(o))
            tests.append((op, _bound(part[len(op):])))
        return tests
    except (ValueError, SyntaxError, StopIteration, TypeError):
        raise ParameterError(
            f"parameter {name!r}: malformed range {spec!r}; write e.g. `range: [1, inf)`, `range: (0, 1]`, "
            "`range: > 0` or `range: one of [\"a\", \"b\"]`"
        ) from None


def check_range(name: str, value: Any, spec: str | None, notebook: str = "") -> None:
    """Raise :class:`ParameterError` unless ``value`` (each element of a list; None passes) lies in
    the declared range ``spec``."""
    if spec is None or value is None:
        return
    tests = _parse_range(spec, name)
    items = value if isinstance(value, (list, tuple)) else [value]
    for item in items:
        ok = True
        for op, bound in tests:
            if op == "in":
                ok = ok and item in bound
            elif isinstance(item, (int, float)) and not isinstance(item, bool):
                ok = ok and item == item and _OPS[op](item, bound)  # NaN is never in range
        if not ok:
            where = f" of notebook {notebook!r}" if notebook else ""
            raise ParameterError(f"parameter {name!r}{where}: must satisfy range {spec}, got {value!r}")


def _type_ok(value: Any, annotation: str) -> bool:
    """Whether ``value`` fits the annotation string (a small, explicit subset of typing)."""
    ann = annotation.replace(" ", "")
    if "|" in ann:
        return any(_type_ok(value, part) for part in ann.split("|"))
    if ann in ("None", "NoneType"):
        return value is None
    if ann == "Any":
        return True
    if ann == "bool":
        return isinstance(value, bool)
    if ann == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if ann == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if ann == "str":
        return isinstance(value, str)
    if ann.startswith(("list[", "tuple[")) and ann.endswith("]"):
        inner = ann[ann.index("[") + 1 : -1]
        if inner.endswith(",..."):
            inner = inner[:-4]
        return isinstance(value, (list, tuple)) and all(_type_ok(v, inner) for v in value)
    if ann in ("list", "tuple"):
        return isinstance(value, (list, tuple))
    if ann.startswith("dict"):
        return isinstance(value, dict)
    raise ParameterError(f"unsupported parameter annotation {annotation!r}")


def load_profile(profile: str, notebook: str, params_dir: Path = PARAMS_DIR) -> dict[str, Any]:
    """Values of ``params/<profile>/<notebook>.yaml`` (empty when the profile has no file for it)."""
    folder = Path(params_dir) / profile
    if not folder.is_dir():
        known = sorted(p.name for p in Path(params_dir).iterdir() if p.is_dir())
        raise ParameterError(f"unknown parameter profile {profile!r}: no folder {folder} (known: {known})")
    path = folder / f"{notebook}.yaml"
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ParameterError(f"{path} must hold a flat mapping of parameter name -> value")
    return data


def parameters_cell_source(notebook_path: Path) -> str:
    """Source of the cell tagged ``parameters`` in a notebook file."""
    import nbformat

    if not notebook_path.is_file():
        raise ParameterError(
            f"no executed cell starting with {MARKER!r} in this kernel's history and no notebook file "
            f"{notebook_path}: pass the notebook's stem to setup_notebook and run the parameters cell first"
        )
    nb = nbformat.read(notebook_path, as_version=4)
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return cell.source
    raise ParameterError(f"{notebook_path} has no cell tagged 'parameters'")


def _history_cells(namespace: dict[str, Any]) -> list[str]:
    history = namespace.get("In") or namespace.get("_ih") or []
    return [cell for cell in history if isinstance(cell, str)]


def _find_cells(namespace: dict[str, Any]) -> tuple[str | None, str | None]:
    """The last declared parameters cell in the history and papermill's injected cell after it."""
    cells = _history_cells(namespace)
    declared_idx = max((i for i, c in enumerate(cells) if c.lstrip().startswith(MARKER)), default=None)
    if declared_idx is None:
        return None, None
    injected = None
    for cell in cells[declared_idx + 1 :]:
        if cell.lstrip().startswith(PAPERMILL_MARKER) and not cell.lstrip().startswith(MARKER):
            injected = cell
    return cells[declared_idx], injected


def _injected_names(source: str) -> list[str]:
    return [
        t.id
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    ]


def resolve(
    declared: dict[str, Declared],
    current: dict[str, Any],
    injected: list[str],
    notebook: str,
    profile: str | None,
    params_dir: Path = PARAMS_DIR,
) -> NotebookParams:
    """Pure core of :func:`setup_notebook`: validate names and types and apply a profile."""
    unknown = [n for n in injected if n not in declared]
    if unknown:
        raise ParameterError(
            f"unknown parameter(s) {unknown} for notebook {notebook!r}; "
            f"declared parameters: {sorted(declared)}"
        )
    values = {name: current.get(name, d.default) for name, d in declared.items()}
    if profile and profile != "default":
        overrides = load_profile(profile, notebook, params_dir)
        bad = [n for n in overrides if n not in declared]
        if bad:
            raise ParameterError(
                f"profile {profile!r} sets unknown parameter(s) {bad} for notebook {notebook!r}; "
                f"declared parameters: {sorted(declared)}"
            )
        for name, value in overrides.items():
            if name not in injected:
                values[name] = value
    for name, value in values.items():
        if not _type_ok(value, declared[name].annotation):
            raise ParameterError(
                f"parameter {name!r} of notebook {notebook!r} must be {declared[name].annotation}, "
                f"got {value!r} ({type(value).__name__})"
            )
        check_range(name, value, declared[name].range, notebook)
    return NotebookParams(**values)


def quiet_widget_warning() -> None:
    """Ignore the one warning ``tqdm.auto`` raises on import in a Jupyter kernel without ``ipywidgets`` ("IProgress
    not found": it cannot draw widget bars). ``transformers`` imports ``tqdm.auto`` with itself, so without this
    every notebook's first model import prints it; an executed notebook draws no bars anyway (the runbook sets
    ``TQDM_DISABLE``). Every other ``TqdmWarning`` is still shown."""
    from tqdm import TqdmWarning

    warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)


def setup_notebook(namespace: dict[str, Any], notebook: str, *, show: bool = True) -> NotebookParams:
    """Validate this notebook's parameters, apply the active profile, set the plot style.

    Call as ``P = setup_notebook(globals(), "03_m2_speedup_runs")`` right after the parameters cell.
    """
    declared_src, injected_src = _find_cells(namespace)
    if declared_src is None:  # no input history (nbval, plain Python): read the notebook file itself
        declared_src = parameters_cell_source(NOTEBOOKS_DIR / f"{notebook}.ipynb")
    declared = parse_parameters_cell(declared_src)
    injected = _injected_names(injected_src) if injected_src else []
    profile = os.environ.get("SPADE_PROFILE") or namespace.get("profile")
    params = resolve(declared, namespace, injected, notebook, profile)
    namespace.update(params.as_dict())

    from spade_lib.plots import use_style

    use_style()
    quiet_widget_warning()
    if show:
        shown = ", ".join(f"{k}={v!r}" for k, v in params.as_dict().items())
        print(f"[{notebook}] profile={profile or 'default'}: {shown}")
    return params
