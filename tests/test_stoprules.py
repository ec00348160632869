"""Stop-rule study: grids reach the degenerate ends, AdaEDL's bound is an entropy threshold, the learned
rule separates a planted signal, and train/test splits are by prompt."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spade_lib.decoding.policies import EntropyThreshold
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
