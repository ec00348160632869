"""Batched decoding against batch size: where speculation stops paying (``m2_speedup_vs_batch``).

:func:`batch_study` decodes batches with batched autoregressive and batched speculative decoding
(:mod:`spade_lib.decoding.batch`) at each batch size ``B`` and temperature, in alternating turns over several timed
**rounds**: round ``k`` decodes rows ``prompts[(k B + b) mod n]``, ``b = 0 .. B-1``, seeds ``seed + k B + b`` (distinct
prompts within a batch while ``B <= n``; the rounds walk through the suite). Per point:

- throughput ``sum_k tokens_k / sum_k seconds_k`` per method and the speedup as their ratio (of totals), with every
  round's tokens and seconds, from which :func:`spade_lib.runs.batch_speedup.with_intervals` adds ``speedup_low`` /
  ``speedup_high`` (:func:`spade_lib.runs.metrics.bootstrap_speedup`, rounds resampled; a round's AR and speculative
  batches are paired: same prompts and seeds, timed back to back, so the interval holds the prompt-to-prompt and
  round-to-round spread); this module measures, the interval is computed a layer up;
- the prediction ``a(B) tau / (gamma c(B) + r(B) + o(B))`` (:func:`spade_lib.theory.speedup`), ``alpha`` from the
  speculative steps, ``c(B)``, ``r(B)`` the batched forwards' cost ratios (:func:`forward_costs`), ``o(B) = o t(1 x 1) /
  t(B x 1)`` the single-sequence loop overhead ``o`` (in one-token target forwards) as the same seconds per batched
  step; ``a(B)`` (``ar_level``) the AR baseline's step over that ``B x 1`` forward: the baseline is SPADE's own batched
  AR on the lean weights (:class:`~spade_lib.decoding.model.lean_batch.LeanBatch`, the fastest batched AR here), as the
  speculative batch's forwards are (:func:`spade_lib.decoding.batch.batch_lm`: HF's ``BatchLM`` only for a model
  without lean weights); ``predicted_forwards`` is the same with ``o = 0``.

The speculative batch's forwards (ragged rows, holes, a growing batched cache) are not the cost table's (single
sequence, 128-token cache): each prediction uses its own loop's costs. :func:`stops_paying`: per temperature, the
smallest ``B`` whose measured interval lies below 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from spade_lib import devices, measures, rates, theory
from spade_lib.decoding.batch import batch_lm, left_pad
from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
from spade_lib.decoding.model.adapter import CausalLMAdapter, as_token_tensor
from spade_lib.decoding.model.lean_batch import LeanBatch
from spade_lib.decoding.studies.divergence import classify_greedy
from spade_lib.sampling import SamplingConfig

__all__ = ["BatchStudyConfig", "forward_costs", "round_rows", "batch_study", "stops_paying", "batched_greedy_check"]

@dataclass(frozen=True)
class BatchStudyConfig:
    """What :func:`batch_study` measures."""

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)  # rows decoded together
    gamma: int = 4                                   # draft length (fixed policy)
    temperatures: tuple[float, ...] = (0.0, 1.0)     # 0 = greedy
    max_new_tokens: int = 32                         # tokens per row
    warmup: int = 1                                  # untimed rounds per (temperature, batch size)
    repeats: int = 4                                 # timed rounds per point, each on its own prompts (>= 2: an interval)
    cost_repeats: int = 9                            # timed rounds of forwards per cost ratio (median)
    seed: int = 0                                    # row b of round k uses seed + k B + b

    def __post_init__(self) -> None:
        def check_int(name, v, min):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < min:
                raise ValueError(f"{name}: must be an integer >= {min}, got {v!r}")

        if not self.batch_sizes:
            raise ValueError("batch_sizes: at least one batch size")
        for b in self.batch_sizes:
            check_int("batch_sizes", b, min=1)
        for name, lo in (("gamma", 1), ("max_new_tokens", 1), ("warmup", 0), ("repeats", 1), ("cost_repeats", 1),
                         ("seed", 0)):
            check_int(name, getattr(self, name), min=lo)
        for t in self.temperatures:
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
                raise ValueError(f"temperatures: each must be a number >= 0, got {t!r}")


def forward_costs(target, draft, prompts: Sequence[Sequence[int]], gamma: int, repeats: int = 9
                  ) -> dict[str, float]:
    """Measured cost ratios of one batched step for these ``B`` prompts (their caches prefilled):
    ``r = t(target, B x (gamma+1) tokens) / t(target, B x 1)`` and ``c = t(draft, B x 1) / t(target, B x 1)``,
    timed in turns by :func:`spade_lib.devices.time_in_turns` (the one timing loop: order
    rotated each round, ``repeats`` rounds after one untimed round, medians of the per-round ratios).
    Also returns the median times (s) ``t_target_1``, ``t_target_g``, ``t_draft_1`` and ``t_ar_1``, the AR
    baseline's ``B x 1`` step on SPADE's batched lean forward (:class:`~spade_lib.decoding.model.lean_batch.LeanBatch`,
    where the target has one; else the same forward), and ``ar_level = t_ar_1 / t_target_1``: an AR step in units
    of the speculative loop's ``B x 1`` target forward."""
    ta = target if isinstance(target, CausalLMAdapter) else CausalLMAdapter(target)
    da = draft if isinstance(draft, CausalLMAdapter) else CausalLMAdapter(draft)
    dev = ta.device
    rows = [as_token_tensor(p, dev) for p in prompts]
    ids, valid = left_pad(rows, dev)
    forwards = {}
    with torch.inference_mode():
        for name, adapter, width in (("t_target_1", ta, 1), ("t_target_g", ta, gamma + 1), ("t_draft_1", da, 1)):
            lm = batch_lm(adapter, len(rows), name)
            lm.forward(ids, valid, keep=1)
            new = ids[:, -1:].expand(-1, width).contiguous()

            def step(lm=lm, n0=lm.length.clone(), new=new, width=width):
                lm.forward(new, torch.ones_like(new, dtype=torch.bool), keep=0 if width > 1 else 1)
                lm.rollback(n0)
                lm.tidy()

            forwards[name] = step
        if ta.lean is not None:  # as AutoregressiveDecoder.generate_batch runs it
            ar = LeanBatch(ta.lean, len(rows))
            ar.forward(ids, valid, keep=1)

            def ar_step(lm=ar, s0=ar.slots, new=ids[:, -1:].contiguous()):
                lm.forward(new, torch.ones_like(new, dtype=torch.bool), keep=1)
                lm.truncate(s0)

            forwards["t_ar_1"] = ar_step
        times = devices.time_in_turns(forwards, reps=repeats, warmup=1, device=dev)
    times.setdefault("t_ar_1", times["t_target_1"])  # no lean batch: the AR baseline runs the same HF forward
    out = {name: float(np.median(v)) for name, v in times.items()}
    t1 = np.maximum(times["t_target_1"], 1e-12)
    out["r"] = float(np.median(times["t_target_g"] / t1))
    out["c"] = float(np.median(times["t_draft_1"] / t1))
    out["ar_level"] = float(np.median(times["t_ar_1"] / t1))
    return out


