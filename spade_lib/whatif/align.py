"""Teacher-forced alignment scoring: how well the draft ``q`` matches the target ``p``, without decoding.

For sequences ``s`` whose first ``m`` tokens are a prompt, one batched forward of each model gives, at every scored
position ``t = m .. L-1`` (``s_t`` predicted from ``s_{<t}``; ``i = t - m``), with ``adjust`` the ``SamplingConfig``::

    p_t = adjust(target_logits[t - 1]),   q_t = adjust(draft_logits[t - 1]),   alpha_t = sum_x min(p_t, q_t) = 1 - TV
    KL(p_t || q_t), KL(q_t || p_t), H(p_t), H(q_t), top1_agree_t = [argmax p_t == argmax q_t], p_t(s_t), q_t(s_t)

``alpha_t`` is the probability that speculative sampling accepts a token drafted from ``q_t`` (Leviathan et al. 2023,
Thm. 3.5); on the emitted text it equals ``1 - tv`` of the trace row at ``abs_pos = i`` (tested). Predicted ``tau``
(tokens per verification step, bonus included) for draft length ``gamma``, three ways:

- ``iid``: ``tau = (1 - a^{gamma+1}) / (1 - a)``, ``a`` the mean alpha (Leviathan eq. 1);
- ``block``: ``E[L_t] = sum_{k=0}^{gamma} prod_{i<k} alpha_{t+i}`` for a block starting at ``t``, averaged over ``t``;
- ``renewal``: blocks start where the previous ended (``t_{j+1} = t_j + L_j``, ``t_0 = 0``); a dynamic programme over
  ``s_t = P(some block starts at t)`` gives ``tau = E[tokens] / E[steps]``, the ratio of totals measured ``tau`` is.

``f(a) = (1 - a^{gamma+1}) / (1 - a)`` is convex, so varying alpha makes ``block``/``renewal`` exceed ``iid`` (Jensen).
The rest of the gap to measured ``tau``: noise, block starts (decoding starts more blocks in hard regions), selection
(after a rejection the text comes from ``norm(max(0, p - q))``, not ``p``). **Greedy is a deterministic walk**
(:func:`greedy_walk`): at ``T = 0`` a draft is accepted iff ``a_t = top1_agree_t``, and a step accepts while
``a_{t+i} = 1``, so each draft slot's acceptance is the agreement on the positions *it* visits: pattern ``1, 0, 1, 0,
...`` gives slots 0/1 acceptance 1.0/0.0, alpha 1.0 at ``gamma = 1``, 0.5 at ``gamma = 2``; a trace pattern that
:func:`greedy_walk` reproduces is this selection, not a bug (``tests/test_align.py``). Speedup for draft cost ``c``,
verify cost ``r(gamma)`` (one-token target forwards): ``tau / (gamma c + r(gamma))`` (:func:`spade_lib.theory.speedup`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from spade_lib import devices, measures, rates, theory
from spade_lib.decoding.model.adapter import context_limit
from spade_lib.sampling import SamplingConfig, adjust
from spade_lib.validate import ArgumentTypeError, check_costs, check_float, check_gamma, check_int, check_token_ids

SCORE_COLUMNS = ("seq", "i", "token", "alpha", "tv", "kl_pq", "kl_qp", "h_p", "h_q", "top1_agree",
                 "p_x", "q_x")
PREDICTION_METHODS = ("iid", "block", "renewal")


@dataclass(frozen=True)
class AlignConfig:
    batch_size: int = 8            # sequences per forward pass
    padding_side: str = "right"    # "right" or "left"; both give the same scores (position ids follow the mask)
    score_prompt: bool = False     # also score the prompt's own tokens (from its second token on)
    pad_id: int = 0                # token id used for padding (masked out, never scored; in [0, V): it is embedded)
    stats_dtype: str = "float32"   # dtype of the per-position measures ("float64" for exactness checks)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {self.padding_side!r}")
        if self.stats_dtype not in ("float32", "float64"):
            raise ValueError(f"stats_dtype must be 'float32' or 'float64', got {self.stats_dtype!r}")
        check_int("pad_id", self.pad_id, min=0)  # the upper bound, V, is checked against the models


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _pad_batch(seqs: list[list[int]], side: str, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``position_ids`` (0 at each sequence's first real token)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        sl = slice(0, len(s)) if side == "right" else slice(width - len(s), width)
        ids[row, sl] = torch.as_tensor(s, dtype=torch.long)
        mask[row, sl] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


@torch.inference_mode()
def _logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    dev = _device(model)
    out = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=positions.to(dev), use_cache=False)
    return out.logits.float()


def _check_sequences(sequences: Sequence[Sequence[int]], prompt_lengths: Sequence[int] | None) -> list[int]:
    if isinstance(sequences, (str, bytes)) or not hasattr(sequences, "__len__"):
        raise ArgumentTypeError(f"sequences: must be a list of token-id sequences, got {type(sequences).__name__}")
    if len(sequences) == 0:
        raise ValueError("sequences must not be empty")
    for k, s in enumerate(sequences):
        if len(check_token_ids(f"sequences[{k}]", s)) < 1:
            raise ValueError(f"sequences[{k}]: must hold at least 1 token, got an empty sequence")
    if prompt_lengths is None:
        return [1] * len(sequences)
    if len(prompt_lengths) != len(sequences):
        raise ValueError(f"prompt_lengths has {len(prompt_lengths)} entries for {len(sequences)} sequences")
    for k, (s, m) in enumerate(zip(sequences, prompt_lengths)):
        if not 1 <= m <= len(s):
            raise ValueError(f"prompt_lengths[{k}] = {m} must be in [1, len(sequences[{k}]) = {len(s)}]")
    return [int(m) for m in prompt_lengths]


@torch.inference_mode()
def score_sequences(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int] | None = None,
    sampling: SamplingConfig | None = None,
    config: AlignConfig = AlignConfig(),
) -> pd.DataFrame:
    """Per-position alignment of ``draft`` to ``target`` on ``sequences`` (teacher forcing).

    ``prompt_lengths[k]`` tokens of sequence ``k`` are context only (default 1: score everything after
    the first token); with ``config.score_prompt`` the prompt's tokens are scored too. Returns one row
    per scored token with :data:`SCORE_COLUMNS`: ``seq`` (index into ``sequences``), ``i`` (index in the
    continuation, negative inside the prompt; comparable to a trace's ``abs_pos``), ``token`` (``s_t``),
    and the quantities of the module docstring under ``sampling`` (default: temperature 1).
    """
    sampling = sampling if sampling is not None else SamplingConfig()
    prompts = _check_sequences(sequences, prompt_lengths)
    seqs = [[int(x) for x in s] for s in sequences]
    vocab = min(int(target.config.vocab_size), int(draft.config.vocab_size)) if hasattr(target, "config") \
        and hasattr(draft, "config") else None
    limits = [context_limit(m) for m in (target, draft) if hasattr(m, "config")]
    limit = min((x for x in limits if x is not None), default=None)
    if vocab is not None and not 0 <= config.pad_id < vocab:  # a padded slot is still embedded
        raise ValueError(f"pad_id: must be an integer in [0, {vocab}) (the models' vocabulary), got {config.pad_id!r}")
    for k, s in enumerate(seqs):
        if vocab is not None and (min(s) < 0 or max(s) >= vocab):
            raise ValueError(f"sequences[{k}] holds token ids outside [0, {vocab}) (the models' vocabulary)")
        if limit is not None and len(s) > limit:  # positions past the context are not scored silently
            raise ValueError(f"sequences[{k}]: {len(s)} tokens exceed the models' context limit of {limit} positions")
    frames: list[pd.DataFrame] = []
    order = sorted(range(len(seqs)), key=lambda k: len(seqs[k]))  # similar lengths share a batch: less padding
    for start in range(0, len(order), config.batch_size):
        batch = order[start:start + config.batch_size]
        ids, mask, positions = _pad_batch([seqs[k] for k in batch], config.padding_side, config.pad_id)
        lp, lq = _logits(target, ids, mask, positions), _logits(draft, ids, mask, positions)
        width = ids.shape[1]
        rows, cols, seq_index, rel = [], [], [], []
        for row, k in enumerate(batch):
            n = len(seqs[k])
            offset = 0 if config.padding_side == "right" else width - n
            first = 1 if config.score_prompt else prompts[k]
            t = np.arange(first, n)                      # index of the predicted token in the sequence
            rows.append(np.full(len(t), row))
            cols.append(offset + t - 1)                  # the logits that predict s_t
            seq_index.append(np.full(len(t), k))
            rel.append(t - prompts[k])
        rows_t = torch.as_tensor(np.concatenate(rows))
        cols_t = torch.as_tensor(np.concatenate(cols))
        tokens = ids[rows_t, cols_t + 1]
        frames.append(_stats(lp[rows_t, cols_t], lq[rows_t, cols_t], tokens, sampling,
                             np.concatenate(seq_index), np.concatenate(rel), getattr(torch, config.stats_dtype)))
    out = pd.concat(frames, ignore_index=True).sort_values(["seq", "i"], kind="stable").reset_index(drop=True)
    out.attrs["sampling"] = repr(sampling)
    return out


def _stats(lp: torch.Tensor, lq: torch.Tensor, tokens: torch.Tensor, sampling: SamplingConfig,
           seq: np.ndarray, rel: np.ndarray, dtype: torch.dtype) -> pd.DataFrame:
    p = adjust(lp, sampling, dtype)
    q = adjust(lq, sampling, dtype)
    alpha = measures.alpha(p, q)
    idx = tokens.to(p.device).unsqueeze(-1)
    return pd.DataFrame({
        "seq": seq.astype(np.int32),
        "i": rel.astype(np.int32),
        "token": tokens.numpy().astype(np.int32),
        "alpha": alpha.cpu().numpy(),
        "tv": (1.0 - alpha).cpu().numpy(),
        "kl_pq": measures.kl(p, q).cpu().numpy(),
        "kl_qp": measures.kl(q, p).cpu().numpy(),
        "h_p": measures.entropy(p).cpu().numpy(),
        "h_q": measures.entropy(q).cpu().numpy(),
        "top1_agree": (lp.argmax(-1) == lq.argmax(-1)).cpu().numpy(),
        "p_x": p.gather(-1, idx).squeeze(-1).cpu().numpy(),
        "q_x": q.gather(-1, idx).squeeze(-1).cpu().numpy(),
    })


# --------------------------------------------------------------------------------------------------
# Predicting tau and speedup from per-position alpha
# --------------------------------------------------------------------------------------------------

def _alpha_matrix(alphas: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Stack per-sequence alpha vectors into a NaN-padded matrix and their lengths."""
    if len(alphas) == 0:
        raise ValueError("alphas must hold at least one sequence")
    lengths = np.array([len(a) for a in alphas])
    if (lengths == 0).any():
        raise ValueError("every alpha sequence must have at least one position")
    mat = np.full((len(alphas), lengths.max()), np.nan)
    for k, a in enumerate(alphas):
        a = np.asarray(a, dtype=np.float64)
        if ((a < -1e-9) | (a > 1 + 1e-9)).any():
            raise ValueError(f"alphas[{k}] has values outside [0, 1]")
        mat[k, :len(a)] = np.clip(a, 0.0, 1.0)
    return mat, lengths


def block_tokens(alpha: np.ndarray, gamma: int) -> np.ndarray:
    """``E[L_t] = sum_{k=0}^{gamma} prod_{i<k} alpha_{t+i}`` for a block starting at every ``t``.

    ``alpha`` is ``(..., n)``; positions past the end (or NaN) take the sequence's mean alpha, so
    blocks near the end are not cut short. Each window is :func:`spade_lib.theory.expected_tokens`'s
    position-wise form. Returns ``(..., n)``.
    """
    check_gamma("gamma", gamma)
    alpha = np.asarray(alpha, dtype=np.float64)
    fill = np.nanmean(alpha, axis=-1, keepdims=True)
    ext = np.concatenate([alpha, np.broadcast_to(fill, alpha.shape[:-1] + (gamma,))], axis=-1)
    ext = np.where(np.isnan(ext), fill, ext)
    windows = np.lib.stride_tricks.sliding_window_view(ext, gamma, axis=-1)[..., :alpha.shape[-1], :]
    return np.asarray(theory.expected_tokens(windows, gamma), dtype=np.float64)


def renewal_tau(alpha: np.ndarray, lengths: np.ndarray, gamma: int) -> tuple[float, float]:
    """Expected (tokens, steps) summed over sequences when blocks start where the previous ended.

    ``s_0 = 1``; a block at ``t`` accepts ``k < gamma`` drafts w.p. ``prod_{i<k} alpha_{t+i} (1 -
    alpha_{t+k})`` or all ``gamma`` w.p. ``prod_{i<gamma} alpha_{t+i}``, emits ``k + 1`` tokens, and the
    next block starts at ``t + k + 1``. Expected steps ``= sum_{t < n} s_t``; expected tokens ``= sum_t
    s_t E[L_t]`` (the last block may overshoot the sequence, as a decoder's last step may).
    """
    mat = np.asarray(alpha, dtype=np.float64)
    n_seq, width = mat.shape
    fill = np.nanmean(mat, axis=1, keepdims=True)
    ext = np.concatenate([mat, np.broadcast_to(fill, (n_seq, gamma + 1))], axis=1)
    ext = np.where(np.isnan(ext), fill, ext)
    start = np.zeros((n_seq, width + gamma + 2))
    start[:, 0] = 1.0
    valid = np.arange(width)[None, :] < lengths[:, None]
    tokens = steps = 0.0
    for t in range(width):
        s = np.where(valid[:, t], start[:, t], 0.0)
        if not s.any():
            continue
        a = ext[:, t:t + gamma + 1]                                           # alpha_{t..t+gamma}
        reach = np.concatenate([np.ones((n_seq, 1)), np.cumprod(a[:, :gamma], axis=1)], axis=1)  # P(k accepted so far)
        stop = np.concatenate([1.0 - a[:, :gamma], np.ones((n_seq, 1))], axis=1)  # P(stop at k | reached k)
        pk = reach * stop                                                      # P(exactly k accepted), k = 0..gamma
        start[:, t + 1:t + gamma + 2] += s[:, None] * pk
        steps += s.sum()
        tokens += (s * reach.sum(axis=1)).sum()
    return float(tokens), float(steps)


def predict_tau(alphas: Sequence[np.ndarray], gammas: Iterable[int],
                methods: Sequence[str] = PREDICTION_METHODS) -> pd.DataFrame:
    """Predicted tau (tokens per step, bonus included) for each ``gamma`` and method.

    ``alphas``: one vector of per-position alpha per sequence (e.g. the ``alpha`` column of
    :func:`score_sequences` grouped by ``seq``). Returns rows ``(gamma, method, tau)``.
    """
    unknown = set(methods) - set(PREDICTION_METHODS)
    if unknown:
        raise ValueError(f"methods has unknown entries {sorted(unknown)}; choose from {PREDICTION_METHODS}")
    mat, lengths = _alpha_matrix(alphas)
    mean_alpha = float(np.nanmean(mat))
    rows = []
    for gamma in gammas:
        gamma = check_gamma("gammas", gamma)  # 2.5 is refused, not truncated to 2
        if gamma < 1:
            raise ValueError(f"gammas must be >= 1, got {gamma}")
        for method in methods:
            if method == "iid":
                tau = float(theory.expected_tokens(mean_alpha, gamma))
            elif method == "block":
                tau = float(np.nanmean(np.where(np.isnan(mat), np.nan, block_tokens(mat, gamma))))
            else:
                tokens, steps = renewal_tau(mat, lengths, gamma)
                tau = float(measures.tau(tokens - steps, steps))  # expected accepted drafts over expected steps
            rows.append({"gamma": gamma, "method": method, "tau": tau})
    return pd.DataFrame(rows)


def alphas_by_sequence(scores: pd.DataFrame, continuation_only: bool = True) -> list[np.ndarray]:
    """The ``alpha`` column of :func:`score_sequences` as one vector per sequence (ordered by ``i``)."""
    df = scores[scores["i"] >= 0] if continuation_only else scores
    return [g.sort_values("i")["alpha"].to_numpy() for _, g in df.groupby("seq", sort=True)]


def predict(scores: pd.DataFrame, gammas: Iterable[int], c: float,
            verify_cost: float | Callable[[int], float] = 1.0,
            methods: Sequence[str] = PREDICTION_METHODS) -> pd.DataFrame:
    """Predicted tau and speedup ``tau / (gamma c + r(gamma))`` for every gamma and method.

    ``verify_cost`` is ``r(gamma)``: a constant or a function of gamma (cost of verifying ``gamma + 1``
    tokens in one target forward, relative to a 1-token target forward).
    """
    c = check_float("c", c, min=0.0)
    if not callable(verify_cost):
        check_costs("verify_cost", verify_cost)
    out = predict_tau(alphas_by_sequence(scores), gammas, methods)
    r = out["gamma"].map(lambda g: float(verify_cost(int(g)) if callable(verify_cost) else verify_cost))
    check_costs("verify_cost", r.to_numpy())
    out["cost"] = np.broadcast_to(theory.step_cost(out["gamma"].to_numpy(), float(c), verify_cost), len(out))
    out["speedup"] = out["tau"] / out["cost"]
    return out


def summarize(scores: pd.DataFrame, continuation_only: bool = True) -> dict[str, float]:
    """Means over scored positions of every per-position quantity (``top1_agree`` as a rate)."""
    df = scores[scores["i"] >= 0] if continuation_only else scores
    cols = ["alpha", "tv", "kl_pq", "kl_qp", "h_p", "h_q", "top1_agree"]
    out = {k: float(df[k].astype(float).mean()) for k in cols}
    out["n_positions"] = int(len(df))
    return out


# --------------------------------------------------------------------------------------------------
# Text to score from a stored trace
# --------------------------------------------------------------------------------------------------

def continuations_from_trace(trace: pd.DataFrame) -> dict[tuple[str, int], list[int]]:
    """The continuation each (prompt_id, sample) of a trace emitted: per step, the accepted draft
    tokens then ``next_token`` (residual sample or bonus). Steps are taken in order; ``abs_pos`` of an
    accepted row equals its index in the returned list."""
    need = {"prompt_id", "sample", "step", "pos", "draft_token", "accepted", "next_token"}
    missing = need - set(trace.columns)
    if missing:
        raise ValueError(f"trace lacks columns {sorted(missing)}")
    out: dict[tuple[str, int], list[int]] = {}
    df = trace.sort_values(["prompt_id", "sample", "step", "pos"], kind="stable")
    for (pid, sample), g in df.groupby(["prompt_id", "sample"], sort=True):
        tokens: list[int] = []
        for _, block in g.groupby("step", sort=True):
            tokens.extend(int(x) for x in block.loc[block["accepted"].astype(bool), "draft_token"])
            tokens.append(int(block["next_token"].iloc[0]))
        out[(str(pid), int(sample))] = tokens
    return out


def run_sequences(run_dir, tokenizer, suite) -> tuple[list[list[int]], list[int], pd.DataFrame]:
    """The text a run emitted, ready to score: ``(sequences, prompt_lengths, keys)``.

    Each generation of ``summary.jsonl`` becomes ``prompt ids + output_ids``, the prompt re-tokenised
    exactly as the runner did (``spade_lib.runs.config.prompt_ids`` with the run's own config, checked
    against the stored ``prompt_tokens``). ``keys`` has one row per sequence: ``seq``,
    ``question_id``, ``prompt_id`` (as in traces), ``category``, ``sample``, ``new_tokens``. A trace
    can hold drafted positions past ``new_tokens`` (after an EOS, or cut by ``max_new_tokens``): they
    have no scored counterpart.
    """
    from spade_lib.runs import trace
    from spade_lib.runs.config import RunConfig, prompt_ids
    from spade_lib.runs.store import read_summary

    meta = trace.read_metadata(run_dir)
    config = RunConfig(**meta["config"])
    summary = read_summary(run_dir)
    rows = {str(r["question_id"]): r for r in suite.rows}
    seqs, prompts, keys = [], [], []
    for _, s in summary.iterrows():
        qid = str(s["question_id"])
        if qid not in rows:
            raise ValueError(f"suite has no question_id {qid!r} of run {run_dir}")
        ids = prompt_ids(tokenizer, rows[qid]["turns"][0], config)
        if len(ids) != int(s["prompt_tokens"]):
            raise ValueError(f"question {qid!r}: re-tokenised prompt has {len(ids)} tokens, the run had "
                             f"{int(s['prompt_tokens'])} (another tokenizer or chat template?)")
        keys.append({"seq": len(seqs), "question_id": s["question_id"], "prompt_id": qid,
                     "category": s["category"], "sample": int(s["sample"]), "new_tokens": int(s["new_tokens"])})
        seqs.append(ids + [int(t) for t in s["output_ids"]])
        prompts.append(len(ids))
    return seqs, prompts, pd.DataFrame(keys)


def greedy_walk(agree: Sequence[bool] | np.ndarray, gamma: int) -> pd.DataFrame:
    """Greedy speculative decoding replayed on one text from its teacher-forced top-1 agreement
    ``agree[i]`` (continuation token ``i``), exactly as :class:`spade_lib.decoding.decode.SpeculativeDecoder`
    steps: a step at ``t`` drafts ``g = min(gamma, L - t - 1)`` tokens (a plain target step when
    ``g = 0``), accepts while ``agree`` holds, and the next step starts after its ``n + 1`` tokens.

    Returns per draft slot ``pos`` the counts ``drafted`` (steps that drafted that slot), ``reached``,
    ``accepted`` and their rates ``alpha_cond`` = accepted / reached and ``alpha_uncond`` = accepted / drafted
    with bounds (:func:`spade_lib.rates.add_position_rates`: the columns of
    :func:`spade_lib.diagnose.position_acceptance` for a greedy trace of that text)."""
    gamma = check_gamma("gamma", gamma)
    a = np.asarray(agree, dtype=bool)
    L = len(a)
    drafted = np.zeros(gamma, dtype=np.int64)
    reached = np.zeros(gamma, dtype=np.int64)
    accepted = np.zeros(gamma, dtype=np.int64)
    t = 0
    while t < L:
        g = min(gamma, L - t - 1)
        drafted[:g] += 1
        n = 0
        for i in range(g):
            reached[i] += 1
            if not a[t + i]:
                break
            accepted[i] += 1
            n += 1
        t += n + 1
    out = pd.DataFrame({"pos": np.arange(gamma), "drafted": drafted, "reached": reached, "accepted": accepted})
    return rates.add_position_rates(out).set_index("pos")


def measured_tau(trace: pd.DataFrame, gamma: int | None = None) -> tuple[float, float, int]:
    """Decoding-measured tau ``= mean(n + 1)`` over the steps that drafted ``gamma`` tokens (all the trace's
    steps, :func:`spade_lib.runs.metrics.tau_drafting_steps`, when ``None``; blocks capped by ``max_new_tokens`` are left out when ``gamma`` is given), with its
    standard error and the number of steps."""
    from spade_lib.runs import metrics

    steps = metrics.steps(trace)
    if gamma is not None:
        steps = steps[steps["gamma"] == gamma]
    if len(steps) == 0:
        raise ValueError(f"trace has no steps with gamma = {gamma}")
    n = steps["n_accepted"].to_numpy(np.float64) + 1.0
    se = float(n.std(ddof=1) / np.sqrt(len(n))) if len(n) > 1 else float("nan")
    return metrics.tau_drafting_steps(steps), se, int(len(n))


# ---------------------------------------------------------------- runs scored, and checked against their traces

@dataclass
class ScoredRuns:
    """Teacher-forced scores of the text several runs emitted (:func:`score_runs`), keyed by run name."""

    scores: dict[str, pd.DataFrame]   # score_sequences' rows with the sequence's prompt_id, category, sample
    keys: dict[str, pd.DataFrame]     # run_sequences' keys: one row per sequence (seq, prompt_id, ..., new_tokens)
    seconds: dict[str, float]         # seconds to score each run's text (both forwards, not the tokenisation)


def score_runs(target: torch.nn.Module, draft: torch.nn.Module, run_dirs: Mapping[str, object], tokenizer, suite,
               sampling: SamplingConfig | None = None, config: AlignConfig = AlignConfig()) -> ScoredRuns:
    """Score the emitted text of each run of ``run_dirs`` (name -> run folder): :func:`run_sequences`, then
    :func:`score_sequences` (``alpha_t = 1 - TV(p_t, q_t)`` and the rest per continuation position ``i``), each
    row joined to its sequence's ``prompt_id``, ``category`` and ``sample`` so it meets a trace row at
    ``abs_pos = i``."""
    scores, keys, seconds = {}, {}, {}
    for name, run_dir in run_dirs.items():
        seqs, prompt_lengths, keys[name] = run_sequences(run_dir, tokenizer, suite)
        t0 = devices.clock()
        scored = score_sequences(target, draft, seqs, prompt_lengths, sampling, config)
        seconds[name] = devices.clock() - t0
        scores[name] = scored.merge(keys[name][["seq", "prompt_id", "category", "sample"]], on="seq")
    return ScoredRuns(scores=scores, keys=keys, seconds=seconds)


def reached_gap(scores: pd.DataFrame, keys: pd.DataFrame, trace: pd.DataFrame) -> tuple[int, float]:
    """The pinned fact of the module docstring on one run: ``(n, max_t |alpha_t - (1 - tv_t)|)`` over its ``n``
    reached trace rows inside the emitted text (``abs_pos < new_tokens``: positions drafted past an EOS or the
    token budget have no scored counterpart). ``scores``: a run's rows of :func:`score_runs` (``prompt_id``,
    ``sample``, ``i``, ``alpha``); ``keys``: its keys (``prompt_id``, ``sample``, ``new_tokens``); ``trace``: the
    run's trace (``prompt_id``, ``sample``, ``abs_pos``, ``reached``, ``tv``). The gap is ``inf`` where a reached
    row has no teacher-forced score, so ``gap < tol`` fails then too."""
    tf = scores[["prompt_id", "sample", "i", "alpha"]].rename(columns={"i": "abs_pos"})
    emitted = keys[["prompt_id", "sample", "new_tokens"]]
    reached = trace[trace["reached"]].merge(emitted, on=["prompt_id", "sample"])
    reached = reached[reached["abs_pos"] < reached["new_tokens"]]
    reached = reached.merge(tf, on=["prompt_id", "sample", "abs_pos"], how="left")
    if reached["alpha"].isna().any():
        return len(reached), float("inf")
    return len(reached), float(np.abs(reached["alpha"] - (1.0 - reached["tv"])).max())


def reached_tolerance(draft) -> float:
    """The tolerance of :func:`reached_gap` for runs decoded with ``draft`` (a model): 1e-3 (float rounding between a
    batched forward and the decoder's KV-cached one), or 2e-2 for a draft whose prefill ran in bf16
    (``SPADE_DRAFT_PREFILL=auto``, :func:`spade_lib.decoding.model.lean.prepare`): it proposed from a prompt whose
    keys and values were rounded to bf16, where this module scores the fp32 draft (a gap of 0.006 measured on the
    Qwen2.5-Coder pair). An index or position defect moves alpha by far more than either."""
    from spade_lib.decoding.model.lean import PREFILL_ATTR

    return 2e-2 if getattr(draft, PREFILL_ATTR, "fp32") == "bf16" else 1e-3


def tau_table(traces: Mapping[int, pd.DataFrame], scores: Mapping[int, pd.DataFrame], sweep: pd.DataFrame,
              c: float, verify_cost: float | Callable[[int], float] = 1.0) -> pd.DataFrame:
    """Predicted vs measured ``tau`` and speedup per ``gamma`` of a fixed-``gamma`` sweep, one row per key of
    ``traces`` (gamma -> that run's trace; ``scores``: gamma -> the teacher-forced scores of its own text).

    Columns: ``gamma``, ``steps`` and ``tau_full_blocks`` with its standard error ``se`` (:func:`measured_tau`:
    the mean of ``n + 1`` over full-length blocks), the run's ``tau`` (every step) from ``sweep``, the
    predictions ``tau_<method>`` of :data:`PREDICTION_METHODS` from the run's alphas (:func:`predict`, step cost
    ``gamma c + r(gamma)``), the measured ``speedup_measured`` with ``speedup_low_measured`` /
    ``speedup_high_measured``, the predicted ``speedup_renewal`` and ``speedup_iid``, ``gap_renewal =
    tau_renewal - tau_full_blocks`` and ``within_tolerance = |gap_renewal| < 4 se + 0.1`` (tokens).
    ``sweep``: :func:`spade_lib.runs.protocol.speedup_table` of the sweep indexed by ``gamma`` (``tau``,
    ``speedup``, ``speedup_low``, ``speedup_high``)."""
    rows = []
    for g, tr in traces.items():
        tau_fb, se, n_steps = measured_tau(tr, g)
        pred = predict(scores[g], [g], c=c, verify_cost=verify_cost).set_index("method")
        row = {"gamma": g, "steps": n_steps, "tau_full_blocks": tau_fb, "se": se, "tau": sweep.loc[g, "tau"]}
        for m in PREDICTION_METHODS:
            row[f"tau_{m}"] = pred.loc[m, "tau"]
        for k in ("speedup", "speedup_low", "speedup_high"):
            row[f"{k}_measured"] = sweep.loc[g, k]
        row["speedup_renewal"] = pred.loc["renewal", "speedup"]
        row["speedup_iid"] = pred.loc["iid", "speedup"]
        rows.append(row)
    out = pd.DataFrame(rows)
    out["gap_renewal"] = out["tau_renewal"] - out["tau_full_blocks"]
    out["within_tolerance"] = out["gap_renewal"].abs() < 4 * out["se"] + 0.1
    return out
