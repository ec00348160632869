"""One speculative decoding step after the target's forward: verify, record, commit — for ``R`` rows at once.

Notation (Leviathan et al. 2023): ``p`` target, ``q`` draft, ``gamma`` draft length (``g`` here, shared by the rows of a
call). Both loops call this module and keep only what is theirs (drafter, target cache, bookkeeping):
:meth:`spade_lib.decoding.decode.SpeculativeDecoder.generate` with ``R = 1`` and
:func:`spade_lib.decoding.batch.speculative_generate_batch` per group of rows that drafted the same ``g``. Given
``logits_p [R, g + 1, V]``, the target's logits after ``[t, x_0 .. x_{g-1}]``, and ``p = adjust(logits_p)``
(:func:`spade_lib.sampling.adjust`):

1. **verify** (:meth:`Step.verify`): :func:`spade_lib.verify.verify` accepts a prefix of ``n_r`` drafts of row ``r``
   and draws its next token ``y_r``: the residual ``norm(max(0, p_n - q_n))`` at the first rejection, the bonus
   ``~ p_g`` after ``g`` accepts (or the rule's own, :mod:`spade_lib.rules`); with ``record=True`` also
   :func:`spade_lib.decoding.records.position_stats` ``[R, C, g]`` and, with ``record_topk = k``, the top-``k`` of
   ``p`` and ``q``, timed apart (``t_records``, taken out of the step's and generation's times). ``g = 0`` (no
   proposal) is a plain target step, ``y_r ~ p_0`` (:func:`sample_next`).
2. **commit** (:func:`commit`): one device -> host transfer of every row's ``n``, ``y``, drafts and statistics;
   row ``r`` emits ``x_0 .. x_{n-1}, y`` cut after the first EOS and to its budget (``common._truncate``).

**Randomness.** Row ``r`` draws from its own streams (:func:`spade_lib.decoding.common.seed_streams`): ``g`` acceptance
uniforms from ``"accept"`` (none for a deterministic rule), one next-token uniform from ``"residual"`` (none for an
``argmax_next`` rule such as greedy); one row passes the generators to :func:`~spade_lib.verify.verify`, several draw
row by row, so a row's draws never depend on its batch. **Trees** (:mod:`spade_lib.decoding.drafts.tree`, and row by row
:mod:`spade_lib.decoding.batch_tree`): :meth:`Step.verify_tree` for one row's ``N``-node tree, ``logits_p [N + 1, V]``
under the tree mask: :func:`spade_lib.verify.verify_tree` accepts a path (``mode`` applied to siblings); each node's
statistics are against ``p`` at its parent (row ``parents + 1``); the same transfer carries path, depth, sibling rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from types import SimpleNamespace

import torch

from spade_lib import rules
from spade_lib.decoding import records
from spade_lib.decoding.common import _truncate
from spade_lib.decoding.drafts.tree import DraftTree
from spade_lib.devices import clock
from spade_lib.verify import sample_inverse_cdf, verify, verify_tree

__all__ = ["Step", "Verdict", "RowFacts", "commit", "sample_next", "topk_lists"]

Streams = Mapping[str, torch.Generator]  # one row's seed_streams: "draft", "accept", "residual"


def sample_next(p: torch.Tensor, generators: Sequence[torch.Generator], greedy: bool) -> torch.Tensor:
    """``[R]`` tokens ``y_r ~ p_r`` (``p [R, V]``) by inverse CDF, one uniform from ``generators[r]``
    per row; ``argmax`` when ``greedy`` (no draw)."""
    if greedy:
        return p.argmax(dim=-1)
    if len(generators) == 1:
        u = torch.rand(1, generator=generators[0], dtype=p.dtype, device=p.device)
    else:
        u = torch.cat([torch.rand(1, generator=g, dtype=p.dtype, device=p.device) for g in generators])
    return sample_inverse_cdf(p, u)


def topk_lists(p: torch.Tensor, q: torch.Tensor, k: int) -> list[list[Any]]:
    """``[p_ids, p_probs, q_ids, q_probs]`` (host lists, the shape of ``p [..., V]`` but the last axis
    cut to ``min(k, V)``): the top-``k`` of adjusted ``p`` and ``q`` at each position."""
    k = min(k, p.shape[-1])
    tp, tq = torch.topk(p, k, dim=-1), torch.topk(q, k, dim=-1)
    return [t.tolist() for t in (tp.indices, tp.values, tq.indices, tq.values)]


@dataclass
class Verdict:
    """The verification of ``R`` rows' blocks of ``g`` drafts, on the device."""

    n_accepted: torch.Tensor          # [R] long: accepted drafts n_r
    next_token: torch.Tensor          # [R] long: residual / bonus token y_r
    names: tuple[str, ...] = ()       # the position columns of ``table`` (records.position_stats)
    table: torch.Tensor | None = None  # [R, C, g] float64 statistics (record=True), else None
    topk: list[list[Any]] | None = None  # per row [p_ids, p_probs, q_ids, q_probs], each [g][k]
    t_records: float = 0.0            # seconds spent computing table and topk (record=True), device synchronised


