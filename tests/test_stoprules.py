"""Stop-rule study: grids reach the degenerate ends, AdaEDL's bound is an entropy threshold, the learned
rule separates a planted signal, and train/test splits are by prompt."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spade_lib.decoding.drafts.policies import EntropyThreshold
from spade_lib.whatif import replay, stoprules


def planted_trace(n_steps=600, gamma=6, seed=0):
    """Blocks whose acceptance depends on the draft entropy: p(accept) = 0.95 if H < 2 else 0.3."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(n_steps):
        h = rng.uniform(0, 4, gamma)
        acc = rng.random(gamma) < np.where(h < 2, 0.95, 0.3)
        n = gamma if acc.all() else int(np.argmin(acc))
        for pos in range(gamma):
            rows.append(dict(prompt_id=str(s % 20), sample=0, step=s, pos=pos, gamma=gamma, category="c",
                             n_accepted=n, reached=pos <= n, accepted=pos < n, h_q_raw=h[pos],
                             q_top_prob=float(np.exp(-h[pos])), q_x=float(np.exp(-h[pos])),
                             accept_prob=0.95 if h[pos] < 2 else 0.3))
    return pd.DataFrame(rows)


def test_grids_include_degenerate_ends_and_edge_check():
    t = planted_trace()
    grid = stoprules.signal_grid(t, "entropy", points=8)
    assert grid[0] == -1.0 and grid[-1] > t["h_q_raw"].max()
    front = stoprules.frontier(t, 0.1, 1.2, max_gamma=6, grids={"entropy": grid,
                                                               "confidence": stoprules.signal_grid(t, "confidence")})
    lo = front[(front.policy == "entropy") & (front.threshold == grid[0])]
    hi = front[(front.policy == "entropy") & (front.threshold == grid[-1])]
    assert float(lo["g_mean"].iloc[0]) == 1.0 and float(hi["g_mean"].iloc[0]) == 6.0
    chosen = stoprules.best(front)
    edges = stoprules.edge_check(front, chosen, max_gamma=6)
    assert not edges.loc[edges.policy != "fixed", "suspicious"].any()
    # the planted rule: stopping where H > 2 beats every fixed gamma
    ent = chosen[chosen.policy == "entropy"].iloc[0]
    assert ent["speedup"] > chosen[chosen.policy == "fixed"]["speedup"].iloc[0]
    with pytest.raises(ValueError, match="policy"):
        stoprules.signal_grid(t, "fixed")


def test_adaedl_is_the_entropy_rule_at_its_bound():
    t = planted_trace(200)
    assert stoprules.adaedl_threshold(0.5, 0.25) == pytest.approx(1.0)
    a = stoprules.frontier(t, 0.1, 1.0, max_gamma=6, grids={"adaedl": [0.5]}, gamma_c=0.25)
    e = replay.replay_stop_rule(t, EntropyThreshold(threshold=1.0, max_gamma=6), 0.1, 1.0)
    a = a[a.policy == "adaedl"]
    assert float(a["speedup"].iloc[0]) == pytest.approx(float(e["speedup"].iloc[0]))
    with pytest.raises(ValueError, match="lam"):
        stoprules.adaedl_threshold(1.0)


def test_learned_rule_trains_on_one_split_and_scores_on_the_other():
    t = planted_trace()
    train, test = stoprules.split_prompts(t, 0.5, seed=1)
    assert set(train.prompt_id).isdisjoint(set(test.prompt_id)) and len(train) + len(test) == len(t)
    model = stoprules.LearnedStop.fit(train)
    assert model.auc(test) > 0.7  # the planted entropy effect is found on held-out prompts
    sig = model.signal(test)
    assert np.all(np.diff(sig.reshape(-1, 6), axis=1) <= 1e-12)  # block survival never rises along a block
    front_train = stoprules.frontier(train, 0.1, 1.2, max_gamma=6, learned=model,
                                     grids={"learned": [0.0, 0.2, 0.4, 0.6, 0.8, 1.01]})
    ev = stoprules.evaluate(front_train, test, 0.1, 1.2, max_gamma=6, learned=model)
    assert set(ev.policy) == {"fixed", "learned"}
    with pytest.raises(ValueError, match="frac"):
        stoprules.split_prompts(t, 1.0)


# -- the study and the chosen rules, against notebook 05's former inline code ----------------------

