"""The experiment helper: suite resolution in one place, the pair from notebook parameters."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from spade_lib import experiment, paths


def test_figure_names_are_unique_per_pair():
    assert experiment.figure_name("m2_speedup_runs", "default") == "m2_speedup_runs"
    assert experiment.figure_name("m2_speedup_runs", "smollm2") == "m2_speedup_runs-smollm2"
    assert experiment.figure_name("m3_x", "Qwen/Qwen2.5-7B") == "m3_x-Qwen-Qwen2.5-7B"
    with pytest.raises(ValueError, match="base"):
        experiment.figure_name("a/b", "default")


def test_chat_template_spelling():
    assert experiment.chat_template_value("always") is True
    assert experiment.chat_template_value("auto") == "auto"
    with pytest.raises(ValueError, match="chat_template"):
        experiment.chat_template_value("yes")


def test_suite_paths_resolve_against_the_repo_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a notebook runs in notebooks/: relative paths must not depend on it
    assert experiment.suite_path("data/embedded.jsonl") == paths.REPO_ROOT / "data" / "embedded.jsonl"
    assert experiment.suite_path("embedded") == paths.DATA_DIR / "embedded.jsonl"
    absolute = tmp_path / "s.jsonl"
    assert experiment.suite_path(str(absolute)) == absolute
    with pytest.raises(FileNotFoundError, match="suite"):
        experiment.resolve_suite("nowhere/missing.jsonl")
    with pytest.raises(ValueError, match="no M1 source named"):
        experiment.resolve_suite("no_such_source_xyz")
    with pytest.raises(ValueError, match="suite"):
        experiment.suite_path("")


def test_resolve_suite_cuts_per_category():
    full, cut = experiment.resolve_suite("embedded", n_per_category=1)
    assert len(cut) == len(full.categories) and cut.categories == full.categories
    full2, same = experiment.resolve_suite(os.path.relpath(paths.DATA_DIR / "embedded.jsonl", paths.REPO_ROOT))
    assert full2.sha256 == full.sha256 == same.sha256


def test_from_params_loads_the_tiny_pair():
    before = torch.get_num_threads()
    try:
        params = dict(pair="tiny", target_id="", draft_id="", device="auto", dtype="float32", suite="embedded",
                      n_per_category=1, threads=1)
        e = experiment.from_params(params)
        assert e.pair.name == "tiny" and e.device == torch.device("cpu") and e.threads == 1
        assert len(e.suite) == len(e.categories)
        assert "pair 'tiny'" in e.describe() and e.figure_name("m3_a") == "m3_a-tiny"
        with pytest.raises(ValueError, match="missing"):
            experiment.from_params({"pair": "tiny"})
        with pytest.raises(ValueError, match="draft_id"):
            experiment.load_experiment("tiny", draft_id="x")
        with pytest.raises(TypeError, match="device"):
            experiment.load_experiment("tiny", device=None)
        with pytest.raises(ValueError, match="head_profile: must be one of \\['long', 'make'\\], got 'longer'"):
            experiment.from_params({**params, "heads": ["eagle3"], "head_profile": "longer"})
    finally:
        torch.set_num_threads(before)


def test_drafts_named_reads_every_draft_parameter_once():
    values = dict(main_draft="a", compare_drafts=["b", "a"], cross_drafts=[], drafts=["c"], cost_draft="",
                  crossvocab_draft="x", gammas=[1, 2], draft_id="")
    assert experiment.drafts_named(values) == ["a", "b", "c", "x"]
    assert experiment.drafts_named({"draft_id": "some/folder", "main_draft": "draft"}) == ["draft"]
    assert experiment.drafts_named({"pair": "tiny"}) == []


@pytest.mark.parametrize("declares_n_samples", [False, True])
def test_run_config_equals_the_notebooks_common_fields(declares_n_samples):
    """E.run_config(...) against the ``common = dict(...)`` notebooks 03/04 (without n_samples) and 05
    (with it) pasted: the same RunConfig, hence the same run folder."""
    from spade_lib.runs.config import RunConfig

    before = torch.get_num_threads()
    try:
        params = dict(pair="tiny", target_id="", draft_id="", device="auto", dtype="float32", suite="embedded",
                      n_per_category=1, threads=1, max_new_tokens=24, max_prompt_tokens=32, chat_template="never",
                      seed=5, gamma=3, temperature=0.5, repeats=2, warmup=0)
        if declares_n_samples:
            params["n_samples"] = 2
        E = experiment.from_params(params)
        common = dict(max_new_tokens=params["max_new_tokens"], max_prompt_tokens=params["max_prompt_tokens"],
                      chat_template=experiment.chat_template_value(params["chat_template"]), device=str(E.device),
                      dtype=params["dtype"], seed=params["seed"], threads=E.threads)
        if declares_n_samples:
            common["n_samples"] = params["n_samples"]
        for fields in ({"method": "ar", "temperature": 1.0}, {"method": "spade", "draft": "distilled", "gamma": 2},
                       {}):
            got, ref = E.run_config(**fields), RunConfig(**fields, **common)
            assert got == ref and got.hash == ref.hash
        assert E.run_config(seed=9).seed == 9  # fields win
        assert E.run_config().gamma == RunConfig().gamma  # only the run parameters are shared, not gamma
    finally:
        torch.set_num_threads(before)


def test_cross_vocab_finds_the_section_pair_and_draft_and_never_builds(monkeypatch):
    from types import SimpleNamespace

    from spade_lib.zoo import pairs

    own = SimpleNamespace(name="toy", draft_tokenizers={"b": object(), "a": object()})
    E = experiment.Experiment(pair=own, suite=None, full_suite=None, device=torch.device("cpu"), dtype="float32",
                              threads=1)
    assert E.cross_vocab() == (own, "a", None) and E.cross_vocab("toy", "b") == (own, "b", None)
    with pytest.raises(ValueError, match=r"^draft: 'c' is not a cross-vocabulary draft of pair 'toy'"):
        E.cross_vocab("", "c")
    E.pair = SimpleNamespace(name="plain", draft_tokenizers={})
    assert E.cross_vocab() == (None, None, "pair 'plain' has no draft with its own tokenizer")
    loaded = []
    monkeypatch.setattr(pairs, "pair_built", lambda name: name == "built")
    monkeypatch.setattr(pairs, "load_pair", lambda name, **kw: loaded.append((name, kw)) or own)
    pair, draft, why = E.cross_vocab("absent")
    assert pair is None and "not built" in why and loaded == []
    assert E.cross_vocab("built") == (own, "a", None)
    assert loaded == [("built", {"device": torch.device("cpu"), "dtype": "float32"})]
    assert E.figure_name("m3_x") == "m3_x-plain" and E.figure_name("m3_x", "smollm2") == "m3_x-smollm2"


def _fake_experiment(pair):
    return experiment.Experiment(pair=pair, suite=None, full_suite=None, device=torch.device("cpu"),
                                 dtype="float32", threads=1, run_fields={"max_new_tokens": 8})


def _notebook_session_configs(E, T, p):
    """Notebook 03's session_configs, as it was before SessionPlan (the reference)."""
    cs = [E.run_config(method="spade", draft=p["main_draft"], gamma=g, temperature=T) for g in p["gammas"]]
    cs += [E.run_config(method="spade", draft=d, gamma=p["gamma_ref"], temperature=T) for d in p["compare_drafts"]]
    if p["prompt_lookup"]:
        cs.append(E.run_config(method="spade", draft="ngram", gamma=p["gamma_ref"], temperature=T))
    if p["null_control"]:
        cs.append(E.run_config(method="spade", draft="null", gamma=p["gamma_ref"], temperature=T))
    if p["hf_baselines"] and (not p["hf_temperatures"] or T in p["hf_temperatures"]):
        cs.append(E.run_config(method="hf", temperature=T))
        if p["hf_assisted"]:
            cs.append(E.run_config(method="hf_assisted", draft=p["main_draft"], gamma=p["gamma_ref"], temperature=T))
    return cs


