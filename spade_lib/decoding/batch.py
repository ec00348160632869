"""Batched decoding (batch size ``B > 1``): exact speculative decoding with ragged acceptance.

Notation (Leviathan et al. 2023): ``p`` target, ``q`` draft, ``gamma`` draft length. Row ``b`` runs the loop of
:mod:`spade_lib.decoding.decode` (draft ``gamma_b`` tokens from ``q``, one target forward, keep ``n_b`` plus the
residual / bonus token) with every model forward batched over the running rows; verification and commit are
:mod:`spade_lib.decoding.step`'s, once per group of rows with equal ``gamma_b``. Model drafts only; a tree config runs
:mod:`spade_lib.decoding.batch_tree` on these caches (``forward_tree``, ``keep``: tree masks).

**Masked holes** (:func:`batch_lm`: ``LeanBatch`` on lean weights, else :class:`BatchLM`): a model has ``S`` cache slots,
a mask ``[B, S]`` (1 = a committed token of the row) and row lengths ``l_b``. A forward appends as many slots to every
row; a row with fewer tokens (shorter draft, left padding) fills *holes* (mask 0); after verification row ``b`` keeps
its first ``l_b + n_b + 1`` valid slots (:meth:`BatchLM.rollback`). Position ids are explicit, ``l_b`` + rank among the
new valid slots, so row ``b`` attends to exactly what its single-sequence decode would: logits equal up to float
rounding. All-hole trailing slots are cropped, finished rows leave, ``S > 2 x longest row + slack`` compacts
the cache (order kept). **Sliding windows** (Gemma-3: keys at positions ``> p - window``): every slot is kept, with its
position ``BatchLM.pos [R, S]`` and masks per layer type; query ``i`` of row ``r`` sees the row's valid slots up to its
own (a sliding layer: only those ``> p_{r,i} - window``) and its own slot (a hole's junk state no valid query reads).

**Ragged acceptance**: width ``G = max_b gamma_b``; row ``b`` drafts ``gamma_b`` (cap, budget, ``keep_drafting``),
holes elsewhere; a stateful policy keeps one state per row (:func:`spade_lib.decoding.drafts.policies.step_cap`). Draft
sampling is per row (``V`` exponential draws a token: cost linear in ``B``). **Seeds**: row ``b``'s three generators
(:func:`spade_lib.decoding.common.seed_streams` of ``seed`` or ``seed[b]``) draw what ``generate(prompt, seed=seed_b)``
draws, so a row never depends on its batch and equals that call when the forwards round alike (greedy: barring a
top-2 near-tie, :func:`spade_lib.decoding.studies.divergence.compare_greedy`). :class:`BatchGenerationResult` per prompt,
:class:`BatchStepInfo` steps, columns ``row``, ``batch_size``, ``batch_step``, ``batch_rows``; :func:`batch_metrics`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from spade_lib.decoding.common import GenerationResult, StepInfo, _check_budget, _check_prompt, seed_streams
from spade_lib.decoding.drafts.drafters import ModelDrafter, _match_vocab, sample_categorical
from spade_lib.decoding.drafts.policies import step_cap
from spade_lib.decoding.model import masks
from spade_lib.decoding.model.adapter import CausalLMAdapter, as_token_tensor
from spade_lib.decoding.model.lean_batch import LeanBatch
from spade_lib.decoding.model.slots import Slots
from spade_lib.decoding.step import Step, commit, sample_next
from spade_lib.devices import clock
from spade_lib.sampling import adjust

__all__ = ["BatchStepInfo", "BatchGenerationResult", "BATCH_COLUMNS", "speculative_generate_batch",
           "autoregressive_generate_batch", "batch_metrics", "row_seeds"]

BATCH_COLUMNS: tuple[str, ...] = ("row", "batch_size", "batch_step", "batch_rows")


@dataclass
class BatchStepInfo(StepInfo):
    """A row's step in a batch: :class:`~spade_lib.decoding.common.StepInfo` plus where it ran."""

    row: int = 0          # the row (index of the prompt in the batch)
    batch_step: int = 0   # index of the batched step (the same for every row in it)
    batch_rows: int = 0   # rows still decoding in this step
    width: int = 0        # G = max gamma over those rows (the step's target forward fed G + 1 slots per row)


