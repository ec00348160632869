"""Forward costs ``c`` and ``r(g)`` from paired micro-benchmarks: the one cost measurement of SPADE.

The cost model (:mod:`spade_lib.theory`) prices one speculative step at ``g c + r(g)`` target forwards:

- ``c``    = t(draft, 1 token) / t(target, 1 token), each with a ``context``-token KV cache;
- ``r(g)`` = t(target, ``g + 1`` tokens) / t(target, 1 token), the verification forward;
- a tree of ``N`` nodes: ``r(N)`` = t(target, ``N + 1`` rows ``[t, x_0 .. x_{N-1}]``, tree mask) / t(target, 1 token).

Every ratio comes from :func:`spade_lib.devices.time_in_turns`: the compared forwards are timed **in turns** (each round runs every one,
in an order rotated per round, each rolled back), so load hits numerator and denominator alike, and a ratio is the
**median over rounds of the per-round ratios**. Each forward runs in a burst of three and the later calls are kept,
as decoding repeats one forward. :func:`measure_costs` does this for decoding adapters (batch size 1: cost tables,
``bench_decode``, zoo manifests), :func:`measure_tree_cost` for trees, :func:`spade_lib.decoding.batch.forward_costs`
for ``B`` rows at once; cached per pair by :func:`spade_lib.runs.costs.pair_costs`. ``c_trace`` / ``r_trace`` of
:func:`spade_lib.runs.metrics.run_metrics` (run timings over the AR time per token, prefill included) are estimates.

**Feature heads** (:mod:`spade_lib.decoding.drafts.eagle`, :mod:`spade_lib.decoding.drafts.medusa`): ``c`` is one *drafting step*
of the head over the target's one-token forward, as the EAGLE papers count it (:class:`HeadStep`), timed by the same
protocol on seeded random features (a forward's time does not depend on them):

- EAGLE: ``q = lm_head(norm(layer(fc(f_t), E x_{t+1})))`` on a ``context``-position head cache, with the fusion ``fc``
  of one fresh feature ``f_t`` and the drafter's ``[Vd] -> [V]`` scatter (``target_logits``); later chain steps feed
  ``o`` back (EAGLE-3: no ``fc``, slightly cheaper; EAGLE-1: through ``fc``), so ``gamma c`` rounds a chain up;
- Medusa: one head (ResBlocks, ``lm_head_i`` over ``Vd``, scatter) on one state; ``g`` tokens run ``g`` heads
  (:class:`~spade_lib.decoding.drafts.medusa.MedusaDrafter`): ``g c`` exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from spade_lib.decoding.model.heads import DraftHead
from spade_lib.devices import clock as device_clock, time_in_turns

__all__ = ["measure_costs", "measure_tree_cost", "measure_loop_overhead", "verify_cost_fn",
           "HeadStep", "is_head"]


def is_head(module) -> bool:
    """Whether ``module`` is a feature head (a :class:`~spade_lib.decoding.model.heads.DraftHead`: EAGLE, Medusa)."""
    return isinstance(module, DraftHead)


class HeadStep:
    """One drafting step of a feature head, shaped like a decoding adapter for :func:`measure_costs`
    (module docstring), on the head's own :meth:`~spade_lib.decoding.model.heads.DraftHead.cost_step`:
    ``prefill(ids)`` puts ``len(ids)`` draft positions in its context (an EAGLE head's cache),
    ``extend(ids[:1])`` is the timed step (EAGLE: fuse the next feature with ``ids[0]``, one layer pass at
    the next position; Medusa: one head), draft logits scattered to ``V``, and ``rollback(n)`` crops back.

    ``features [m, F]`` (``F = sum of the widths of the target layers the head reads``), when given,
    replace the seeded random features: position ``j`` of the cache (and the step after ``n`` of them)
    pairs ``features[j]`` with the token fed there, so after ``prefill(x_1 .. x_n)``, ``extend([x_{n+1}])``
    returns the logits an :class:`~spade_lib.decoding.drafts.eagle.EagleDrafter` drafts first after observing
    ``x_0 .. x_n`` with those features (``tests/test_costs.py``)."""

    def __init__(self, head: DraftHead, features: torch.Tensor | None = None, seed: int = 0):
        if not is_head(head):
            raise ValueError(f"head: expected a DraftHead (EAGLE, Medusa), got {type(head).__name__}")
        self.head, self.max_length = head.eval(), None
        self.device = next(head.parameters()).device
        self.vocab_size = int(head.config.vocab_size)
        width = int(head.in_features)
        if features is not None and (features.dim() != 2 or features.shape[1] != width):
            raise ValueError(f"features: expected [m, {width}], got {list(features.shape)}")
        self._features = features
        self._gen = torch.Generator().manual_seed(seed)
        self._width, self._run, self.length = width, None, 0

    def _feature(self, j: int, n: int = 1) -> torch.Tensor:
        if self._features is not None:
            if j + n > self._features.shape[0]:
                raise ValueError(f"features: {self._features.shape[0]} rows, position {j + n - 1} asked for")
            return self._features[j: j + n].to(self.device)
        return torch.randn(n, self._width, generator=self._gen).to(self.device)

    def prefill(self, ids: torch.Tensor) -> None:
        n = int(ids.numel())
        self.length = n
        self._run = self.head.cost_step()  # the engine the drafter runs on (native kernels where they run)
        self._run.prefill(self._feature(0, n), ids.reshape(n))
        self._next = self._feature(n)  # the fresh feature the timed step reads (the same one every time)

    def extend(self, ids: torch.Tensor, last_only: bool = True) -> torch.Tensor:
        """The timed step: ``[1, V]`` logits (``-inf`` off the draft vocabulary)."""
        logits = self.head.target_logits(self._run.step(self._next, ids, self.length + 1), self.vocab_size)
        self.length += 1
        return logits

    def rollback(self, length: int) -> None:
        if self._run is not None and self.length > length:
            self._run.crop(length)
        self.length = length


@torch.inference_mode()
def measure_costs(target, draft, max_gamma: int, context: int = 128, clock: Callable[[], float] | None = None,
                  reps: int = 30, device=None, max_seconds: float | None = None) -> dict:
    """Interleaved micro-benchmarks of decoding adapters (:class:`spade_lib.decoding.model.adapter.CausalLMAdapter`).

    ``draft=None`` (a drafter without a model, e.g. prompt lookup) gives ``c = 0``; a feature head (or its
    :class:`HeadStep`) gives the head's drafting step (module docstring). Returns ``{"c",
    "r": {g: r(g) for g = 1 .. max_gamma}, "t_target", "t_draft", "t_verify": {g: s}, "context",
    "reps"}`` (times in seconds, medians; ratios are medians of per-round ratios; ``reps``: the rounds timed,
    fewer than asked where ``max_seconds`` bounds them, :func:`time_in_turns`)."""
    if isinstance(max_gamma, bool) or not isinstance(max_gamma, int) or max_gamma < 1:
        raise ValueError(f"max_gamma: must be an integer >= 1, got {max_gamma!r}")
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps: must be an integer >= 1, got {reps!r}")
    if draft is not None and is_head(draft):
        draft = HeadStep(draft)
    models = [target] + ([draft] if draft is not None else [])
    vocab = min(m.vocab_size for m in models)
    limit = min(x for x in [m.max_length for m in models] + [context + max_gamma + 2] if x is not None)
    ctx_len = max(1, limit - max_gamma - 2)
    ids = torch.randint(0, vocab, (ctx_len + max_gamma + 1,), generator=torch.Generator().manual_seed(0))
    ids = ids.to(target.device)
    for m in models:
        m.prefill(ids[:ctx_len])
    new = ids[ctx_len:]

    def tfwd(k):
        target.extend(new[:k], last_only=k == 1).argmax(-1)
        target.rollback(ctx_len)

    def dfwd():
        if draft is not None:
            draft.extend(new[:1], last_only=True).argmax(-1)
            draft.rollback(ctx_len)

    forwards = {"t1": lambda: tfwd(1), **{g: (lambda g=g: tfwd(g + 1)) for g in range(1, max_gamma + 1)}}
    if draft is not None:
        forwards["d1"] = dfwd
    times = time_in_turns(forwards, reps=reps, warmup=3, burst=3, clock=clock, device=device, max_seconds=max_seconds)
    t1 = times["t1"]
    reps = len(t1)
    d1 = times.get("d1", np.zeros(reps))
    tk = {g: times[g] for g in range(1, max_gamma + 1)}
    t1a = np.maximum(np.asarray(t1), 1e-9)
    r = {g: float(np.median(np.asarray(v) / t1a)) for g, v in tk.items()}
    c = float(np.median(np.asarray(d1) / t1a))
    return {"c": c, "r": r, "t_target": float(np.median(t1)), "t_draft": float(np.median(d1)),
            "t_verify": {g: float(np.median(v)) for g, v in tk.items()}, "context": ctx_len, "reps": reps}


@torch.inference_mode()
def measure_tree_cost(target, parents, context: int = 128, clock: Callable[[], float] | None = None,
                      reps: int = 30, device=None) -> dict:
    """``r(N)`` of one draft tree (``parents [N]``, ``-1``: a child of the root) on a decoding adapter: the
    decoder's verification forward -- ``[t, x_0 .. x_{N-1}]``, row ``i + 1`` masked to the path of node ``i``
    -- over a one-token forward, each with a ``context``-token KV cache, timed in turns with bursts of three
    as :func:`measure_costs` times ``r(g)``. Returns ``{"r", "n_nodes", "t_target", "t_verify", "context",
    "reps"}`` (seconds, medians; ``r`` the median of per-round ratios)."""
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps: must be an integer >= 1, got {reps!r}")
    ps = [int(p) for p in parents]
    n = len(ps)
    if n < 1 or any(not -1 <= p < i for i, p in enumerate(ps)):
        raise ValueError(f"parents: a tree of at least one node in topological order, got {ps}")
    limit = min(x for x in [target.max_length, context + n + 2] if x is not None)
    ctx_len = max(1, limit - n - 2)
    ids = torch.randint(0, target.vocab_size, (ctx_len + n + 1,), generator=torch.Generator().manual_seed(0))
    ids = ids.to(target.device)
    target.prefill(ids[:ctx_len])
    rows = [-1] + [p + 1 for p in ps]

    def one():
        target.extend(ids[ctx_len:ctx_len + 1], last_only=True).argmax(-1)
        target.rollback(ctx_len)

    def tree():
        target.extend(ids[ctx_len:], parents=rows).argmax(-1)
        target.rollback(ctx_len)

    times = time_in_turns({"t1": one, "tree": tree}, reps=reps, warmup=3, burst=3, clock=clock, device=device)
    t1 = np.maximum(times["t1"], 1e-9)
    return {"r": float(np.median(times["tree"] / t1)), "n_nodes": n, "t_target": float(np.median(times["t1"])),
            "t_verify": float(np.median(times["tree"])), "context": ctx_len, "reps": reps}


@torch.inference_mode()
def measure_loop_overhead(target, *, context: int = 128, steps: int = 32, reps: int = 8, min_seconds: float = 5.0,
                          max_reps: int = 64, max_seconds: float | None = None, device=None) -> dict:
    """The speculative loop's cost per step in autoregressive steps, for the cost model's ``overhead``.

    Two decode loops of ``steps`` greedy tokens on one seeded ``context``-token prompt, timed in turns
    (:func:`time_in_turns`: rotated, after one warm-up round, at least ``reps`` rounds and as many more as
    ``min_seconds`` of rounds take, up to ``max_reps``: on the embedded pair a round is ~0.2 s and the
    AR loop's speed moves by a tenth between seconds, so 8 rounds put ``null_step`` anywhere in 1.46-1.71
    over five measurements and 48 rounds in 1.50-1.65): autoregressive decoding and
    speculative decoding with the null draft at ``gamma = 1`` (each step a 2-token target forward, the
    draft always rejected, one token out), both with step-level records only, as a timed run has them.
    Each loop's time is its generation's own minus its prefill (``GenerationResult.timing``), so per
    round ``s_AR`` is seconds per autoregressive token and ``s_null`` seconds per null step. Returns
    ``{"null_step": median over rounds of s_null / s_AR, "s_ar", "s_null" (medians, seconds), "steps",
    "context", "reps"}`` (``reps``: the rounds timed).

    The model's loop cost is then ``o = null_step - r(1)`` (:func:`spade_lib.runs.costs.pair_costs`
    does this with each draft's ``r(1)``): a speculative step costs ``g c + r(g) + o`` AR steps, and the
    null draft's prediction at ``gamma = 1``, ``1 / (r(1) + o)``, is what this loop measured. ``o`` holds
    what the forwards do not: drafting calls, the verification's sampling and bookkeeping, rollback, less
    the AR loop's own per-token work (to first order ``(o_spec - o_AR) / t_1``); it is measured once per
    pair and taken as the same at every ``gamma``. ``max_seconds`` caps the timed rounds at what fits in it (3
    at least): a 1.5 B-parameter target's round is ~25 s, where 8 rounds were 4 minutes of a notebook."""
    from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
    from spade_lib.decoding.drafts.drafters import NullDrafter
    from spade_lib.decoding.model.adapter import CausalLMAdapter
    from spade_lib.sampling import SamplingConfig

    for name, v, low in (("steps", steps, 2), ("reps", reps, 1), ("context", context, 1), ("max_reps", max_reps, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name}: must be an integer >= {low}, got {v!r}")
    if isinstance(min_seconds, bool) or not isinstance(min_seconds, (int, float)) or not 0 <= min_seconds < 1e6:
        raise ValueError(f"min_seconds: must be a number >= 0, got {min_seconds!r}")
    adapter = target if isinstance(target, CausalLMAdapter) else CausalLMAdapter(target)
    limit = adapter.max_length
    n_ctx = max(1, min(context, limit - steps - 2) if limit is not None else context)
    prompt = torch.randint(0, adapter.vocab_size, (n_ctx,), generator=torch.Generator().manual_seed(0))
    greedy = SamplingConfig(temperature=0.0)
    ar = AutoregressiveDecoder(adapter, sampling=greedy, eos_token_id=[])
    null = SpeculativeDecoder(adapter, NullDrafter(adapter.device), gamma=1, sampling=greedy, eos_token_id=[],
                              record="light")
    loops: dict[str, list[float]] = {"ar": [], "null": []}

    def loop(name, decoder, forwards):
        def run():
            t = decoder.generate(prompt, steps, seed=0).timing
            loops[name].append((t["total"] - t["prefill"]) / forwards)
        return run

    # the AR loop's first token comes from its prefill: steps - 1 forwards; the null loop's every step is one
    forwards = {"ar": loop("ar", ar, steps - 1), "null": loop("null", null, steps)}
    t0 = device_clock(device)
    time_in_turns(forwards, reps=1, warmup=1, device=device)  # a warm-up round, then one timed: its length
    per_round = max((device_clock(device) - t0) / 2, 1e-9)
    reps = max(reps, min(max_reps, int(np.ceil(min_seconds / per_round))))
    if max_seconds is not None:
        reps = max(3, min(reps, int(max_seconds / per_round)))
    loops["ar"].clear(), loops["null"].clear()
    time_in_turns(forwards, reps=reps, warmup=0, device=device)
    s_ar, s_null = np.asarray(loops["ar"]), np.asarray(loops["null"])
    return {"null_step": float(np.median(s_null / np.maximum(s_ar, 1e-12))), "s_ar": float(np.median(s_ar)),
            "s_null": float(np.median(s_null)), "steps": steps, "context": n_ctx, "reps": reps}


def verify_cost_fn(costs: dict) -> Callable[[int], float]:
    """``r(g)`` from :func:`measure_costs`' table: :func:`spade_lib.theory.verify_cost_curve` of its points (1 at
    ``g = 0``, piecewise linear between measured ``g``, extended through the last two points)."""
    from spade_lib.theory import verify_cost_curve

    return verify_cost_curve({int(g): float(v) for g, v in costs["r"].items()})


