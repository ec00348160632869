"""The heads of a named pair, end to end on the tiny embedded pair (built in a temporary cache): the CLI's
build and eval, ``load_pair(..., heads=...)``, a suite run with ``draft="eagle"`` / ``"medusa"`` through the
runner (greedy output equal to autoregressive), the head's cost, and hf_assisted refusing a head.
The same path builds the ``default`` pair's heads (its recipes: ``test_default_pair_recipes_fit``)."""

import dataclasses

import pytest
import torch

from spade_lib import paths
from spade_lib.zoo import head_cli, head_eval, heads
from spade_lib.zoo.head_data import HeadDataConfig
from spade_lib.zoo.head_train import HeadTrainConfig

SMOKE_DATA = HeadDataConfig(n_prompts=6, gen_tokens=10, gen_batch=3, n_windows=6, window=40, max_prompt_tokens=400,
                            heldout_every=3)
SMOKE_TRAIN = HeadTrainConfig(steps=6, batch_size=2, seq_len=24, rows=64, warmup=2)
SMOKE = {kind: heads.HeadConfig(kind, draft_vocab_size=200, data=SMOKE_DATA, train=SMOKE_TRAIN, budget_s=120,
                                threads=1, eval_depth=2, feature_layers=(0, 1, 2) if kind == "eagle3" else None)
         for kind in ("eagle3", "medusa")}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setattr(paths, "CACHE_DIR", tmp_path_factory.mktemp("cache"))
    mp.setattr(paths, "RUNS_DIR", tmp_path_factory.mktemp("runs"))
    mp.setitem(heads.PAIR_PROFILES, "tiny", {"make": SMOKE})
    mp.setitem(head_eval.HELDOUT_BY_PAIR, "tiny", dataclasses.replace(SMOKE_DATA, n_prompts=4, n_windows=2))
    yield
    mp.undo()


def test_default_pair_recipes_fit():
    from spade_lib.decoding.drafts.eagle import EagleHead
    from spade_lib.decoding.drafts.medusa import MedusaHead
    from spade_lib.zoo.configs import DEFAULT
    from spade_lib.zoo.train import new_model

    target = new_model(DEFAULT.target, DEFAULT.tokenizer.vocab_size, 0)
    for profile, budget in (("make", 120), ("long", 3600)):
        for kind in heads.head_kinds():
            cfg = heads.head_config(kind, profile, pair="default")
            assert cfg.budget_s <= budget and cfg.kind == kind
        vocab = torch.arange(4096)
        e3 = heads._new_head(target, heads.head_config("eagle3", profile, pair="default"), vocab)
        assert isinstance(e3, EagleHead) and e3.config.feature_layers == (1, 3, 5)
        assert isinstance(heads._new_head(target, heads.head_config("medusa", profile, pair="default"), vocab),
                          MedusaHead)
    make = heads.head_config("eagle3", "make", pair="default")
    assert make.data.window <= 128 and make.train.steps <= 100 and make.train.seq_len <= 128
    with pytest.raises(ValueError, match="pair"):
        heads.head_config("eagle3", pair="tiny")
    assert heads.head_config("eagle3") == heads.PROFILES["make"]["eagle3"]  # SmolLM2's recipes unchanged


def test_cli_build_then_eval_prints_the_facts_and_the_table(cache, tmp_path, capsys):
    built = head_cli.main(["build", "--pair", "tiny", "--kind", "eagle3"])
    b = built["build"]
    assert b["steps_done"] == b["steps"] == SMOKE_TRAIN.steps and b["budget_hit"] is False
    assert b["build_seconds"] > 0 and b["data_tokens"] > 0 and b["c"] > 0
    out = head_cli.main(["eval", "--pair", "tiny", "--kind", "medusa", "--depth", "6", "--json", str(tmp_path / "e.json")])
    text = capsys.readouterr().out
    assert "budget_hit = False" in text and "alpha" in text and "held-out:" in text
    assert out["depth"] == 4 and len(out["generated"]) == 4 and out["all"][0]["n"] > 0  # 4 Medusa heads
    assert (tmp_path / "e.json").is_file() and "-heldout-" in out["heldout"]


def test_a_run_with_the_pairs_head_equals_autoregressive(cache):
    from spade_lib.bench import Suite
    from spade_lib.decoding import baselines
    from spade_lib.runs import runner
    from spade_lib.runs.config import RunConfig
    from spade_lib.runs.costs import pair_costs
    from spade_lib.runs.store import read_summary
    from spade_lib.zoo.pairs import load_pair

    pair = load_pair("tiny", heads=("eagle3", "medusa"))
    assert sorted(pair.heads) == ["eagle3", "medusa"] and pair.manifest["heads"]["eagle3"]["build_id"]
    suite = Suite("mini", [{"question_id": i, "category": "code", "turns": [f"def f{i}(x):\n    return"]}
                           for i in range(2)], {})
    base = dict(max_new_tokens=8, device="cpu", threads=1, warmup=0)
    ar = read_summary(runner.run_suite(pair, suite, RunConfig(method="ar", **base), progress=False))
    for draft in ("eagle", "medusa", "eagle3"):
        run = runner.run_suite(pair, suite, RunConfig(draft=draft, **base), progress=False)
        assert read_summary(run)["output_ids"].tolist() == ar["output_ids"].tolist()
    costs = pair_costs(pair, ["eagle", "medusa"], 2, context=16, reps=2)
    assert costs["eagle"]["c"] > 0 and costs["eagle"]["key"]["head"]["build_id"] == pair.manifest["heads"]["eagle3"]["build_id"]
    with pytest.raises(ValueError, match="feature head"):
        baselines.assistant_model(pair, "eagle3")
    with pytest.raises(ValueError, match="feature head"):
        baselines.assistant_model(pair, "eagle")