@dataclass
class BatchGenerationResult(GenerationResult):
    """One row's generation in a batch; ``timing`` holds the batch's phase times up to the row's finish."""

    row: int = 0
    batch_size: int = 1
    batch_new_tokens: int = 0                                   # all rows together
    batch_timing: dict[str, float] = field(default_factory=dict)  # the whole batch: prefill ... total (s)

    @property
    def tokens_per_second(self) -> float:
        """This row's new tokens over the time from the batch's start to the row's finish."""
        t = self.timing.get("total", float("nan"))
        return self.new_tokens / t if t > 0 else float("nan")

    @property
    def batch_tokens_per_second(self) -> float:
        """All rows' new tokens over the batch's wall time."""
        t = self.batch_timing.get("total", float("nan"))
        return self.batch_new_tokens / t if t > 0 else float("nan")

    def records(self) -> list[dict[str, Any]]:
        """The trace records of :meth:`GenerationResult.records` plus :data:`BATCH_COLUMNS`."""
        rows = super().records()
        where = [s for s in self.steps if s.gamma > 0 for _ in range(s.gamma)]
        for r, s in zip(rows, where, strict=True):
            r.update(row=self.row, batch_size=self.batch_size, batch_step=s.batch_step, batch_rows=s.batch_rows)
        return rows


