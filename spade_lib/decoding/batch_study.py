"""Batched decoding against batch size: where speculation stops paying (``m2_speedup_vs_batch``).

:func:`batch_study` decodes the same prompts with batched autoregressive and batched speculative
decoding (:mod:`spade_lib.decoding.batch`) at each batch size ``B`` and temperature, in alternating
turns, and sets the measured speedup beside the theory's prediction from the measured ``alpha`` and the
per-batch cost ratios of :func:`forward_costs`; :func:`stops_paying` reads off the smallest ``B`` at
which the speedup falls below 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from spade_lib import devices, theory
from spade_lib.decoding.adapter import CausalLMAdapter, as_token_tensor
from spade_lib.decoding.batch import BatchLM, left_pad
from spade_lib.decoding.costs import time_in_turns
from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
from spade_lib.sampling import SamplingConfig

__all__ = ["BatchStudyConfig", "forward_costs", "batch_study", "stops_paying"]

@dataclass(frozen=True)
class BatchStudyConfig:
    """What :func:`batch_study` measures."""

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)  # rows decoded together
    gamma: int = 4                                   # draft length (fixed policy)
    temperatures: tuple[float, ...] = (0.0, 1.0)     # 0 = greedy
    max_new_tokens: int = 32                         # tokens per row
    warmup: int = 1                                  # untimed batches per (temperature, batch size) and method
    repeats: int = 1                                 # timed batches per point (median)
    cost_repeats: int = 9                            # timed rounds of forwards per cost ratio (median)
    seed: int = 0                                    # row b of every batch uses seed + b

    def __post_init__(self) -> None:
        def check_int(name, v, min):  # spade_lib.validate (issue 15) is not on this branch yet
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
    timed in turns by :func:`spade_lib.decoding.costs.time_in_turns` (the one cost measurement: order
    rotated each round, ``repeats`` rounds after one untimed round, medians of the per-round ratios).
    Also returns the three median times (s) as ``t_target_1``, ``t_target_g``, ``t_draft_1``."""
    ta = target if isinstance(target, CausalLMAdapter) else CausalLMAdapter(target)
    da = draft if isinstance(draft, CausalLMAdapter) else CausalLMAdapter(draft)
    dev = ta.device
    rows = [as_token_tensor(p, dev) for p in prompts]
    ids, valid = left_pad(rows, dev)
    forwards = {}
    with torch.inference_mode():
        for name, adapter, width in (("t_target_1", ta, 1), ("t_target_g", ta, gamma + 1), ("t_draft_1", da, 1)):
            lm = BatchLM(adapter, len(rows), name)
            lm.forward(ids, valid, keep=1)
            new = ids[:, -1:].expand(-1, width).contiguous()

            def step(lm=lm, n0=lm.length.clone(), new=new, width=width):
                lm.forward(new, torch.ones_like(new, dtype=torch.bool), keep=0 if width > 1 else 1)
                lm.rollback(n0)
                lm.tidy()

            forwards[name] = step
        times = time_in_turns(forwards, reps=repeats, warmup=1, device=dev)
    out = {name: float(np.median(v)) for name, v in times.items()}
    t1 = np.maximum(times["t_target_1"], 1e-12)
    out["r"] = float(np.median(times["t_target_g"] / t1))
    out["c"] = float(np.median(times["t_draft_1"] / t1))
    return out


