"""The package top's front door (``spade_lib/__init__.py``): lazy, one object per name, and the README's example.

Every front-door name must be the very object its defining module holds (no second copy, no wrapper),
defined there (``__module__``), and importing ``spade_lib`` alone must import no submodule, torch or
pandas (checked in a fresh interpreter, whose ``sys.modules`` this process has not filled). The
README's Python block is executed as written (``test_readme_example``), so what the README claims about
the API is true.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import spade_lib
from spade_lib import paths

REPO = Path(__file__).resolve().parents[1]
TABLE = spade_lib._FRONT_DOOR


def test_the_table_names_the_brief_api():
    wanted = {"load_pair", "SpeculativeDecoder", "AutoregressiveDecoder", "make_drafter", "SamplingConfig",
              "get_policy", "read_trace", "RunConfig", "load_suite", "default_suite", "position_acceptance",
              "expected_vs_realised"}
    assert wanted <= set(TABLE)
    assert set(spade_lib.__all__) == set(TABLE) | {"__version__"}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_name_is_its_defining_module_object(name):
    module_name, attr = TABLE[name].split(":")
    module = importlib.import_module(module_name)
    obj = getattr(module, attr)
    assert getattr(spade_lib, name) is obj
    assert obj.__module__ == module_name, f"{name}: defined in {obj.__module__}, the table says {module_name}"
    assert attr == name and name in dir(spade_lib)
    namespace: dict = {}
    exec(f"from spade_lib import {name}", namespace)
    assert namespace[name] is obj


def test_unknown_names_raise_attribute_error_naming_them():
    with pytest.raises(AttributeError, match="'no_such_name'"):
        spade_lib.no_such_name  # noqa: B018
    with pytest.raises(ImportError, match="no_such_name"):
        exec("from spade_lib import no_such_name", {})
    assert not hasattr(spade_lib, "verify_tree")  # a name of a submodule is not a front-door name
    from spade_lib import io  # submodules still import as submodules (the fallback of `from ... import`)
    assert io.__name__ == "spade_lib.io"


def test_import_spade_lib_is_cheap():
    code = ("import json, sys; import spade_lib; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('spade_lib', 'torch', 'transformers', 'pandas', 'numpy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert json.loads(out.stdout) == ["spade_lib"]
    code = ("import json, sys; from spade_lib import SamplingConfig; "
            "print(json.dumps('spade_lib.sampling' in sys.modules and 'spade_lib.zoo.pairs' not in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert json.loads(out.stdout) is True  # one name imports its own module, not the whole table


def test_no_module_of_the_package_imports_from_the_front_door():
    """The layer contract does not cover the package top, so an ``from spade_lib import load_pair`` inside
    the package would be an upward import nobody sees: refused here."""
    offenders = []
    for path in sorted((REPO / "spade_lib").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "spade_lib" and node.level == 0:
                offenders += [f"{path.relative_to(REPO)}:{node.lineno} {a.name}" for a in node.names if a.name in TABLE]
            if isinstance(node, ast.Attribute) and node.attr in TABLE and isinstance(node.value, ast.Name) \
                    and node.value.id == "spade_lib":
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} spade_lib.{node.attr}")
    assert offenders == []


def readme_python() -> str:
    """The README's one ``python`` code block."""
    blocks = re.findall(r"^```python\n(.*?)^```$", (REPO / "README.md").read_text(), flags=re.S | re.M)
    assert len(blocks) == 1, f"README.md: expected one ```python block, found {len(blocks)}"
    return blocks[0]


def test_readme_example_uses_the_front_door():
    code = readme_python()
    tree = ast.parse(code)
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    spade = [n for n in imports if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("spade_lib")]
    assert spade and all(n.module == "spade_lib" for n in spade)
    assert all(a.name in TABLE for n in spade for a in n.names)
    assert len(code.splitlines()) <= 30


@pytest.mark.slow
def test_readme_example(tmp_path, monkeypatch, capsys):
    """The README's Python block, executed as written (its run folder under ``tmp_path``)."""
    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path / "runs")
    exec(compile(readme_python(), "README.md", "exec"), {"__name__": "readme_example"})
    out = capsys.readouterr().out
    assert "T = 0" in out and "alpha_cond" in out and "p_value" in out
    assert list((tmp_path / "runs" / "traces" / "tiny").rglob("*.parquet"))
