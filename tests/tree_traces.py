"""Greedy tree traces built with the real verifier, for the tree diagnostics and tree replay tests.

A step is ``(parents, tokens, argmax)``: the tree (``parents[i] < i``, ``-1`` the root), its tokens, and
the target's argmax after the root and after each node (``argmax[0]`` at the root, ``argmax[i + 1]``
after node ``i``). The target is one-hot at those argmaxes, so :func:`spade_lib.verify.verify_tree`
(``mode="greedy"``) decides the ``reached`` / ``accepted`` flags exactly as the decoder would.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from spade_lib.verify import verify_tree

V = 4  # vocabulary of the hand-built steps


def greedy_verify(parents, tokens, argmax):
    """``TreeVerifyResult`` of one greedy step (module docstring)."""
    n = len(parents)
    p = torch.zeros(1, n + 1, V, dtype=torch.float64)
    p[0, torch.arange(n + 1), torch.tensor(argmax)] = 1.0
    return verify_tree(p, None, torch.tensor([tokens]), torch.tensor([parents]), mode="greedy", draws="deterministic")


def tree_trace(steps, *, prompt_id="0", category="c", q_x_raw=None) -> pd.DataFrame:
    """A trace (the tree and position columns the replay and diagnostics read) of greedy ``steps``;
    ``q_x_raw``: one list per step (default 0.5 everywhere)."""
    rows = []
    abs_pos = 0
    for s, (parents, tokens, argmax) in enumerate(steps):
        res = greedy_verify(parents, tokens, argmax)
        n_acc = int(res.n_accepted[0])
        for i, par in enumerate(parents):
            rows.append(dict(prompt_id=prompt_id, category=category, sample=0, step=s, pos=i,
                             abs_pos=abs_pos + int(res.depth[0, i]), node=i, parent=par, depth=int(res.depth[0, i]),
                             sibling_rank=int(res.sibling_rank[0, i]), gamma=len(parents), draft_token=tokens[i],
                             accept_prob=float(res.accept_prob[0, i]), uniform=float("nan"),
                             reached=bool(res.reached[0, i]), accepted=bool(res.accepted[0, i]), n_accepted=n_acc,
                             p_top1=argmax[par + 1],
                             q_x_raw=0.5 if q_x_raw is None else q_x_raw[s][i]))
        abs_pos += n_acc + 1
    return pd.DataFrame(rows)


def random_steps(n_steps: int, n_nodes: int, seed: int = 0):
    """Random greedy steps: random trees of ``n_nodes`` over a 4-token vocabulary (duplicate siblings
    included), argmaxes drawn so that about half of the nodes match."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_steps):
        parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n_nodes)]
        tokens = [int(t) for t in rng.integers(0, V, n_nodes)]
        argmax = [int(t) for t in rng.integers(0, 2, n_nodes + 1)]
        out.append((parents, tokens, argmax))
    return out