@dataclass
class RowFacts:
    """What one row commits in a step (host values)."""

    n: int                              # accepted drafts
    next_token: int                     # y: residual / bonus token (the plain step's sample when g = 0)
    drafted: list[int]                  # the accepted drafts x_0 .. x_{n-1}
    emitted: list[int]                  # drafted + [y], cut after the first EOS and to the budget
    hit_eos: bool                       # an EOS was emitted: the row stops
    stats: dict[str, list[float]] | None = None  # position column -> its g values (record=True)
    topk: list[list[Any]] | None = None  # [p_ids, p_probs, q_ids, q_probs] (record_topk > 0)
    path: list[int] | None = None       # a tree: the accepted nodes, root-down (None: a chain)
    tree: dict[str, list[int]] | None = None  # a tree, record=True: records.TREE_COLUMNS per node
    t_records: float = 0.0              # a tree, record=True: seconds spent computing its statistics


class Step:
    """The verify step of one decoder's ``mode`` (with ``mode_options``) under ``sampling``;
    ``full``: compute the statistics, ``topk``: record the top-``topk`` of ``p`` and ``q`` (0: none);
    ``tree_mode``: the tree rule for tree drafts (None: ``mode`` has none, a tree cannot be verified)."""

    def __init__(self, mode: str, mode_options: Mapping[str, float], greedy: bool, full: bool, topk: int,
                 tree_mode: str | None = None):
        rule = rules.get_rule(mode)
        self.mode, self.mode_options, self.greedy, self.full, self.topk = mode, dict(mode_options), greedy, full, topk
        self.tree_mode = tree_mode
        self.draw_accept = not rule.deterministic   # acceptance uniforms from "accept"
        self.draw_next = not rule.argmax_next       # a next-token uniform from "residual"

    def verify(self, logits_p: torch.Tensor, p: torch.Tensor, x: torch.Tensor, q: torch.Tensor,
               q_logits: torch.Tensor | None, streams: Sequence[Streams]) -> Verdict:
        """Verify ``R`` blocks: ``logits_p``, ``p [R, g + 1, V]`` (raw and adjusted target), ``x [R, g]``
        drafts, ``q [R, g, V]`` adjusted draft distributions, ``q_logits [R, g, V]`` raw draft logits
        (None: a logit-free drafter), ``streams[r]`` row ``r``'s generators."""
        if len(streams) == 1:
            s = streams[0]
            res = verify(p, q, x, mode=self.mode, generator=s["accept"], residual_generator=s["residual"],
                         validate=False, **self.mode_options)
        else:
            g = x.shape[1]
            u = nu = None
            if self.draw_accept:
                u = torch.cat([torch.rand((1, g), generator=s["accept"], dtype=p.dtype, device=p.device)
                               for s in streams])
            if self.draw_next:
                nu = torch.cat([torch.rand((1,), generator=s["residual"], dtype=p.dtype, device=p.device)
                                for s in streams])
            res = verify(p, q, x, mode=self.mode, uniforms=u, next_uniforms=nu, validate=False,
                         **self.mode_options)
        if not self.full:
            return Verdict(res.n_accepted, res.next_token)
        t0 = clock(p.device)
        names, table = records.position_stats(records.StatInputs(logits_p, p, x, q, q_logits, res))
        topk = None
        if self.topk:
            parts = topk_lists(p[:, :x.shape[1]], q, self.topk)
            topk = [[part[r] for part in parts] for r in range(len(streams))]
        return Verdict(res.n_accepted, res.next_token, names, table, topk, clock(p.device) - t0)

    def verify_tree(self, logits_p: torch.Tensor, p: torch.Tensor, draft: DraftTree, parents: list[int],
                    streams: Streams, budget: int, eos: frozenset[int]) -> RowFacts:
        """Verify and commit one row's tree: ``logits_p``, ``p [N + 1, V]`` (row 0 after ``t``, row
        ``i + 1`` after node ``i``), ``parents`` the checked ``draft.parents`` on the host; one transfer."""
        if self.tree_mode is None:
            raise ValueError(f"mode: {self.mode!r} has no tree rule (spade_lib.rules.tree_rule_names(): "
                             f"{rules.tree_rule_names()}); a tree draft cannot be verified with it")
        res = verify_tree(p[None], None if draft.q is None else draft.q[None], draft.tokens[None],
                          draft.parents[None], mode=self.tree_mode, draws=draft.draws, generator=streams["accept"],
                          residual_generator=streams["residual"], validate=False, **self.mode_options)
        g = draft.gamma
        head = torch.cat([res.n_accepted, res.next_token, res.path[0], draft.tokens]).to(torch.float64)
        stats = tree = topk = None
        t_records = 0.0
        if self.full:  # the same one transfer, with the statistics and each node's depth and sibling rank
            t0 = clock(p.device)
            rows = torch.tensor(parents, dtype=torch.long, device=p.device) + 1
            inputs = _tree_inputs(logits_p, p, draft, res, rows)
            names, tab = records.position_stats(inputs)
            cols = names + ("depth", "sibling_rank")
            flat = torch.cat([tab[0], torch.stack([draft.depth, draft.sibling_rank]).to(torch.float64)])
            topk = topk_lists(inputs.p[0], inputs.q[0], self.topk) if self.topk else None
            t_records = clock(p.device) - t0
            host = torch.cat([head, flat.flatten()]).tolist()
            o = 2 + 2 * g
            stats = {name: host[o + j * g:o + (j + 1) * g] for j, name in enumerate(cols)}
            tree = {"node": list(range(g)), "parent": parents, "depth": [int(d) for d in stats.pop("depth")],
                    "sibling_rank": [int(r) for r in stats.pop("sibling_rank")]}
        else:
            host = head.tolist()
        n, y = int(host[0]), int(host[1])
        path = [int(i) for i in host[2:2 + n]]
        drafted = [int(host[2 + g + i]) for i in path]
        emitted, hit_eos = _truncate(drafted + [y], budget, eos)
        return RowFacts(n, y, drafted, emitted, hit_eos, stats, topk, path, tree, t_records)

    def plain(self, p0: torch.Tensor, streams: Sequence[Streams]) -> torch.Tensor:
        """The ``g = 0`` step: ``[R]`` tokens ``~ p0 [R, V]`` from each row's ``"residual"`` stream."""
        return sample_next(p0, [s["residual"] for s in streams], self.greedy)