def round_rows(prompts: Sequence[Sequence[int]], batch_size: int, k: int, seed: int
               ) -> tuple[list[list[int]], list[int], list[int]]:
    """Round ``k``'s batch (module docstring): the rows ``prompts[(k B + b) mod n]``, their seeds
    ``seed + k B + b`` and the prompt indices, ``b = 0 .. B-1``."""
    index = [(k * batch_size + b) % len(prompts) for b in range(batch_size)]
    return [list(prompts[i]) for i in index], [seed + k * batch_size + b for b in range(batch_size)], index


def batch_study(target, draft, prompts: Sequence[Sequence[int]], config: BatchStudyConfig = BatchStudyConfig(), *,
                tokenizer=None, eos_token_id=None, progress: bool = False, overhead: float = 0.0):
    """Throughput (total new tokens per second) of batched autoregressive and batched speculative
    decoding against batch size, every round's tokens and seconds (for the speedup's interval,
    :func:`spade_lib.runs.batch_speedup.with_intervals`) and the cost model's prediction (module docstring).

    For each temperature and batch size ``B``: ``config.warmup`` untimed then ``config.repeats`` timed
    rounds (:func:`round_rows`), AR and speculative batches alternating in turns within a round.
    ``alpha`` is estimated from the timed speculative steps as ``sum n / sum min(n + 1, gamma)`` (accepted
    over judged drafts); ``overhead`` is the pair's single-sequence loop overhead ``o`` (target steps; 0:
    the forwards only). Returns a DataFrame, one row per (temperature, batch size): ``temperature,
    batch_size, rounds, prompts`` (distinct prompts decoded), ``ar_tps, spec_tps, speedup, alpha, tau, c,
    r, overhead`` (``o(B)``), ``predicted, predicted_forwards, ar_tokens,
    spec_tokens, ar_time_s, spec_time_s`` (totals over the timed rounds) and the per-round lists
    ``ar_round_tokens, spec_round_tokens, ar_round_s, spec_round_s``.
    """
    import pandas as pd

    if not isinstance(config, BatchStudyConfig):
        raise TypeError(f"config: expected a BatchStudyConfig, got {type(config).__name__}")
    if not prompts:
        raise ValueError("prompts: at least one prompt")
    if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or not (overhead >= 0 and math.isfinite(overhead)):
        raise ValueError(f"overhead: must be a finite number >= 0, got {overhead!r}")
    rows = []
    points = [(T, B) for T in config.temperatures for B in config.batch_sizes]
    if progress:
        from tqdm import tqdm

        points = tqdm(points, desc="batch study", leave=False)
    costs: dict[int, dict[str, float]] = {}
    for T, B in points:
        sampling = SamplingConfig(temperature=float(T))
        spec = SpeculativeDecoder(target, draft, gamma=config.gamma, sampling=sampling, record=False,
                                  tokenizer=tokenizer, eos_token_id=eos_token_id)
        ar = AutoregressiveDecoder(spec.target, sampling=sampling, tokenizer=tokenizer, eos_token_id=eos_token_id)
        results: dict[str, list] = {"ar": [], "spec": []}      # every timed round's results
        tokens: dict[str, list[int]] = {"ar": [], "spec": []}  # per timed round
        seen: set[int] = set()
        done = {"ar": 0, "spec": 0}                             # rounds each has run, warm-up included

        def member(name: str, dec) -> Callable[[], None]:
            def one_round() -> None:  # round k: its rows and seeds (round_rows), kept once warm
                k = done[name]
                done[name] += 1
                batch, seeds, index = round_rows(prompts, B, k, config.seed)
                # the AR baseline is SPADE's own batched AR (its lean batch forward where the target has one:
                # the fastest batched AR the stack offers); the speculative batch runs the HF batched forward
                out = dec.generate_batch(batch, config.max_new_tokens, seed=seeds)
                if k >= config.warmup:
                    results[name] += out
                    tokens[name].append(sum(r.new_tokens for r in out))
                    seen.update(index)
            return one_round

        # in turns: round k runs AR then speculative for even k, the other way round for odd k
        times = {name: [float(t) for t in ts] for name, ts in devices.time_in_turns(
            {"ar": member("ar", ar), "spec": member("spec", spec)}, reps=config.repeats, warmup=config.warmup,
            device=spec.device).items()}
        for b in sorted({B, 1} if overhead > 0 else {B}):
            if b not in costs:
                costs[b] = forward_costs(spec.target, spec.drafter.adapter, round_rows(prompts, b, 0, 0)[0],
                                         config.gamma, config.cost_repeats)
        n = [s.n_accepted for r in results["spec"] for s in r.steps if s.gamma > 0]
        judged = [min(s.n_accepted + 1, s.gamma) for r in results["spec"] for s in r.steps if s.gamma > 0]  # R_s
        alpha = float(rates.alpha(sum(n), sum(judged)))  # A / R (NaN: nothing judged)
        steps = [s for r in results["spec"] for s in r.steps]  # every step, as a summary counts them
        tau = float(measures.tau(sum(s.n_accepted for s in steps), len(steps))) if n else float("nan")
        c, r, level = costs[B]["c"], costs[B]["r"], costs[B]["ar_level"]
        o_B = float(overhead) * costs[1]["t_target_1"] / costs[B]["t_target_1"] if overhead > 0 else 0.0
        ok = alpha == alpha
        ar_tokens, spec_tokens = sum(tokens["ar"]), sum(tokens["spec"])
        ar_t, spec_t = float(sum(times["ar"])), float(sum(times["spec"]))
        rows.append({
            "temperature": float(T), "batch_size": B, "rounds": config.repeats, "prompts": len(seen),
            "ar_tps": ar_tokens / ar_t, "spec_tps": spec_tokens / spec_t,
            "speedup": (spec_tokens / spec_t) / (ar_tokens / ar_t),
            "alpha": alpha, "tau": tau, "c": c, "r": r, "overhead": o_B, "ar_level": level,
            # against the lean batched AR: its step costs ar_level of the loop's B x 1 forward
            "predicted": level * float(theory.speedup(alpha, config.gamma, c, verify_cost=r, overhead=o_B))
            if ok else math.nan,
            "predicted_forwards": level * float(theory.speedup(alpha, config.gamma, c, verify_cost=r))
            if ok else math.nan,
            "ar_tokens": ar_tokens, "spec_tokens": spec_tokens, "ar_time_s": ar_t, "spec_time_s": spec_t,
            "ar_round_tokens": tokens["ar"], "spec_round_tokens": tokens["spec"],
            "ar_round_s": times["ar"], "spec_round_s": times["spec"],
        })
    return pd.DataFrame(rows)