def _notebook_study(tr_T, c, verify_cost, *, max_gamma, grid_points, adaedl_lambdas, adaedl_gamma_c, seed):
    """Notebook 05's stop-rule cell for one temperature, as it was before study() (the reference)."""
    train, test = stoprules.split_prompts(tr_T, 0.5, seed=seed)
    try:
        model = stoprules.LearnedStop.fit(train)
        sig = model.signal(train)
        learned_grid = sorted({0.0, 1.000001, *np.round(np.quantile(sig, np.linspace(0.02, 0.98, grid_points)), 6)})
    except ValueError:
        model, learned_grid = None, []
    grids = {"confidence": stoprules.signal_grid(train, "confidence", grid_points),
             "entropy": stoprules.signal_grid(train, "entropy", grid_points),
             "adaedl": adaedl_lambdas, "learned": learned_grid}
    front_train = stoprules.frontier(train, c, verify_cost, max_gamma=max_gamma, grids=grids, learned=model,
                                     gamma_c=adaedl_gamma_c)
    chosen = stoprules.best(front_train)
    edges = stoprules.edge_check(front_train, chosen, max_gamma)
    ev = stoprules.evaluate(front_train, test, c, verify_cost, max_gamma=max_gamma, learned=model,
                            gamma_c=adaedl_gamma_c)
    front_all = stoprules.frontier(tr_T, c, verify_cost, max_gamma=max_gamma, grids=grids, learned=model,
                                   gamma_c=adaedl_gamma_c)
    auc = model.auc(test) if model is not None else float("nan")
    return dict(train=train, test=test, grids=grids, front_train=front_train, chosen=chosen, edges=edges,
                held_out=ev, front=front_all, auc=auc, model=model)


@pytest.mark.parametrize("always_accepted", [False, True])
def test_study_equals_the_notebooks_inline_study(always_accepted):
    t = planted_trace(300, seed=3)
    if always_accepted:  # nothing to learn: no learned rule, an empty learned grid
        t = t.assign(reached=True, accepted=True, n_accepted=6)
    verify_cost = lambda g: 1.0 + 0.04 * g  # noqa: E731
    kw = dict(max_gamma=6, grid_points=5, adaedl_lambdas=[0.0, 0.5, 0.9], adaedl_gamma_c=0.2, seed=4)
    ref = _notebook_study(t, 0.1, verify_cost, **kw)
    got = stoprules.study(t, 0.1, verify_cost, stoprules.StudyConfig(
        max_gamma=6, grid_points=5, adaedl_lambdas=(0.0, 0.5, 0.9), gamma_c=0.2, seed=4))
    for name in ("train", "test", "front_train", "chosen", "edges", "held_out", "front"):
        pd.testing.assert_frame_equal(getattr(got, name), ref[name], obj=name)
    assert got.grids == ref["grids"]
    assert (got.model is None) == always_accepted == (ref["model"] is None) and (got.no_model is None) != always_accepted
    np.testing.assert_equal(got.auc, ref["auc"])
    if not always_accepted:
        np.testing.assert_array_equal(got.model.coef, ref["model"].coef)


def _notebook_configs(chosen, T, *, draft, max_gamma, adaedl_gamma_c, common):
    """Notebook 05's translation of the chosen rules into run configurations, before chosen_configs()."""
    from spade_lib.runs.config import RunConfig

    cfgs = {}
    for _, row in chosen.iterrows():
        if row["policy"] == "fixed":
            cfgs["fixed"] = RunConfig(method="spade", draft=draft, gamma=int(row["gamma"]), temperature=T, **common)
        elif row["policy"] in ("confidence", "entropy", "adaedl"):
            th = (stoprules.adaedl_threshold(float(row["threshold"]), adaedl_gamma_c) if row["policy"] == "adaedl"
                  else float(row["threshold"]))
            th = min(max(th, 0.0), 1.0) if row["policy"] == "confidence" else max(th, 0.0)
            cfgs[row["policy"]] = RunConfig(method="spade", draft=draft, temperature=T, max_gamma=max_gamma,
                                            policy="confidence" if row["policy"] == "confidence" else "entropy",
                                            threshold=th, **common)
    return cfgs


def test_chosen_configs_equal_the_notebooks_translation():
    from spade_lib.runs.config import RunConfig

    t = planted_trace(300, seed=5)
    s = stoprules.study(t, 0.1, 1.2, stoprules.StudyConfig(max_gamma=6, grid_points=6, gamma_c=0.1))
    chosen = s.chosen.copy()
    # the degenerate ends, clipped as the decoder's policies accept them
    extra = chosen[chosen.policy == "confidence"].assign(threshold=1.5)
    assert set(chosen.policy) == {"fixed", "confidence", "entropy", "adaedl", "learned"}
    common = dict(max_new_tokens=24, max_prompt_tokens=64, chat_template=False, device="cpu", dtype="float32",
                  seed=3, threads=1, n_samples=2)
    for rows in (chosen, pd.concat([chosen[chosen.policy != "confidence"], extra])):
        ref = _notebook_configs(rows, 1.0, draft="distilled", max_gamma=6, adaedl_gamma_c=0.1, common=common)
        got = stoprules.chosen_configs(rows, RunConfig(method="spade", draft="distilled", temperature=1.0, **common),
                                       max_gamma=6, gamma_c=0.1)
        assert list(got) == list(ref) == [p for p in rows.policy if p != "learned"]
        assert got == ref and [c.hash for c in got.values()] == [c.hash for c in ref.values()]
    assert got["confidence"].threshold == 1.0


