"""Static checks of the walk-through notebooks (nbval executes them; this checks their shape).

A stripped ``parameters`` tag makes papermill silently run old defaults and a stripped kernelspec
breaks papermill, so both are checked here, together with the parameter profiles.
"""

import re

import nbformat
import pytest
import yaml

from spade_lib.params import MARKER, parse_parameters_cell
from spade_lib.paths import NOTEBOOKS_DIR, PARAMS_DIR
from spade_lib.runbook import numbered_notebooks

NOTEBOOKS = numbered_notebooks()


def test_the_walkthrough_notebooks_exist_in_order():
    stems = [nb.stem for nb in NOTEBOOKS]
    assert stems[:4] == [
        "01_m1_build_benchmark",
        "02_m2_acceptance_math",
        "03_m2_speedup_runs",
        "04_m3_rejection_diagnostics",
    ], stems
    numbers = [int(s[:2]) for s in stems]
    assert numbers == sorted(set(numbers))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_shape(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", "kernelspec missing"
    assert nb.cells[0].cell_type == "markdown", "first cell must introduce the notebook"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    assert tagged[0].source.startswith(MARKER)
    declared = parse_parameters_cell(tagged[0].source)
    assert declared, "the parameters cell declares nothing"
    for d in declared.values():
        assert d.comment, f"parameter {d.name} has no comment"
    index = nb.cells.index(tagged[0])
    follow = nb.cells[index + 1].source
    assert re.search(rf"setup_notebook\(globals\(\), \"{path.stem}\"\)", follow), (
        "the cell after the parameters cell must call setup_notebook(globals(), \"<stem>\")"
    )
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.get("outputs") or cell.execution_count is not None, "stale outputs"


# params/cli/ holds run configs of the command line (spade_lib.runs.cli), not notebook profiles
@pytest.mark.parametrize("profile", sorted(p.name for p in PARAMS_DIR.iterdir() if p.is_dir() and p.name != "cli"))
def test_profiles_only_set_declared_parameters(profile):
    stems = {nb.stem: nb for nb in NOTEBOOKS}
    for file in sorted((PARAMS_DIR / profile).glob("*.yaml")):
        assert file.stem in stems, f"{file} names no notebook"
        nb = nbformat.read(stems[file.stem], as_version=4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        declared = parse_parameters_cell(cell.source)
        values = yaml.safe_load(file.read_text()) or {}
        unknown = sorted(set(values) - set(declared))
        assert not unknown, f"{file} sets undeclared parameters {unknown}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_documents_every_parameter(path):
    """`papermill --help-notebook` must list every declared parameter (it drops lines it cannot parse)."""
    import papermill

    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    declared = parse_parameters_cell(cell.source)
    inferred = papermill.inspect_notebook(str(path))
    assert sorted(inferred) == sorted(declared)
    for name, d in declared.items():
        assert inferred[name]["help"] == d.comment, name


MODEL_BACKED = ["03_m2_speedup_runs", "04_m3_rejection_diagnostics", "05_whatif_replay"]


@pytest.mark.parametrize("stem", MODEL_BACKED)
def test_model_backed_notebooks_take_a_pair_and_share_the_setup(stem):
    """Each declares the pair parameters (so papermill lists them) and gets pair, suite and its runs'
    shared fields from spade_lib.experiment, never from pasted code."""
    from spade_lib.experiment import PAIR_PARAMETERS

    path = NOTEBOOKS_DIR / f"{stem}.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    declared = parse_parameters_cell(cell.source)
    assert set(PAIR_PARAMETERS) <= set(declared), sorted(set(PAIR_PARAMETERS) - set(declared))
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "experiment.from_params(P)" in code
    for pasted in ("load_suite(", "default_suite(", "load_pair(", "DATA_DIR"):
        assert pasted not in code, f"{stem} resolves its own pair or suite ({pasted})"
    # the run parameters every run shares come from the experiment, not a pasted dict
    assert "E.run_config(" in code and "common = dict(" not in code and "RunConfig(" not in code, stem
    saved = re.findall(r"save_figure\(fig, ([^)]*\))", code)
    assert saved and all(s.startswith("E.figure_name(") for s in saved), saved


def test_figure_names_are_unique_across_notebooks():
    names = {}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        for name in re.findall(r"save_figure\(fig, (?:E\.figure_name\()?\"([a-z0-9_]+)\"", code):
            assert name not in names, f"figure {name} is written by {names.get(name)} and {path.stem}"
            names[name] = path.stem


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_imports_resolve(path):
    """Every ``import`` / ``from ... import`` of a code cell names a module and names that exist (a moved
    module or function breaks here, not only when nbval executes the notebook)."""
    import ast
    import importlib
    import importlib.util

    nb = nbformat.read(path, as_version=4)
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    importlib.import_module(alias.name)
            elif isinstance(node, ast.ImportFrom):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), \
                        f"{path.stem}: from {node.module} import {alias.name}"
