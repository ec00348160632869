"""Held-out quality and cost figures of a pair, recorded in its build manifest.

On held-out windows ``x`` (teacher forcing: every position conditions on the true prefix), with
``p`` the target's and ``q`` a draft's next-token distribution at temperature ``T`` (softmax of
logits / T):

- validation loss ``-mean_t log p(x_{t+1} | x_{<=t})`` (nats/token), perplexity ``exp(loss)``;
- acceptance rate ``alpha(T) = mean_t sum_v min(p_t(v), q_t(v)) = 1 - mean_t TV(p_t, q_t)``
  (Leviathan et al. 2023: the probability that speculative sampling accepts a drafted token;
  :func:`spade_lib.measures.alpha` per position);
- greedy top-1 agreement ``mean_t [argmax p_t = argmax q_t]`` (alpha of greedy decoding).

Costs, measured with a KV cache holding ``context`` tokens by :func:`spade_lib.decoding.studies.costs.measure_costs`
(the decoding adapters' forwards timed in turns, medians of per-round ratios):

- ``c = t_draft(1) / t_target(1)``: the draft/target cost ratio of one decode step;
- ``verify_cost_ratio = t_target(gamma + 1) / t_target(1)``: the target's cost of verifying a block of
  ``gamma`` drafted tokens (plus the bonus position) relative to one plain decode step.
Timings depend on the machine and on its load; they are recorded, never asserted.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from spade_lib import measures


@torch.no_grad()
def teacher_forced_stats(target, drafts: dict, windows: torch.Tensor, temperatures=(1.0,),
                         batch_size: int = 8) -> dict:
    """Validation loss/perplexity of every model and alpha/top-1 agreement of every draft vs the target."""
    inputs, labels = windows[:, :-1], windows[:, 1:]
    sums = {"target": 0.0, **{f"{n}": 0.0 for n in drafts}}
    alpha = {n: {t: 0.0 for t in temperatures} for n in drafts}
    top1 = {n: 0.0 for n in drafts}
    n_pos = 0
    for i in range(0, len(inputs), batch_size):
        x, y = inputs[i: i + batch_size], labels[i: i + batch_size]
        p_logits = target(input_ids=x, use_cache=False).logits.float()
        sums["target"] += F.cross_entropy(p_logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        for name, draft in drafts.items():
            q_logits = draft(input_ids=x, use_cache=False).logits.float()
            sums[name] += F.cross_entropy(q_logits.flatten(0, 1), y.flatten(), reduction="sum").item()
            top1[name] += (p_logits.argmax(-1) == q_logits.argmax(-1)).sum().item()
            for t in temperatures:
                p, q = torch.softmax(p_logits / t, -1), torch.softmax(q_logits / t, -1)
                alpha[name][t] += measures.alpha(p, q).sum().item()
        n_pos += y.numel()
    loss = {k: v / n_pos for k, v in sums.items()}
    out = {"n_positions": n_pos, "target": {"val_loss": loss["target"], "val_ppl": math.exp(loss["target"])}}
    for name in drafts:
        out[name] = {
            "val_loss": loss[name],
            "val_ppl": math.exp(loss[name]),
            "alpha": alpha[name][temperatures[0]] / n_pos,
            "alpha_by_temperature": {str(t): alpha[name][t] / n_pos for t in temperatures},
            "top1_agreement": top1[name] / n_pos,
        }
    return out


def cost_ratios(target, drafts: dict, *, gamma: int = 4, context: int = 64, reps: int = 50) -> dict:
    """``c`` of every draft and the target's verify-cost ratio ``r(gamma)``, with the step times (s),
    from :func:`spade_lib.decoding.studies.costs.measure_costs` (the one cost measurement: the decoding
    adapters' forwards timed in turns, medians of per-round ratios) on a ``context``-token cache.
    Beside each ``c``, ``c_bytes``: the draft's bytes a step over the target's
    (:meth:`~spade_lib.decoding.model.lean.LeanForward.weight_bytes`; NaN where either runs on the Hugging
    Face forward), what ``c`` would be if both streamed their weights at one rate (a draft held in the caches
    can run below it)."""
    from spade_lib.decoding.model.adapter import CausalLMAdapter
    from spade_lib.decoding.studies.costs import measure_costs

    ta = CausalLMAdapter(target)
    target_bytes = ta.lean.weight_bytes() if ta.lean is not None else None
    out = {"gamma": gamma, "context": context, "reps": reps, "threads": torch.get_num_threads(), "drafts": {}}
    for i, (name, draft) in enumerate(drafts.items()):
        da = CausalLMAdapter(draft)
        m = measure_costs(ta, da, gamma, context, reps=reps)
        if i == 0:
            out.update(target_step_s=m["t_target"], target_verify_step_s=m["t_verify"][gamma],
                       verify_cost_ratio=m["r"][gamma])
        c_bytes = da.lean.weight_bytes() / target_bytes if da.lean is not None and target_bytes else float("nan")
        out["drafts"][name] = {"step_s": m["t_draft"], "c": m["c"], "c_bytes": c_bytes}
    if not drafts:
        m = measure_costs(ta, None, gamma, context, reps=reps)
        out.update(target_step_s=m["t_target"], target_verify_step_s=m["t_verify"][gamma],
                   verify_cost_ratio=m["r"][gamma])
    return out
