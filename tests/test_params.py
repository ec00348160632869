"""Notebook parameters: unknown names and bad types fail the run; profiles fill in defaults."""

import pytest

from spade_lib.params import ParameterError, parse_parameters_cell, resolve, setup_notebook

CELL = """# SPADE parameters
n_prompts: int = 8  # prompts per category
temperature: float = 1.0  # sampling temperature
pair: str = "default"  # embedded pair name
gammas: list[int] = [1, 2, 4]  # draft lengths to sweep
device: str | None = None  # None = auto
"""


def test_parse_reads_names_types_defaults_comments():
    declared = parse_parameters_cell(CELL)
    assert list(declared) == ["n_prompts", "temperature", "pair", "gammas", "device"]
    assert declared["gammas"].default == [1, 2, 4]
    assert declared["n_prompts"].annotation == "int"
    assert declared["n_prompts"].comment == "prompts per category"


def test_unannotated_assignment_is_refused():
    with pytest.raises(ParameterError, match="type annotation"):
        parse_parameters_cell("# SPADE parameters\nx = 3\n")


def test_unknown_parameter_is_rejected():
    declared = parse_parameters_cell(CELL)
    with pytest.raises(ParameterError, match=r"unknown parameter\(s\) \['n_promts'\].*declared parameters"):
        resolve(declared, {"n_promts": 3}, ["n_promts"], "nb", None)


@pytest.mark.parametrize(
    "name, value",
    [("n_prompts", "8"), ("n_prompts", 2.5), ("n_prompts", True), ("temperature", "hot"),
     ("gammas", [1, "2"]), ("device", 3)],
)
def test_bad_type_is_rejected(name, value):
    declared = parse_parameters_cell(CELL)
    with pytest.raises(ParameterError, match=f"parameter '{name}'"):
        resolve(declared, {name: value}, [name], "nb", None)


def test_good_values_pass_and_int_is_a_float():
    declared = parse_parameters_cell(CELL)
    p = resolve(declared, {"temperature": 0, "device": "cpu"}, ["temperature", "device"], "nb", None)
    assert p.temperature == 0 and p.device == "cpu" and p.n_prompts == 8


def test_profile_fills_defaults_but_explicit_values_win(tmp_path):
    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "nb.yaml").write_text("n_prompts: 2\npair: tiny\n")
    declared = parse_parameters_cell(CELL)
    p = resolve(declared, {"pair": "default", "n_prompts": 5}, ["n_prompts"], "nb", "smoke", tmp_path)
    assert p.n_prompts == 5  # injected by papermill: wins
    assert p.pair == "tiny"  # not injected: the profile applies


def test_profile_errors(tmp_path):
    declared = parse_parameters_cell(CELL)
    with pytest.raises(ParameterError, match="unknown parameter profile 'nope'"):
        resolve(declared, {}, [], "nb", "nope", tmp_path)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "nb.yaml").write_text("n_prompt: 2\n")
    with pytest.raises(ParameterError, match="sets unknown parameter"):
        resolve(declared, {}, [], "nb", "bad", tmp_path)


def test_setup_notebook_reads_ipython_history(monkeypatch):
    monkeypatch.delenv("SPADE_PROFILE", raising=False)
    injected = "# Parameters\nn_prompts = 3\n"
    ns = {"In": ["", CELL, injected, "P = setup_notebook(globals(), 'nb')"], "n_prompts": 3,
          "temperature": 1.0, "pair": "default", "gammas": [1, 2, 4], "device": None}
    p = setup_notebook(ns, "nb", show=False)
    assert p.n_prompts == 3
    ns["In"][2] = "# Parameters\nn_prompts = 3\nbogus = 1\n"
    with pytest.raises(ParameterError, match="bogus"):
        setup_notebook(ns, "nb", show=False)


def test_only_tqdms_missing_widgets_warning_is_quietened():
    """Issue 56: the executed notebooks carry no library warnings; tqdm.auto's "IProgress not found" (raised on
    transformers' import in a kernel without ipywidgets) is ignored, every other tqdm warning is not."""
    import warnings

    from tqdm import TqdmWarning

    from spade_lib.params import quiet_widget_warning

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_widget_warning()
        warnings.warn("IProgress not found. Please update jupyter and ipywidgets.", TqdmWarning)
        warnings.warn("some other tqdm warning", TqdmWarning)
    assert [str(w.message) for w in seen] == ["some other tqdm warning"]
