"""Synthetic token-level traces with known acceptance, for tests and benchmarks of the M3 tables.

No model is run: every row of the trace schema is drawn from a small generative model whose
acceptance behaviour is known in closed form, so each analysis has an exact answer to recover.

For a step with ``gamma`` drafted tokens and draft position ``i`` (0-based), the expected acceptance
of a reached position (``1 - TV(p, q)``) is

    logit(alpha_row) = logit(alpha_by_pos[i]) + category_logit[c] + entropy_slope * (H(p) - 1.5)

with ``H(p) ~ Gamma(shape 2, scale 0.75)`` (mean 1.5 nats), ``H(q) = |H(p) + 0.5 N(0, 1)|``. With
``entropy_slope = 0`` and no category shift, the conditional acceptance at position ``i`` is exactly
``alpha_by_pos[i]``, the unconditional one ``prod_{j <= i} alpha_by_pos[j]``, and the accepted length
``N`` has ``P(N = k) = prod_{j < k} alpha_j (1 - alpha_k)`` (``alpha_gamma = 0``).

Conditional on the drafted token ``x``, ``min(1, p(x)/q(x))`` must average to ``1 - TV`` over
``x ~ q``; a two-point law does it: with probability ``m = (1 - alpha) / (1 - a)``, ``a ~ U(0, alpha)``,
``x`` is a token ``q`` over-weights and ``accept_prob = a``, otherwise ``p(x) >= q(x)`` and
``accept_prob = 1``. Flags are ``uniform < accept_prob`` and ``reached`` / ``accepted`` / ``n_accepted``
follow the block structure (a block stops at its first rejection).

A *wrong sampler* is simulated by ``wrong_q = w > 0``: verification divides by ``(1 + w) q(x)``
instead of the recorded ``q(x)``, so the realised flags are ``uniform < min(1, p(x) / ((1 + w) q(x)))``
while ``accept_prob`` and ``tv`` record the correct values; the expected-vs-realised test must flag it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from spade_lib.runs.trace import conform

H_P_MEAN = 1.5  # mean of the Gamma(2, 0.75) target entropy, the centre of entropy_slope


def _logit(a: np.ndarray) -> np.ndarray:
    return np.log(a) - np.log1p(-a)


def synthetic_trace(
    n_steps: int = 1000,
    gamma: int = 4,
    alpha_by_pos: Sequence[float] = (0.8, 0.7, 0.6, 0.5),
    *,
    n_prompts: int = 8,
    categories: Sequence[str] = ("code", "prose"),
    category_logit: Sequence[float] | None = None,
    entropy_slope: float = 0.0,
    wrong_q: float = 0.0,
    vocab_size: int = 512,
    seed: int = 0,
) -> pd.DataFrame:
    """A trace of ``n_steps`` verification steps of ``gamma`` drafted tokens each (module docstring).

    Steps are split into ``n_prompts`` contiguous generations; prompt ``j`` has category
    ``categories[j % len(categories)]``, whose logit shift is ``category_logit[...]`` (default 0).
    Columns and dtypes are those of :func:`spade_lib.runs.trace.read_trace`. Same arguments, same frame.
    """
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    alpha_by_pos = np.asarray(alpha_by_pos, dtype=np.float64)
    if alpha_by_pos.shape != (gamma,):
        raise ValueError(f"alpha_by_pos must have gamma={gamma} values, got {alpha_by_pos.shape[0]}")
    if np.any(alpha_by_pos <= 0) or np.any(alpha_by_pos >= 1):
        raise ValueError("alpha_by_pos values must lie strictly between 0 and 1")
    if not 1 <= n_prompts <= n_steps:
        raise ValueError(f"n_prompts must be in [1, n_steps], got {n_prompts}")
    if not categories:
        raise ValueError("categories must name at least one category")
    cat_shift = np.zeros(len(categories)) if category_logit is None else np.asarray(category_logit, float)
    if cat_shift.shape != (len(categories),):
        raise ValueError("category_logit must have one value per category")
    if wrong_q < 0:
        raise ValueError(f"wrong_q must be >= 0, got {wrong_q}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")

    rng = np.random.default_rng(seed)
    n_rows = n_steps * gamma
    pos = np.tile(np.arange(gamma, dtype=np.int16), n_steps)
    step_prompt = (np.arange(n_steps, dtype=np.int64) * n_prompts) // n_steps
    prompt_start = np.searchsorted(step_prompt, np.arange(n_prompts))
    step_index = np.arange(n_steps) - prompt_start[step_prompt]
    step_cat = step_prompt % len(categories)
    row_cat = np.repeat(step_cat, gamma)

    # Entropies and the row's expected acceptance 1 - TV.
    h_p = rng.gamma(2.0, H_P_MEAN / 2.0, n_rows)
    h_q = np.abs(h_p + 0.5 * rng.standard_normal(n_rows))
    eta = _logit(alpha_by_pos)[pos] + cat_shift[row_cat] + entropy_slope * (h_p - H_P_MEAN)
    alpha = 1.0 / (1.0 + np.exp(-eta))
    tv = 1.0 - alpha
    kl = 2.0 * tv**2 + 0.5 * tv * rng.exponential(1.0, n_rows)  # Pinsker: KL >= 2 TV^2

    # The drafted token's probabilities: the two-point law of the module docstring.
    a_low = rng.random(n_rows) * alpha
    over = rng.random(n_rows) < (1.0 - alpha) / (1.0 - a_low)
    q_top = np.clip(np.exp(-0.8 * h_q), 0.02, 1.0)
    q_x = q_top * (0.25 + 0.75 * rng.random(n_rows))
    p_x = np.where(over, a_low * q_x, q_x + rng.random(n_rows) * (1.0 - q_x))
    ratio = p_x / q_x
    accept_prob = np.minimum(1.0, ratio).astype(np.float32)
    uniform = rng.random(n_rows, dtype=np.float32)
    true_prob = accept_prob if wrong_q == 0 else np.minimum(1.0, ratio / (1.0 + wrong_q)).astype(np.float32)
    flag = (uniform < true_prob).reshape(n_steps, gamma)

    # Block structure: a position is reached iff every earlier one was accepted.
    reached = np.ones_like(flag)
    reached[:, 1:] = np.cumprod(flag[:, :-1], axis=1, dtype=bool)
    accepted = reached & flag
    n_acc = accepted.sum(axis=1)
    emitted = n_acc + 1  # accepted drafts + the residual or bonus token
    before = np.cumsum(emitted) - emitted
    before -= before[prompt_start][step_prompt]
    abs_pos = np.repeat(before, gamma) + pos

    draft_token = np.minimum(rng.zipf(1.3, n_rows) - 1, vocab_size - 1)
    p_top1 = np.where(over, rng.integers(0, vocab_size, n_rows), draft_token)
    t_draft = gamma * 3e-4 * (1.0 + 0.05 * rng.standard_normal(n_steps))
    t_verify = 5e-3 * (1.0 + 0.05 * rng.standard_normal(n_steps))

    names = np.array([f"p{j:04d}" for j in range(n_prompts)], dtype=object)
    cats = np.asarray(categories, dtype=object)
    f32 = np.float32
    columns = {
        "prompt_id": pa.DictionaryArray.from_arrays(np.repeat(step_prompt, gamma).astype(np.int32),
                                                    pa.array(names.tolist())).cast(pa.string()),
        "category": pa.DictionaryArray.from_arrays(row_cat.astype(np.int32),
                                                   pa.array(cats.tolist())).cast(pa.string()),
        "sample": np.zeros(n_rows, np.int32),
        "step": np.repeat(step_index, gamma).astype(np.int32),
        "pos": pos,
        "abs_pos": abs_pos.astype(np.int32),
        "gamma": np.full(n_rows, gamma, np.int16),
        "draft_token": draft_token.astype(np.int32),
        "p_x": p_x.astype(f32),
        "q_x": q_x.astype(f32),
        "accept_prob": accept_prob,
        "uniform": uniform,
        "reached": reached.ravel(),
        "accepted": accepted.ravel(),
        "n_accepted": np.repeat(n_acc, gamma).astype(np.int16),
        "next_token": np.repeat(rng.integers(0, vocab_size, n_steps), gamma).astype(np.int32),
        "h_p": h_p.astype(f32),
        "h_q": h_q.astype(f32),
        "tv": tv.astype(f32),
        "kl": kl.astype(f32),
        "p_top1": p_top1.astype(np.int32),
        "p_margin": rng.random(n_rows, dtype=f32),
        "q_top_prob": q_top.astype(f32),
        "p_x_raw": p_x.astype(f32),
        "q_x_raw": q_x.astype(f32),
        "h_p_raw": h_p.astype(f32),
        "h_q_raw": h_q.astype(f32),
        "tv_raw": tv.astype(f32),
        "t_draft": np.repeat(t_draft, gamma),
        "t_verify": np.repeat(t_verify, gamma),
        "t_overhead": np.full(n_rows, 2e-4),
    }
    # the version-1 columns; conform adds the newer ones (a chain's tree columns) and checks every type
    return conform(pa.Table.from_pydict(columns), 1, "synthetic_trace").to_pandas()


def expected_position_acceptance(alpha_by_pos: Sequence[float]) -> pd.DataFrame:
    """Closed-form answers for ``synthetic_trace`` without entropy/category effects: per position the
    conditional ``alpha_i``, unconditional ``prod_{j<=i} alpha_j``; and ``P(N = k)``, ``k = 0..gamma``."""
    a = np.asarray(alpha_by_pos, dtype=np.float64)
    reach = np.concatenate([[1.0], np.cumprod(a)])  # P(N >= k)
    p_n = reach * np.concatenate([1.0 - a, [1.0]])
    return pd.DataFrame({
        "pos": np.arange(len(a) + 1),
        "alpha_cond": np.concatenate([a, [np.nan]]),
        "alpha_uncond": np.concatenate([np.cumprod(a), [np.nan]]),
        "p_n_accepted": p_n,
        "survival": reach,
    })