@pytest.mark.parametrize("hf_temperatures, flags", [([], (True, True, True, True)), ([0.0], (False, True, True, False)),
                                                    ([1.0], (True, False, False, True))])
def test_session_plan_equals_the_notebooks_session_configs(hf_temperatures, flags):
    lookup, null, hf, assisted = flags
    params = {"pair": "x", "main_draft": "distilled", "gammas": [1, 4], "gamma_ref": 4, "compare_drafts": ["data_only"],
              "prompt_lookup": lookup, "null_control": null, "hf_baselines": hf, "hf_temperatures": hf_temperatures,
              "hf_assisted": assisted, "cross_drafts": [], "cross_rules": ["text", "tli"], "repeats": 3}
    plan = experiment.SessionPlan.from_params(params)
    assert plan.gammas == (1, 4) and plan.cross_rules == ("text", "tli")  # lists as tuples, others left out
    E = _fake_experiment(SimpleNamespace(name="toy", draft_tokenizers={}))
    for T in (0.0, 1.0):
        assert plan.configs(E, T) == _notebook_session_configs(E, T, params)
        assert plan.cross_configs(E, T) == []


def test_session_plan_cross_configs_check_the_pairs_drafts():
    E = _fake_experiment(SimpleNamespace(name="toy", draft_tokenizers={"own": object()}))
    plan = experiment.SessionPlan(cross_drafts=("own",), cross_rules=("text", "tli"))
    cs = plan.cross_configs(E, 1.0)
    assert [(c.method, c.draft, c.gamma, c.temperature, c.draft_options, c.max_new_tokens) for c in cs] == [
        ("spade", "own", 4, 1.0, {"rule": "text"}, 8), ("spade", "own", 4, 1.0, {"rule": "tli"}, 8),
        ("hf_assisted", "own", 4, 1.0, {}, 8)]
    assert [c.label for c in cs] == ["spade-own-g4-rule=text-T1", "spade-own-g4-rule=tli-T1", "hf_assisted-own-g4-T1"]
    only_greedy = experiment.SessionPlan(cross_drafts=("own",), cross_temperatures=(0.0,))
    assert only_greedy.cross_configs(E, 1.0) == [] and len(only_greedy.cross_configs(E, 0.0)) == 3
    with pytest.raises(ValueError, match=r"^cross_drafts: \['other'\] not cross-vocabulary drafts of pair 'toy'"):
        experiment.SessionPlan(cross_drafts=("other",)).cross_configs(E, 0.0)
    with pytest.raises(ValueError, match=r"^cross_rules: \['slem'\] not among"):
        experiment.SessionPlan(cross_drafts=("own",), cross_rules=("slem",)).cross_configs(E, 0.0)
    with pytest.raises(ValueError, match=r"^cross_rules: empty"):
        experiment.SessionPlan(cross_drafts=("own",), cross_rules=()).cross_configs(E, 0.0)


