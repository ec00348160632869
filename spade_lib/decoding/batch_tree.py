"""Batched decoding with draft trees: every row drafts its own tree, one target forward scores them all.

Notation (Leviathan et al. 2023; tree terms of :mod:`spade_lib.decoding.drafts.tree`): ``p`` target, ``q`` draft; row ``b``'s
tree has ``N_b`` nodes ``x_0 .. x_{N_b - 1}`` under the root ``t_b`` (the row's newest committed token, not yet in the
target's cache). One batched step of ``R`` running rows:

1. **draft** (per row): row ``b``'s own :class:`~spade_lib.decoding.drafts.drafters.ModelDrafter` (the decoder's draft model
   and ``tree=`` config, with its own KV cache) proposes its tree with ``propose(max_gamma_b, ...)`` from the row's
   draft stream, exactly the call :meth:`~spade_lib.decoding.decode.SpeculativeDecoder.generate` makes. *The draft
   side is not batched*: trees are grown one after the other (:func:`spade_lib.decoding.drafts.tree_drafting.grow_tree`), so
   drafting costs ``R`` times a row's.
2. **score** (batched): one target forward over the padded blocks ``[t_b, x_0 .. x_{N_b - 1}]``, width
   ``K = 1 + max_b N_b`` (holes past ``N_b``), each row's tree mask over its own valid cache slots
   (``forward_tree`` of :func:`spade_lib.decoding.batch.batch_lm`'s cache, positions ``l_b + depth``): block row ``i + 1`` of row
   ``b`` gives the target's logits after the path of node ``i``.
3. **verify and commit** (per row): :meth:`spade_lib.decoding.step.Step.verify_tree` on row ``b``'s
   ``logits_p [N_b + 1, V]``, the step single decoding runs (a row without a tree: ``Step.plain``).
4. **keep**: the target's cache keeps each row's root and accepted path (``keep``;
   other block slots become holes); each row's drafter keeps its accepted path (``accept_path``).

Row ``b`` draws exactly what ``generate(prompt_b, seed=seed_b)`` draws, from its own
:func:`~spade_lib.decoding.common.seed_streams`, and its tokens equal single tree decoding's whenever the batched and
single target forwards round the same way (see :mod:`spade_lib.decoding.batch`). Reached through
:meth:`spade_lib.decoding.decode.SpeculativeDecoder.generate_batch` for a :class:`ModelDrafter` with a tree config;
chains go to :func:`spade_lib.decoding.batch.speculative_generate_batch`, which refuses a tree drafter.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spade_lib.decoding.model.adapter import CausalLMAdapter
from spade_lib.decoding.batch import (BatchGenerationResult, BatchStepInfo, RowBook, batch_lm, batch_results, close_step,
                                      left_pad, prompt_tensors, row_seeds, timing_totals)
from spade_lib.decoding.common import _check_budget, _truncate, seed_streams
from spade_lib.decoding.drafts.drafters import ModelDrafter
from spade_lib.decoding.drafts.policies import step_cap
from spade_lib.decoding.model.masks import ancestor_mask
from spade_lib.decoding.step import Step
from spade_lib.devices import clock
from spade_lib.sampling import adjust

__all__ = ["tree_generate_batch"]


def _row_drafters(drafter: ModelDrafter, n_rows: int) -> list[ModelDrafter]:
    """``drafter`` for row 0 and, for every other row, a :class:`ModelDrafter` of the same model, backend,
    context limit and tree config with a KV cache of its own."""
    a = drafter.adapter
    return [drafter] + [ModelDrafter(CausalLMAdapter(a.model, max_length=a.max_length, backend=a.backend),
                                     tree=drafter.tree) for _ in range(n_rows - 1)]


@torch.inference_mode()
def tree_generate_batch(dec, prompts, max_new_tokens: int, seed: int | Sequence[int] = 0
                        ) -> list[BatchGenerationResult]:
    """Decode ``prompts`` together with ``dec`` (a :class:`~spade_lib.decoding.decode.SpeculativeDecoder`
    whose drafter is a tree-drafting :class:`ModelDrafter`); one result per prompt (module docstring)."""
    _check_budget(max_new_tokens)
    if not isinstance(dec.drafter, ModelDrafter) or dec.drafter.tree.is_chain:
        raise ValueError(f"draft: batched tree decoding needs a ModelDrafter with a tree config, got "
                         f"{type(dec.drafter).__name__}")
    dev, sampling, policy = dec.device, dec.sampling, dec.policy
    prompts_t = prompt_tensors(prompts, dev, dec.max_length)
    B = len(prompts_t)
    seeds = row_seeds(seed, B)
    gens = [seed_streams(s, dev) for s in seeds]
    states = [policy.start() for _ in range(B)]
    timed = dec.record is not False
    step_ = Step(dec.mode, dec.mode_options, sampling.greedy, dec.record is True, dec.record_topk, dec.tree_mode)
    lens = [int(p.numel()) for p in prompts_t]
    budget0 = [min(max_new_tokens, (dec.max_length if dec.max_length is not None else n + max_new_tokens) - n)
               for n in lens]
    context = dec.target.max_length  # the single loop's cut of a tree to the target's context

    t_start = clock(dev)
    T = batch_lm(dec.target, B, "target")
    if max(lens) > 1:
        ids, valid = left_pad([p[:-1] for p in prompts_t], dev)
        T.forward(ids, valid, keep=1)
    drafters = _row_drafters(dec.drafter, B)
    for d, p in zip(drafters, prompts_t):
        d.reset(p, dec.target.vocab_size)
    pending = [int(p[-1]) for p in prompts_t]  # each row's root t_b
    t_prefill = clock(dev)

    rows = RowBook(B)
    batch_totals = timing_totals()
    active = []
    for b in range(B):
        if budget0[b] <= 0:
            rows.stop[b] = "context_limit" if budget0[b] < max_new_tokens else "max_new_tokens"
            rows.timing[b]["total"] = t_prefill - t_start
        else:
            active.append(b)
    if len(active) < B:
        T.select(torch.tensor(active, dtype=torch.long, device=dev))

    step = 0
    while active:
        R = len(active)
        ta = clock(dev) if timed else 0.0
        # -- draft: each row's tree with its own drafter (the single loop's call)
        drafts, budgets = [], []
        for b in active:
            budget = budget0[b] - len(rows.tokens[b])
            cap = step_cap(policy, states[b])
            max_gamma = min(cap, budget - 1)
            draft = None
            if max_gamma > 0:
                draft = drafters[b].propose(max_gamma, policy, sampling, gens[b]["draft"])
                if draft.stop == "max_gamma" and max_gamma < cap:
                    draft.stop = "budget"
                cur = lens[b] - 1 + len(rows.tokens[b])  # the row's committed tokens in the target's cache
                if draft.parents is None:
                    raise ValueError("draft: a tree drafter proposed a chain; batched tree decoding needs trees")
                if context is not None and cur + 1 + draft.gamma > context:
                    draft = draft.prefix(context - cur - 1)
                    draft.stop = "budget"
            drafts.append(draft)
            budgets.append(budget)
        tb = clock(dev) if timed else 0.0

        # -- score: one target forward over every row's [t, x_0 .. x_{N-1}] under its tree mask
        n_nodes = [0 if d is None else d.gamma for d in drafts]
        parents = [d.check() if n else [] for d, n in zip(drafts, n_nodes)]
        K = 1 + max(n_nodes)
        ids = torch.zeros(R, K, dtype=torch.long, device=dev)
        valid = torch.zeros(R, K, dtype=torch.bool, device=dev)
        anc = torch.zeros(R, K, K, dtype=torch.bool, device=dev)
        for i, (d, n) in enumerate(zip(drafts, n_nodes)):
            ids[i, 0] = pending[i]
            valid[i, :n + 1] = True
            if n:
                ids[i, 1:n + 1] = d.tokens
            ps = torch.tensor([-1] + [j + 1 for j in parents[i]], dtype=torch.long, device=dev)
            anc[i, :n + 1, :n + 1] = ancestor_mask(ps)
        start = T.slots
        logits_p = T.forward_tree(ids, valid, anc)                 # [R, K, V]
        p = adjust(logits_p, sampling, validate=False)
        facts = []  # per row: (n, next token, emitted, hit_eos, stats, topk, path, tree)
        for i, b in enumerate(active):
            n = n_nodes[i]
            if n == 0:  # a plain target step
                y = int(step_.plain(p[i:i + 1, 0], (gens[b],)).item())
                emitted, hit_eos = _truncate([y], budgets[i], dec.eos)
                facts.append((0, y, emitted, hit_eos, None, None, [], None))
            else:
                f = step_.verify_tree(logits_p[i, :n + 1], p[i, :n + 1], drafts[i], parents[i], gens[b],
                                      budgets[i], dec.eos)
                facts.append((f.n, f.next_token, f.emitted, f.hit_eos, f.stats, f.topk, f.path, f.tree))
        tc = clock(dev) if timed else 0.0

        # -- commit: keep each row's root and accepted path, tell its drafter, emit
        T.keep([[0] + [j + 1 for j in f[6]] for f in facts], start=start)
        finished = []
        for i, (b, f) in enumerate(zip(active, facts)):
            n, y, emitted, hit_eos, stats, topk, path, tree = f
            if n_nodes[i] == 0:
                drafters[b].accept(0, y)
            else:
                drafters[b].accept_path(path, y)
            if states[b] is not None:
                states[b].observe(n_nodes[i], n)
            stop = "budget" if drafts[i] is None else drafts[i].stop
            rows.steps[b].append(BatchStepInfo(n_nodes[i], n, y, len(emitted), len(rows.tokens[b]), stop,
                                               stats=stats, topk=topk, tree=tree, row=b, batch_step=step,
                                               batch_rows=R, width=K - 1))
            rows.tokens[b].extend(emitted)
            pending[i] = y
            if hit_eos:
                rows.stop[b] = "eos"
                finished.append(i)
            elif len(rows.tokens[b]) >= budget0[b]:
                rows.stop[b] = "max_new_tokens" if len(rows.tokens[b]) >= max_new_tokens else "context_limit"
                finished.append(i)
        if finished:
            keep = [i for i in range(R) if i not in set(finished)]
            if keep:
                T.select(torch.tensor(keep, dtype=torch.long, device=dev))
            pending = [pending[i] for i in keep]
        T.tidy()
        active = close_step(rows, active, finished, batch_totals, (ta, tb, tc), t_start, dev, timed)
        step += 1
    t_end = clock(dev)
    return batch_results(rows, prompts_t, seeds, t_start, t_prefill, batch_totals, t_end, dec.tokenizer, timed)