def test_replay_vs_run_equals_the_notebooks_comparison():
    from spade_lib.whatif.align import measured_tau

    t = planted_trace(300, seed=6)
    s = stoprules.study(t, 0.1, 1.2, stoprules.StudyConfig(max_gamma=6, grid_points=6))
    run = planted_trace(120, seed=7)  # stands in for the rule's real run
    m = pd.Series({"mean_drafted": 3.2, "speedup": 1.4, "speedup_low": 1.2, "speedup_high": 1.6})
    for policy in ("fixed", "entropy", "adaedl"):
        # notebook 05's inline comparison (the reference)
        row = s.chosen[s.chosen.policy == policy].iloc[0]
        front = s.front
        same = (front.policy == policy) & (front.gamma == row["gamma"]) & (front.threshold == row["threshold"])
        replayed = front[same].iloc[0]
        tau_run, se, _ = measured_tau(run)
        n_rep = int(replayed["steps"])
        se_pred = float(np.sqrt((replayed["g_mean"] + 1) ** 2 / 12 / max(n_rep, 1)))
        ref = {"policy": policy, "rule": row["label"], "tau_replayed": replayed["tau"], "tau_run": tau_run,
               "se_run": se, "g_replayed": replayed["g_mean"], "g_run": m["mean_drafted"],
               "speedup_replayed": replayed["speedup"], "speedup_run": m["speedup"], "speedup_low": m["speedup_low"],
               "speedup_high": m["speedup_high"],
               "within_tolerance": abs(replayed["tau"] - tau_run) < 4 * np.hypot(se, se_pred) + 0.05}
        got = stoprules.replay_vs_run(s.front, s.chosen, policy, run, m)
        assert list(got) == list(ref) and got == ref


def _run_of(trace, policy):
    """What the decoder would have recorded drafting with ``policy`` on ``trace``'s blocks: each step cut
    to the policy's draft length, ``abs_pos`` counted along each prompt's steps."""
    df = trace.sort_values(["prompt_id", "sample", "step", "pos"]).reset_index(drop=True)
    g = policy.replay_gamma(df)
    step_g = dict(zip(df.groupby(["prompt_id", "sample", "step"]).size().index, g))
    df["gamma"] = [step_g[k] for k in zip(df["prompt_id"], df["sample"], df["step"])]
    df = df[df.pos < df.gamma].copy()
    df["n_accepted"] = np.minimum(df["n_accepted"], df["gamma"])
    firsts = df.groupby(["prompt_id", "sample", "step"]).first().reset_index()
    firsts["start"] = firsts.groupby(["prompt_id", "sample"])["n_accepted"].transform(
        lambda n: np.concatenate([[0], np.cumsum(n.to_numpy() + 1)[:-1]]))
    df = df.merge(firsts[["prompt_id", "sample", "step", "start"]], on=["prompt_id", "sample", "step"])
    df["abs_pos"] = df["start"] + df["pos"]
    return df.drop(columns="start")


def test_decisions_replayed_gives_back_the_runs_own_decisions_and_catches_a_wrong_reading():
    from spade_lib.decoding.drafts.policies import get_policy

    t = planted_trace(200, seed=8)
    rule = get_policy("entropy", max_gamma=6, threshold=2.0)
    run = _run_of(t, rule)
    assert (run.groupby(["prompt_id", "sample", "step"])["gamma"].first() < 6).mean() > 0.5  # the rule does stop
    assert stoprules.decisions_replayed(run, rule) == 1.0
    # a decoder that read the signal differently (another threshold) is caught, whichever way it errs
    assert stoprules.decisions_replayed(run, get_policy("entropy", max_gamma=6, threshold=1.5)) < 0.9
    assert stoprules.decisions_replayed(run, get_policy("entropy", max_gamma=6, threshold=2.5)) < 0.9
    # and so is one that stopped a block one token early with the signal still passing
    early = run.copy()
    first = early.groupby(["prompt_id", "sample", "step"])["gamma"].transform("first")
    cut = (first >= 2) & (early.step % 3 == 0)
    early.loc[cut, "gamma"] -= 1
    early = early[early.pos < early.gamma]
    assert stoprules.decisions_replayed(early, rule) < 0.95


def test_replay_prices_the_loop_overhead_in_every_step():
    from spade_lib.decoding.drafts.policies import get_policy

    t = planted_trace(120, seed=9)
    rule = get_policy("entropy", max_gamma=6, threshold=2.0)
    base = replay.replay_stop_rule(t, rule, 0.1, 1.2)
    with_o = replay.replay_stop_rule(t, rule, 0.1, 1.2, overhead=0.3)
    assert np.isclose(float(with_o["cost"].iloc[0]), float(base["cost"].iloc[0]) + 0.3)
    assert float(with_o["speedup"].iloc[0]) < float(base["speedup"].iloc[0])
    s = stoprules.study(t, 0.1, 1.2, stoprules.StudyConfig(max_gamma=6, grid_points=6), overhead=0.3)
    fixed1 = s.front[(s.front.policy == "fixed") & (s.front.gamma == 1)].iloc[0]
    assert np.isclose(fixed1["cost"], 0.1 + 1.2 + 0.3)
    with pytest.raises(ValueError, match="overhead"):
        replay.replay_stop_rule(t, rule, 0.1, 1.2, overhead=-0.1)