def batch_study(target, draft, prompts: Sequence[Sequence[int]], config: BatchStudyConfig = BatchStudyConfig(), *,
                tokenizer=None, eos_token_id=None, progress: bool = False):
    """Throughput (total new tokens per second) of batched autoregressive and batched speculative
    decoding against batch size, with the theory's prediction beside it.

    For each temperature and batch size ``B``: rows are ``prompts[b % len(prompts)]`` with seeds
    ``config.seed + b``; AR and speculative batches alternate, in turns (``warmup`` untimed, ``repeats``
    timed, median); throughput = all rows' new tokens / the batch's wall time. ``alpha`` is estimated from the
    speculative steps as ``sum n / sum min(n + 1, gamma)`` (accepted over judged drafts), ``r(B)`` and
    ``c(B)`` by :func:`forward_costs`, and ``predicted = theory.speedup(alpha, gamma, c, verify_cost=r)``
    ``= E[tokens] / (gamma c + r)``: the speedup if a step cost only its forwards. Returns a DataFrame,
    one row per (temperature, batch size): ``temperature, batch_size, ar_tps, spec_tps, speedup,
    alpha, tau, c, r, predicted, ar_tokens, spec_tokens, ar_time_s, spec_time_s``.
    """
    import pandas as pd

    if not isinstance(config, BatchStudyConfig):
        raise TypeError(f"config: expected a BatchStudyConfig, got {type(config).__name__}")
    if not prompts:
        raise ValueError("prompts: at least one prompt")
    rows = []
    points = [(T, B) for T in config.temperatures for B in config.batch_sizes]
    if progress:
        from tqdm.auto import tqdm

        points = tqdm(points, desc="batch study", leave=False)
    costs: dict[int, dict[str, float]] = {}
    for T, B in points:
        sampling = SamplingConfig(temperature=float(T))
        spec = SpeculativeDecoder(target, draft, gamma=config.gamma, sampling=sampling, record=False,
                                  tokenizer=tokenizer, eos_token_id=eos_token_id)
        ar = AutoregressiveDecoder(spec.target, sampling=sampling, tokenizer=tokenizer, eos_token_id=eos_token_id)
        batch = [list(prompts[b % len(prompts)]) for b in range(B)]
        seeds = [config.seed + b for b in range(B)]
        results: dict[str, list] = {"ar": [], "spec": []}
        times: dict[str, list[float]] = {"ar": [], "spec": []}
        for k in range(config.warmup + config.repeats):
            for name, dec in ((("ar", ar), ("spec", spec)) if k % 2 == 0 else (("spec", spec), ("ar", ar))):
                t0 = devices.clock(spec.device)
                out = dec.generate_batch(batch, config.max_new_tokens, seed=seeds)
                dt = devices.clock(spec.device) - t0
                if k >= config.warmup:
                    results[name], times[name] = out, times[name] + [dt]
        if B not in costs:
            costs[B] = forward_costs(spec.target, spec.drafter.adapter, batch, config.gamma, config.cost_repeats)
        n = [s.n_accepted for r in results["spec"] for s in r.steps if s.gamma > 0]
        judged = [min(s.n_accepted + 1, s.gamma) for r in results["spec"] for s in r.steps if s.gamma > 0]
        alpha = min(sum(n) / sum(judged), 1.0) if sum(judged) else float("nan")
        tau = float(np.mean([s.n_accepted + 1 for r in results["spec"] for s in r.steps])) if n else float("nan")
        ar_tokens = sum(r.new_tokens for r in results["ar"])
        spec_tokens = sum(r.new_tokens for r in results["spec"])
        ar_t, spec_t = float(np.median(times["ar"])), float(np.median(times["spec"]))
        c, r = costs[B]["c"], costs[B]["r"]
        rows.append({
            "temperature": float(T), "batch_size": B, "ar_tps": ar_tokens / ar_t, "spec_tps": spec_tokens / spec_t,
            "alpha": alpha, "tau": tau, "c": c, "r": r,
            "predicted": float(theory.speedup(alpha, config.gamma, c, verify_cost=r)) if alpha == alpha else math.nan,
            "ar_tokens": ar_tokens, "spec_tokens": spec_tokens, "ar_time_s": ar_t, "spec_time_s": spec_t,
        })
        rows[-1]["speedup"] = rows[-1]["spec_tps"] / rows[-1]["ar_tps"]
    cols = ["temperature", "batch_size", "ar_tps", "spec_tps", "speedup", "alpha", "tau", "c", "r", "predicted",
            "ar_tokens", "spec_tokens", "ar_time_s", "spec_time_s"]
    return pd.DataFrame(rows)[cols]


def stops_paying(study, column: str = "speedup") -> dict[float, int | None]:
    """Per temperature, the smallest batch size at which ``column`` (``"speedup"`` measured, or
    ``"predicted"``) is below 1, i.e. speculation stops paying; ``None`` if it pays at every size."""
    out: dict[float, int | None] = {}
    for T, sub in study.sort_values("batch_size").groupby("temperature", sort=True):
        below = sub.loc[sub[column] < 1.0, "batch_size"]
        out[float(T)] = int(below.iloc[0]) if len(below) else None
    return out