def row_seeds(seed: int | Sequence[int], n_rows: int) -> list[int]:
    """Per-row seeds: ``seed`` for every row (an int), or ``seed[b]`` (a sequence of ``n_rows`` ints)."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        seeds = [int(seed)] * n_rows
    elif isinstance(seed, Sequence) and not isinstance(seed, (str, bytes)):
        seeds = list(seed)
        if len(seeds) != n_rows:
            raise ValueError(f"seed: {len(seeds)} seeds for {n_rows} prompts")
    else:
        raise TypeError(f"seed: expected an int or a sequence of ints, got {type(seed).__name__}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
            raise ValueError(f"seed: every seed must be an integer >= 0, got {s!r}")
    return [int(s) for s in seeds]


def prompt_tensors(prompts, device, limit: int | None) -> list[torch.Tensor]:
    if isinstance(prompts, (str, bytes, torch.Tensor)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts: expected a list of prompts (each a list or 1-D tensor of token ids), "
                        f"got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts: empty list (at least one prompt is needed)")
    out = []
    for i, p in enumerate(prompts):
        t = as_token_tensor(p, device, name=f"prompts[{i}]")
        try:
            _check_prompt(t, limit)
        except ValueError as e:
            raise ValueError(f"prompts[{i}]: {str(e).removeprefix('prompt_ids: ')}") from None
        out.append(t)
    return out


def left_pad(rows: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[R, W]`` ids and validity (True = token) with every row right-aligned (holes on the left)."""
    width = max(int(r.numel()) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    valid = torch.zeros(len(rows), width, dtype=torch.bool, device=device)
    for b, r in enumerate(rows):
        n = int(r.numel())
        if n:
            ids[b, width - n:] = r
            valid[b, width - n:] = True
    return ids, valid


class BatchLM(Slots):
    """One model's batched KV cache with per-row masked holes (see the module docstring)."""

    def __init__(self, adapter: CausalLMAdapter, n_rows: int, what: str):
        import inspect

        params = inspect.signature(adapter.model.forward).parameters
        if not adapter._has_position_ids or "attention_mask" not in params:
            raise ValueError(f"{what}: {type(adapter.model).__name__}.forward must take position_ids and "
                             "attention_mask for batched decoding")
        super().__init__(n_rows, adapter.device)
        self.adapter = adapter
        self.model = adapter.model
        self.cache = DynamicCache(config=self.model.config)
        # sliding-window layers (module docstring): every slot kept, the masks per layer type built here
        self.window: int | None = None
        if any(getattr(layer, "is_sliding", False) for layer in self.cache.layers):
            text = self.model.config.get_text_config()
            self.layer_types = tuple(text.layer_types)
            self.window = int(text.sliding_window)
            if "sliding_attention" not in self.layer_types or set(self.layer_types) - {"sliding_attention",
                                                                                       "full_attention"}:
                raise ValueError(f"{what}: layer types {sorted(set(self.layer_types))}: batched decoding masks "
                                 "'sliding_attention' and 'full_attention' layers")
            if getattr(text, "use_bidirectional_attention", False):
                raise ValueError(f"{what}: bidirectional attention is not causal decoding")
            self.cache = DynamicCache()  # no config: every layer a full one, keeping every slot

    def forward(self, ids: torch.Tensor, valid: torch.Tensor, keep: int) -> torch.Tensor:
        """Append ``ids [R, k]`` (``valid [R, k]``: False = hole); logits of the last ``keep`` columns
        (``0``: all), ``[R, keep or k, V]``."""
        valid_l = valid.to(torch.long)
        rank = valid_l.cumsum(dim=-1)
        positions = (self.length[:, None] + rank - 1).clamp(min=0)
        mask = torch.cat([self.mask, valid_l], dim=1)
        attention = mask
        if self.window is not None:  # a query sees the row's valid slots up to its own (and its own slot)
            k, S = ids.shape[1], self.slots
            slot = torch.arange(S + k, device=self.device)[None, None, :]
            own = (S + torch.arange(k, device=self.device))[None, :, None]
            allowed = mask.bool()[:, None, :] & (slot <= own) | (slot == own)
            attention = self._masks(allowed, positions, torch.cat([self.pos, positions], dim=1))
        kwargs = {self.adapter._cache_kw: self.cache, "use_cache": True, "attention_mask": attention,
                  "position_ids": positions}
        if self.adapter._has_logits_to_keep:
            kwargs["logits_to_keep"] = keep
        out = self.model(ids, **kwargs)
        self.mask = mask
        self.pos = torch.cat([self.pos, positions], dim=1)
        self.length = self.length + rank[:, -1]
        logits = out.logits
        return logits if keep == 0 or logits.shape[1] == keep else logits[:, -keep:]

    def forward_tree(self, ids: torch.Tensor, valid: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
        """Append every row's tree block ``ids [R, k]`` (``valid [R, k]``: False = hole) under the tree
        mask ``ancestors [R, k, k]`` (``[r, i, j]`` iff block slot ``j`` is slot ``i`` or one of its
        ancestors; slot 0, the root, on every path); logits of every slot, ``[R, k, V]``.

        Slot ``i`` of row ``r`` attends to row ``r``'s valid cache slots and to its own path in the block,
        at position ``l_r + depth_i`` (``depth_i``: its ancestors in the block other than itself), through
        a 4-D additive mask ``[R, 1, k, S + k]`` (0 or the dtype's minimum) that the Hugging Face forward
        takes as given: the logits of a causal forward of the path, as
        :meth:`CausalLMAdapter.extend` with ``parents`` computes for one row. A hole sees only itself."""
        R, k = ids.shape
        see = ancestors & valid[:, None, :]                                    # [R, k, k]
        depth = see.sum(dim=-1) - 1
        see = see | torch.eye(k, dtype=torch.bool, device=self.device)        # a hole attends to itself only
        allowed = torch.cat([self.mask.bool()[:, None, :].expand(R, k, self.slots), see], dim=2)
        positions = self.length[:, None] + depth.clamp(min=0)
        mask4 = self._masks(allowed, positions, torch.cat([self.pos, positions], dim=1))
        out = self.model(ids, **{self.adapter._cache_kw: self.cache, "use_cache": True, "attention_mask": mask4,
                                 "position_ids": positions})
        valid_l = valid.to(torch.long)
        self.mask = torch.cat([self.mask, valid_l], dim=1)
        self.pos = torch.cat([self.pos, positions], dim=1)
        self.length = self.length + valid_l.sum(dim=-1)
        return out.logits

    def _masks(self, allowed: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor):
        """Additive masks ``[R, 1, k, S']`` (0 or the dtype's minimum) from ``allowed [R, k, S']``: one for a
        model without sliding-window layers, else ``{layer type: mask}``, the sliding one also hiding keys at
        positions ``<= p - window`` from a query at ``p`` (``q_pos [R, k]``, ``k_pos [R, S']``) but never a
        query's own slot (``allowed``'s diagonal)."""
        dtype = self.adapter.dtype

        def additive(ok: torch.Tensor) -> torch.Tensor:
            return masks.additive(ok[:, None], dtype, torch.finfo(dtype).min)

        if self.window is None:
            return additive(allowed)
        S = k_pos.shape[1] - q_pos.shape[1]
        own = torch.zeros_like(allowed)
        own[:, :, S:] = torch.eye(q_pos.shape[1], dtype=torch.bool, device=self.device)
        near = masks.in_window(q_pos, k_pos, self.window)
        return {"full_attention": additive(allowed), "sliding_attention": additive(allowed & near | own)}

    def _select_kv(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)

    def _crop_kv(self, last: int) -> None:
        self.cache.crop(last - self.slots)

    def _gather_kv(self, idx: torch.Tensor) -> None:
        R, width = idx.shape
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            H, D = layer.keys.shape[1], layer.keys.shape[-1]
            layer.keys = layer.keys.gather(2, idx[:, None, :, None].expand(R, H, width, D))
            Dv = layer.values.shape[-1]
            layer.values = layer.values.gather(2, idx[:, None, :, None].expand(R, H, width, Dv))


def timing_totals() -> dict[str, float]:
    return {"draft": 0.0, "verify": 0.0, "overhead": 0.0}


def batch_lm(adapter: CausalLMAdapter, n_rows: int, what: str) -> LeanBatch | BatchLM:
    """The batched cache of ``adapter``'s model for ``n_rows`` rows: :class:`LeanBatch` on its lean weights (the
    forward its single-sequence decoding runs, packed or in place) where it has them, else :class:`BatchLM`
    (HF's forward; ``what`` names the model in its errors)."""
    lean = adapter.lean
    return LeanBatch(lean, n_rows) if lean is not None and lean.fused else BatchLM(adapter, n_rows, what)


class RowBook:
    """Per-row bookkeeping of a batch (indexed by the prompt's row)."""

    def __init__(self, n: int):
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.steps: list[list[StepInfo]] = [[] for _ in range(n)]
        self.stop: list[str] = ["max_new_tokens"] * n
        self.timing: list[dict[str, float]] = [{} for _ in range(n)]
        self.totals = [timing_totals() for _ in range(n)]


def close_step(rows: RowBook, active: list[int], finished: list[int], batch_totals: dict[str, float],
               marks: tuple[float, float, float], t_start: float, dev, timed: bool) -> list[int]:
    """End one batched step: with ``timed``, the step's draft / verify / overhead seconds (``marks`` = the
    clock before drafting, before and after verifying; overhead runs to now) go to the batch totals, to
    every active row's totals and to its last step; the ``finished`` rows (indices into ``active``) get
    their total time. Returns the rows still active."""
    if timed:
        ta, tb, tc = marks
        td = clock(dev)
        dt = {"draft": tb - ta, "verify": tc - tb, "overhead": td - tc}
        for k, v in dt.items():
            batch_totals[k] += v
        for b in active:
            s = rows.steps[b][-1]
            s.t_draft, s.t_verify, s.t_overhead = dt["draft"], dt["verify"], dt["overhead"]
            for k, v in dt.items():
                rows.totals[b][k] += v
    t_now = clock(dev) if finished else 0.0
    for i in finished:
        rows.timing[active[i]]["total"] = t_now - t_start
    gone = set(finished)
    return [b for i, b in enumerate(active) if i not in gone]


def batch_results(rows: RowBook, prompts, seeds, t_start, t_prefill, batch_totals, t_end, tokenizer, timed: bool
             ) -> list[BatchGenerationResult]:
    B = len(prompts)
    n_total = sum(len(t) for t in rows.tokens)
    batch_timing = {"prefill": t_prefill - t_start, **batch_totals, "total": t_end - t_start}
    if not timed:
        batch_timing.update(draft=float("nan"), verify=float("nan"), overhead=float("nan"))
    out = []
    for b in range(B):
        timing = {"prefill": t_prefill - t_start, **rows.totals[b], **rows.timing[b]}
        if not timed:
            timing.update(draft=float("nan"), verify=float("nan"), overhead=float("nan"))
        r = BatchGenerationResult(rows.tokens[b], int(prompts[b].numel()), rows.stop[b], rows.steps[b], timing,
                                  seed=seeds[b], row=b, batch_size=B, batch_new_tokens=n_total,
                                  batch_timing=batch_timing)
        if tokenizer is not None:
            r.text = tokenizer.decode(r.tokens)
        out.append(r)
    return out


# ----------------------------------------------------------------------------------------------
# speculative


@torch.inference_mode()
def speculative_generate_batch(dec, prompts, max_new_tokens: int, seed: int | Sequence[int] = 0
                               ) -> list[BatchGenerationResult]:
    """Decode ``prompts`` together with :class:`~spade_lib.decoding.decode.SpeculativeDecoder` ``dec``'s target,
    draft, policy, sampling and mode; one result per prompt (see the module docstring). The step after
    the target's forward is :mod:`spade_lib.decoding.step`, the one ``dec.generate`` runs with one row."""
    _check_budget(max_new_tokens)
    if not isinstance(dec.drafter, ModelDrafter):
        raise ValueError(f"draft: batched decoding needs a model draft, got {type(dec.drafter).__name__}")
    if not dec.drafter.tree.is_chain:
        raise ValueError(f"draft: {type(dec.drafter).__name__} drafts trees ({dec.drafter.tree}); batched tree "
                         "decoding is spade_lib.decoding.batch_tree.tree_generate_batch (dec.generate_batch picks it)")
    dev, sampling, policy, mode = dec.device, dec.sampling, dec.policy, dec.mode
    prompts_t = prompt_tensors(prompts, dev, dec.max_length)
    B = len(prompts_t)
    seeds = row_seeds(seed, B)
    gens = [seed_streams(s, dev) for s in seeds]
    states = [policy.start() for _ in range(B)]  # per-row policy state (None: stateless)
    timed = dec.record is not False
    one_step = Step(mode, dec.mode_options, sampling.greedy, dec.record is True, dec.record_topk)  # verify + commit
    vocab = dec.target.vocab_size
    lens = [int(p.numel()) for p in prompts_t]
    budget0 = [min(max_new_tokens, (dec.max_length if dec.max_length is not None else n + max_new_tokens) - n)
               for n in lens]

    t_start = clock(dev)
    T = batch_lm(dec.target, B, "target")
    D = batch_lm(dec.drafter.adapter, B, "draft")
    head = [p[:-1] for p in prompts_t]
    if max(lens) > 1:
        ids, valid = left_pad(head, dev)
        T.forward(ids, valid, keep=1)
        D.forward(ids, valid, keep=1)
    pending = torch.stack([p[-1] for p in prompts_t])            # [R] newest committed token, not in T
    unfed: list[list[int]] = [[int(p[-1])] for p in prompts_t]    # committed tokens not yet in D
    t_prefill = clock(dev)

    rows = RowBook(B)
    batch_totals = timing_totals()
    active = list(range(B))
    for b in active:
        if budget0[b] <= 0:
            rows.stop[b] = "context_limit" if budget0[b] < max_new_tokens else "max_new_tokens"
            rows.timing[b]["total"] = t_prefill - t_start
    keep_rows = [i for i, b in enumerate(active) if budget0[b] > 0]
    if len(keep_rows) < len(active):
        sel = torch.tensor(keep_rows, dtype=torch.long, device=dev)
        T.select(sel)
        D.select(sel)
        pending = pending[sel]
        active = [active[i] for i in keep_rows]
        unfed = [unfed[i] for i in keep_rows]

    step = 0
    while active:
        R = len(active)
        budget = [budget0[b] - len(rows.tokens[b]) for b in active]
        cap = [step_cap(policy, states[b]) for b in active]    # each row's own cap (its state's gamma())
        max_gamma = [min(c, n - 1) for c, n in zip(cap, budget)]
        ta = clock(dev) if timed else 0.0

        # -- draft: G forwards of the draft over all rows; row b keeps its first gamma_b proposals
        G_max = max(max_gamma)
        gamma = [0] * R
        stop = ["budget"] * R
        xs, qs, q_logits = [], [], []
        d_length0 = D.length.clone()
        n_unfed = [len(u) for u in unfed]
        if G_max > 0:
            U = max(n_unfed)
            feed = torch.zeros(R, U, dtype=torch.long, device=dev)
            fvalid = torch.zeros(R, U, dtype=torch.bool, device=dev)
            for i, u in enumerate(unfed):
                feed[i, U - len(u):] = torch.tensor(u, dtype=torch.long, device=dev)
                fvalid[i, U - len(u):] = True
            drafting = [m > 0 for m in max_gamma]
            for j in range(G_max):
                logits = _match_vocab(D.forward(feed, fvalid, keep=1)[:, -1], vocab)   # [R, V]
                q = adjust(logits, sampling, validate=False)
                if sampling.greedy:
                    x = q.argmax(dim=-1)
                else:
                    x = q.argmax(dim=-1)  # junk for rows that stopped drafting (no draw from their stream)
                    draws = [sample_categorical(q[i:i + 1], gens[b]["draft"])
                             if drafting[i] else x[i:i + 1] for i, b in enumerate(active)]
                    x = torch.cat(draws)
                xs.append(x)
                qs.append(q)
                q_logits.append(logits)
                fed_now = list(drafting)
                for i in range(R):
                    if drafting[i]:
                        gamma[i] += 1
                        if gamma[i] == max_gamma[i]:
                            drafting[i] = False
                            stop[i] = "max_gamma" if max_gamma[i] == cap[i] else "budget"
                if policy.needs_signals and any(drafting):
                    q_raw = logits.float().softmax(dim=-1)
                    sig = torch.stack([q_raw.amax(dim=-1), torch.special.entr(q_raw).sum(dim=-1)], dim=1).tolist()
                    for i in range(R):
                        if drafting[i] and not policy.keep_drafting(*sig[i]):
                            drafting[i] = False
                            stop[i] = "policy"
                if not any(drafting):
                    break
                feed = x[:, None]
                fvalid = torch.tensor(fed_now, dtype=torch.bool, device=dev)[:, None]
        G = max(gamma)
        fed = [min(g, len(xs) - 1) for g in gamma]  # drafts fed to D (x_j went in with forward j + 1)
        tb = clock(dev) if timed else 0.0

        # -- verify: one target forward on [t, x_0 .. x_{G-1}] per row, holes past gamma_b
        if G > 0:
            X = torch.stack(xs[:G], dim=1)                        # [R, G]
            Q = torch.stack(qs[:G], dim=1)                        # [R, G, V]
            QL = torch.stack(q_logits[:G], dim=1)
            ids = torch.cat([pending[:, None], X], dim=1)
            gam_t = torch.tensor(gamma, device=dev)
            valid = torch.arange(G + 1, device=dev)[None, :] <= gam_t[:, None]
        else:
            ids, valid = pending[:, None], torch.ones(R, 1, dtype=torch.bool, device=dev)
        t_length0 = T.length.clone()
        logits_p = T.forward(ids, valid, keep=0)                  # [R, G + 1, V]
        p = adjust(logits_p, sampling, validate=False)
        # the shared step (spade_lib.decoding.step) once per group of rows that drafted the same gamma_b
        n_acc = torch.zeros(R, dtype=torch.long, device=dev)
        nxt = torch.zeros(R, dtype=torch.long, device=dev)
        verdicts = []
        for g in sorted(set(gamma)):
            idx_l = [i for i in range(R) if gamma[i] == g]
            idx = torch.tensor(idx_l, dtype=torch.long, device=dev)
            streams = [gens[active[i]] for i in idx_l]
            if g == 0:
                nxt[idx] = one_step.plain(p[idx, 0], streams)
                continue
            v = one_step.verify(logits_p[idx, :g + 1], p[idx, :g + 1], X[idx, :g], Q[idx, :g], QL[idx, :g], streams)
            n_acc[idx] = v.n_accepted
            nxt[idx] = v.next_token
            verdicts.append((idx_l, v))
        # one device -> host transfer per step: every row's n, next token, drafts (and statistics)
        facts = commit(n_acc, nxt, X if G > 0 else ids[:, :0], verdicts, budget, dec.eos)
        tc = clock(dev) if timed else 0.0

        # -- commit: per-row rollback of both caches, emitted tokens, finished rows leave
        T.rollback(t_length0 + 1 + n_acc)
        if G_max > 0:
            in_cache = [min(f.n, k) for f, k in zip(facts, fed)]
            D.rollback(d_length0 + torch.tensor([nu_ + c for nu_, c in zip(n_unfed, in_cache)], device=dev))
        finished = []
        for i, (b, f) in enumerate(zip(active, facts)):
            if G_max > 0:
                unfed[i] = f.drafted[in_cache[i]:f.n] + [f.next_token]
            else:
                unfed[i] = unfed[i] + [f.next_token]
            rows.steps[b].append(BatchStepInfo(gamma[i], f.n, f.next_token, len(f.emitted), len(rows.tokens[b]),
                                               stop[i], stats=f.stats, topk=f.topk, row=b, batch_step=step,
                                               batch_rows=R, width=G))
            rows.tokens[b].extend(f.emitted)
            if states[b] is not None:
                states[b].observe(gamma[i], f.n)
            if f.hit_eos:
                rows.stop[b] = "eos"
                finished.append(i)
            elif len(rows.tokens[b]) >= budget0[b]:
                rows.stop[b] = "max_new_tokens" if len(rows.tokens[b]) >= max_new_tokens else "context_limit"
                finished.append(i)
        pending = nxt
        if finished:
            keep = [i for i in range(R) if i not in set(finished)]
            if keep:
                sel = torch.tensor(keep, dtype=torch.long, device=dev)
                T.select(sel)
                D.select(sel)
                pending = pending[sel]
                unfed = [unfed[i] for i in keep]
        T.tidy()
        D.tidy()
        active = close_step(rows, active, finished, batch_totals, (ta, tb, tc), t_start, dev, timed)
        step += 1
    t_end = clock(dev)
    return batch_results(rows, prompts_t, seeds, t_start, t_prefill, batch_totals, t_end, dec.tokenizer, timed)


# ----------------------------------------------------------------------------------------------
# autoregressive


@torch.inference_mode()
def autoregressive_generate_batch(dec, prompts, max_new_tokens: int, seed: int | Sequence[int] = 0, *,
                                  lean: bool = True) -> list[BatchGenerationResult]:
    """Plain batched KV-cached decoding with :class:`~spade_lib.decoding.decode.AutoregressiveDecoder` ``dec``:
    row ``b`` samples ``t ~ adjust(logits, sampling)`` with the residual stream of its seed, exactly as
    ``dec.generate(prompt_b, seed=seed_b)`` does. ``lean``: on the target's lean weights where it has them
    (:class:`~spade_lib.decoding.model.lean_batch.LeanBatch`: SmolLM2's answers for head data at B = 32, 2.45x one
    sequence at a time against the Hugging Face batch's 1.45x, ``benchmarks/bench_head_data.py``), else (or
    ``False``) through the Hugging Face forward (:class:`BatchLM`); :func:`batch_lm` chooses, as for the speculative
    batch."""
    _check_budget(max_new_tokens)
    dev, sampling = dec.device, dec.sampling
    prompts_t = prompt_tensors(prompts, dev, dec.max_length)
    B = len(prompts_t)
    seeds = row_seeds(seed, B)
    gens = [seed_streams(s, dev)["residual"] for s in seeds]
    lens = [int(p.numel()) for p in prompts_t]
    budget0 = [min(max_new_tokens, (dec.max_length if dec.max_length is not None else n + max_new_tokens) - n)
               for n in lens]
    rows = RowBook(B)
    for b in range(B):
        rows.stop[b] = "max_new_tokens" if budget0[b] == max_new_tokens else "context_limit"

    t_start = clock(dev)
    T = batch_lm(dec.target, B, "target") if lean else BatchLM(dec.target, B, "target")
    active = list(range(B))
    logits = None
    if any(n > 0 for n in budget0):
        ids, valid = left_pad(prompts_t, dev)
        logits = T.forward(ids, valid, keep=1)[:, -1]
    t_prefill = clock(dev)
    for b in range(B):
        if budget0[b] <= 0:
            rows.timing[b]["total"] = t_prefill - t_start
    keep = [i for i, b in enumerate(active) if budget0[b] > 0]
    if len(keep) < len(active):
        sel = torch.tensor(keep, dtype=torch.long, device=dev)
        T.select(sel)
        logits = logits[sel] if logits is not None else None
        active = [active[i] for i in keep]
    step = 0
    while active:
        R = len(active)
        p = adjust(logits, sampling, validate=False)
        nxt = sample_next(p, [gens[b] for b in active], sampling.greedy)
        host = nxt.tolist()
        finished = []
        for i, b in enumerate(active):
            t = int(host[i])
            rows.steps[b].append(BatchStepInfo(0, 0, t, 1, len(rows.tokens[b]), "none", row=b, batch_step=step,
                                               batch_rows=R, width=0))
            rows.tokens[b].append(t)
            if t in dec.eos:
                rows.stop[b] = "eos"
                finished.append(i)
            elif len(rows.tokens[b]) >= budget0[b]:
                finished.append(i)
        if finished:
            t_now = clock(dev)
            for i in finished:
                rows.timing[active[i]]["total"] = t_now - t_start
            keep = [i for i in range(R) if i not in set(finished)]
            active = [active[i] for i in keep]
            if not active:
                break
            sel = torch.tensor(keep, dtype=torch.long, device=dev)
            T.select(sel)
            nxt = nxt[sel]
            T.tidy()
        logits = T.forward(nxt[:, None], torch.ones(len(active), 1, dtype=torch.bool, device=dev), keep=1)[:, -1]
        step += 1
    t_end = clock(dev)
    for b in range(B):
        rows.totals[b] = {"draft": 0.0, "verify": rows.timing[b]["total"] - (t_prefill - t_start), "overhead": 0.0}
    return batch_results(rows, prompts_t, seeds, t_start, t_prefill,
                    {"draft": 0.0, "verify": t_end - t_prefill, "overhead": 0.0}, t_end, dec.tokenizer, True)


# ----------------------------------------------------------------------------------------------
# metrics


def batch_metrics(results: Sequence[BatchGenerationResult]):
    """Per-row tokens/s of one batch's results, with the batch's tokens/s: a DataFrame, one row per
    prompt (``row, new_tokens, time_s, tokens_per_second, batch_size, batch_new_tokens, batch_time_s,
    batch_tokens_per_second``). A row's time runs from the batch's start to the row's finish."""
    import pandas as pd

    if not results or not all(isinstance(r, BatchGenerationResult) for r in results):
        raise ValueError("results: expected the list of BatchGenerationResult of one generate_batch call")
    return pd.DataFrame([{
        "row": r.row, "new_tokens": r.new_tokens, "time_s": r.timing.get("total", math.nan),
        "tokens_per_second": r.tokens_per_second, "batch_size": r.batch_size,
        "batch_new_tokens": r.batch_new_tokens, "batch_time_s": r.batch_timing.get("total", math.nan),
        "batch_tokens_per_second": r.batch_tokens_per_second,
    } for r in results])