def _tree_inputs(logits_p: torch.Tensor, p: torch.Tensor, draft: DraftTree, res, rows: torch.Tensor
                 ) -> records.StatInputs:
    """The statistics' inputs of one tree step: each node against ``p`` at its parent (``rows =
    parents + 1``) and its own ``q`` (one-hot where ``q`` is None); ``p_x`` and ``q_x`` are the node's
    own ``p`` and ``q`` at ``x``; ``accept_prob``, ``uniform``, ``reached`` and ``accepted`` the
    verifier's (``accept_prob`` read at the residual when the node was judged, NaN where not reached)."""
    x = draft.tokens
    p_g = p.index_select(0, rows)
    q = draft.q if draft.q is not None else torch.zeros_like(p_g).scatter_(1, x[:, None], 1.0)
    xi = x[:, None]
    node = SimpleNamespace(p_x=p_g.gather(1, xi).T, q_x=q.gather(1, xi).T, accept_prob=res.accept_prob,
                           uniforms=res.uniforms, reached=res.reached, accepted=res.accepted)
    return records.StatInputs(logits_p.index_select(0, rows)[None], p_g[None], x[None], q[None],
                              None if draft.logits is None else draft.logits[None], node)


def commit(n_accepted: torch.Tensor, next_token: torch.Tensor, x: torch.Tensor,
           groups: Sequence[tuple[Sequence[int], Verdict]], budgets: Sequence[int], eos: frozenset[int]
           ) -> list[RowFacts]:
    """Every row's :class:`RowFacts` from one device -> host transfer: ``n_accepted``, ``next_token [R]``,
    ``x [R, G]`` the drafts (row ``r``'s first ``n_r`` read), ``groups`` the verdicts whose statistics
    and top-``k`` to carry with the rows (indices into ``R``) they cover, ``budgets[r]`` the tokens row
    ``r`` may still emit, ``eos`` the stop tokens."""
    R, G = x.shape
    tables = [(rows, v) for rows, v in groups if v.table is not None]
    host = torch.cat([n_accepted, next_token, x.flatten()] + [v.table.flatten() for _, v in tables]).tolist()
    stats: list[dict[str, list[float]] | None] = [None] * R
    topk: list[list[Any] | None] = [None] * R
    o = 2 * R + R * G
    for rows, v in tables:
        C, g = len(v.names), v.table.shape[2]
        for j, r in enumerate(rows):
            values = host[o + j * C * g:o + (j + 1) * C * g]
            stats[r] = {name: values[c * g:(c + 1) * g] for c, name in enumerate(v.names)}
            if v.topk is not None:
                topk[r] = v.topk[j]
        o += len(rows) * C * g
    out = []
    for r in range(R):
        n, y = int(host[r]), int(host[R + r])
        drafted = [int(t) for t in host[2 * R + r * G:2 * R + r * G + n]]
        emitted, hit_eos = _truncate(drafted + [y], budgets[r], eos)
        out.append(RowFacts(n, y, drafted, emitted, hit_eos, stats[r], topk[r]))
    return out