def stops_paying(study, column: str = "speedup") -> dict[float, int | None]:
    """Per temperature, the smallest batch size at which speculation stops paying: for the measured
    ``"speedup"``, the first ``B`` whose interval lies wholly below 1 (``speedup_high < 1``: beyond its
    interval); for ``"predicted"`` (or another column without an interval), the first ``B`` whose value is
    below 1. ``None`` if there is none in the study's range (for the measurement: no verdict, not "it pays")."""
    out: dict[float, int | None] = {}
    bound = "speedup_high" if column == "speedup" else column
    if bound not in study.columns:
        raise ValueError(f"study: no column {bound!r}" + (" (the measured speedup's interval: "
                                                          "spade_lib.runs.batch_speedup.with_intervals)"
                                                          if column == "speedup" else ""))
    for T, sub in study.sort_values("batch_size").groupby("temperature", sort=True):
        below = sub.loc[sub[bound] < 1.0, "batch_size"]
        out[float(T)] = int(below.iloc[0]) if len(below) else None
    return out


def batched_greedy_check(target, draft, prompts: Sequence[Sequence[int]], *, gamma: int, max_new_tokens: int
                         ) -> dict[str, int]:
    """The batched decoder's exactness on ``prompts``: one greedy speculative batch of them all against
    each prompt decoded alone by the same decoder (``gamma``, ``max_new_tokens``), row by row through
    :func:`spade_lib.decoding.studies.divergence.classify_greedy`. Returns the count per class (``identical``,
    ``near_tie``: a rounding-level flip of a near tie, ``bug``)."""
    if not prompts:
        raise ValueError("prompts: at least one prompt")
    dec = SpeculativeDecoder(target, draft, gamma=gamma, sampling=SamplingConfig(temperature=0), record=False)
    batched = dec.generate_batch([list(p) for p in prompts], max_new_tokens)
    cases = ((i, row.tokens, dec.generate(ids, max_new_tokens).tokens, ids)
             for i, (row, ids) in enumerate(zip(batched, prompts)))
    return classify_greedy(cases, target)[0]