def test_cached_costs_reads_the_cached_table_else_measures_and_describes_it(monkeypatch):
    from spade_lib.runs import costs as run_costs

    table = {"c": 0.25, "overhead": 0.5, "r": {1: 1.1, 2: 1.2, 3: 1.5}, "key": {"device": "cpu", "threads": 2}}
    monkeypatch.setattr(run_costs, "select_costs", lambda folder, **kw: {"distilled": table})
    monkeypatch.setattr(experiment, "load_experiment", lambda *a, **kw: pytest.fail("loaded a pair with a cached table"))
    got, how = experiment.cached_costs("tiny", "distilled", threads=1)
    assert got is table and how == "read from the cached table"
    measured = []
    monkeypatch.setattr(run_costs, "select_costs", lambda folder, **kw: {})
    prepared = []
    monkeypatch.setattr(experiment, "load_experiment", lambda name, threads=0, prepare_drafts=None:
                        prepared.append(prepare_drafts) or SimpleNamespace(pair=name))
    monkeypatch.setattr(run_costs, "pair_costs", lambda pair, drafts, g, progress=False:
                        measured.append((pair, list(drafts), g)) or {"distilled": table})
    got, how = experiment.cached_costs("tiny", "distilled", threads=1)
    assert how == "measured now (and cached)" and measured == [("tiny", ["distilled"], run_costs.MIN_GAMMA)]
    assert prepared == [["distilled"]]  # only the draft whose costs are measured is prepared
    line = experiment.describe_costs(table, "tiny/distilled", how, max_gamma=5)
    assert line == ("cost table of tiny/distilled (measured now (and cached), cpu, 2 threads): c = 0.250, loop "
                    "overhead o = 0.500, r(g) for g = 1..3: 1.10 1.20 1.50; r(g) beyond g = 3 extended linearly "
                    "(r(5) = 2.10)")
    assert "beyond" not in experiment.describe_costs(table, "x", how, max_gamma=3)
    with pytest.raises(ValueError, match=r"^draft: a draft name"):
        experiment.cached_costs("tiny", "")



def test_prepared_lines_name_each_models_plan_its_agreement_and_a_drafts_bf16_prefill():
    records = [
        {"role": "target", "model": "Qwen2ForCausalLM", "covered": True, "plan": {"one": "native_rows"},
         "plan_source": "recorded", "agrees": True, "prefill": "fp32", "prefill_seconds": {}},
        {"role": "d", "model": "Qwen2ForCausalLM", "covered": True, "plan": {"one": "native_rows"},
         "plan_source": "recorded", "agrees": True, "prefill": "bf16", "prefill_seconds": {"fp32": 0.2, "bf16": 0.05}},
        {"role": "h", "model": "Linear", "covered": False, "why": "architecture Linear"},
    ]
    lines = experiment.prepared_lines(records)
    assert lines[0] == ("target: Qwen2ForCausalLM on the lean forward (one rows native_rows; plan recorded); "
                        "agrees with its HF forward")
    assert "one rows native_rows; prefill in bf16 (50 ms against 200 ms in fp32); plan recorded" in lines[1]
    assert lines[2] == "h: Linear on the Hugging Face forward (architecture Linear)"
