"""Held-out, teacher-forced agreement of a draft head with its target, by draft depth (:func:`evaluate_head`).

Held-out data (:func:`heldout_texts`, cached by :func:`heldout_entry`): prompts cut from the embedded corpus's
*held-out* files (those the embedded suites are cut from; the heads' teacher data, ``head_data.py``, comes from the
training split only, split by whole files) with the target's own greedy continuations, plus windows of held-out
source files. Other token sequences (e.g. a HumanEval suite's prompts and continuations) go through
:func:`evaluate_head` the same way.

Notation (:mod:`spade_lib.decoding.drafts.eagle`): on ``x_0 .. x_{n-1}`` the target's teacher-forced greedy token after
position ``j`` is ``g_j = argmax p(. | x_{<=j})``. At every position ``t`` the head drafts a greedy chain as when
decoding (its first proposal from the target's true features ``h_{<=t}`` with ``x_{t+1}``; EAGLE: proposal ``d`` fed
its own previous output and token, ``EagleHead.unrolled`` with ``own_tokens``; Medusa: head ``d - 1`` on ``h^L_t``).
Proposal ``y_d(t)``, ``d = 1 .. D``, guesses ``x_{t+1+d}`` and agrees when ``a_d(t) = [y_d(t) = g_{t+d}]``. Over
``t = 0 .. n-1-D`` (every depth labelled):

- ``top1[d] = mean_t a_d(t)``, unconditional: the head's top-1 agreement at depth ``d``;
- ``alpha[d] = k_d / n_d``, conditional: of the ``n_d`` positions whose depths ``1 .. d-1`` all agreed, the share
  ``k_d`` agreeing at ``d`` too: greedy chain verification's acceptance at depth ``d`` (alpha at ``T = 0``);
- ``reach[d] = k_d / n``: the chance a chain gets ``d`` tokens accepted; ``mean_accepted = sum_d reach[d]`` is the
  expected accepted draft tokens of a ``D``-token chain (without the bonus token).

Scopes: ``"all"`` positions and ``"generated"`` ones (``t >= start - 2``: chain tokens and labels lie in the target's
own continuation, ``g_j = x_{j+1}``, so ``alpha`` is the decoder's greedy acceptance). Intervals: Wilson 95 %
(:func:`spade_lib.intervals.binomial_ci`), positions treated as independent trials, though positions of one sequence
are correlated: read them as lower bounds on the uncertainty.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from spade_lib import rates
from spade_lib.decoding.model.heads import DraftHead
from spade_lib.intervals import binomial_ci
from spade_lib.zoo.head_data import HeadData, HeadDataConfig, Sequences, extract

__all__ = ["HELDOUT_DATA", "HELDOUT_BY_PAIR", "heldout_config", "heldout_texts", "heldout_entry", "heldout_sequences", "proposals", "agreement_by_depth",
           "evaluate_head", "format_table"]

HELDOUT_DATA = HeadDataConfig(n_prompts=32, gen_tokens=64, gen_batch=16, n_windows=16, window=256, seed=0)
HELDOUT_BY_PAIR = {  # the embedded default target was trained on 128-token windows: stay near that length
    "default": HeadDataConfig(n_prompts=32, max_prompt_tokens=96, gen_tokens=48, gen_batch=16, n_windows=16,
                              window=128, seed=0),
    "gemma3": HeadDataConfig(n_prompts=32, gen_tokens=64, gen_batch=16, n_windows=16, window=256, bos=True, seed=0)}
SCOPES = ("all", "generated")


def heldout_config(pair: str) -> HeadDataConfig:
    """The held-out data recipe of ``pair`` (:data:`HELDOUT_BY_PAIR`, else :data:`HELDOUT_DATA`)."""
    return HELDOUT_BY_PAIR.get(pair, HELDOUT_DATA)


def heldout_texts(cfg: HeadDataConfig = HELDOUT_DATA) -> tuple[list[str], list[str]]:
    """(prompts, documents) from the corpus's held-out files: the same prompt forms as the teacher data's
    (:func:`spade_lib.zoo.distill.teacher_prompts` with ``split="heldout"``) and the held-out code files."""
    from spade_lib.zoo.build import cached_corpus
    from spade_lib.zoo.corpus import CorpusConfig
    from spade_lib.zoo.distill import teacher_prompts

    prompts = teacher_prompts(cfg.n_prompts, cfg.code_fraction, cfg.seed, split="heldout") if cfg.n_prompts else []
    documents = [d.text for d in cached_corpus(CorpusConfig()).heldout if d.kind == "code"]
    return prompts, documents


def heldout_entry(target_dir, name: str, cfg: HeadDataConfig = HELDOUT_DATA, *, rebuild: bool = False) -> Path:
    """The cache folder ``<name>-heldout-<key>`` of the held-out sequences of the target saved at
    ``target_dir`` (:func:`spade_lib.zoo.heads.data_entry` on :func:`heldout_texts`), built if needed."""
    from spade_lib.zoo.heads import HeadConfig, data_entry

    prompts, documents = heldout_texts(cfg)
    return data_entry(target_dir, name, HeadConfig(data=cfg), rebuild=rebuild, prompts=prompts, documents=documents,
                      label="heldout")


def heldout_sequences(entry: Path) -> Sequences:
    from safetensors.torch import load_file

    return Sequences.from_tensors(load_file(str(Path(entry) / "sequences.safetensors")))


@torch.no_grad()
def proposals(head, features: torch.Tensor, next_tokens: torch.Tensor, depth: int) -> torch.Tensor:
    """The head's greedy chain after every position: ``features [T, F]`` of positions ``0 .. T-1`` (the
    target layers the head reads, concatenated), ``next_tokens [T]`` (``x_{t+1}``) -> ``y [T, depth]`` target
    ids, ``y[t, d-1]`` the ``d``-th proposal after ``t`` (module docstring; the head's
    :meth:`~spade_lib.decoding.model.heads.DraftHead.greedy_chain`). ``depth`` is at most the head's ``max_depth``
    (Medusa: its ``num_heads``)."""
    if not isinstance(head, DraftHead):
        raise ValueError(f"head: expected a DraftHead (EAGLE, Medusa), got {type(head).__name__}")
    return head.greedy_chain(features, next_tokens, depth)


@dataclass
class _Counts:
    n: int = 0
    agree: torch.Tensor | None = None     # [D] positions agreeing at depth d
    accepted: torch.Tensor | None = None  # [D] positions whose depths 1 .. d all agree

    def add(self, a: torch.Tensor) -> None:
        if a.shape[0] == 0:
            return
        a = a.long()
        acc = a.cumprod(dim=1)
        self.n += int(a.shape[0])
        self.agree = a.sum(0) if self.agree is None else self.agree + a.sum(0)
        self.accepted = acc.sum(0) if self.accepted is None else self.accepted + acc.sum(0)


def _table(c: _Counts, depth: int, level: float):
    import numpy as np
    import pandas as pd

    agree = c.agree.cpu().numpy() if c.agree is not None else np.zeros(depth, dtype=np.int64)
    accepted = c.accepted.cpu().numpy() if c.accepted is not None else np.zeros(depth, dtype=np.int64)
    reached = np.concatenate([[c.n], accepted[:-1]])
    n = np.full(depth, c.n)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = pd.DataFrame({"depth": np.arange(1, depth + 1), "n": n, "agree": agree,
                          "top1": agree / n, "reached": reached, "accepted": accepted,
                          "reach": rates.acceptance_per_drafted(accepted, n)})  # alpha_uncond of depth d
    t["top1_low"], t["top1_high"] = binomial_ci(agree, n, level)
    rates.add_rate(t, "accepted", "reached", "alpha", level)  # alpha_cond of depth d (spade_lib.rates)
    return t[["depth", "n", "agree", "top1", "top1_low", "top1_high", "reached", "accepted", "alpha",
              "alpha_low", "alpha_high", "reach"]]


def _check_finite_rows(name: str, t: torch.Tensor) -> None:
    """Refuse NaN / inf in the features ``t [T, F]`` a head reads, naming the tensor and the first bad row
    (position): a NaN feature makes NaN draft logits, whose argmax is a silent, wrong proposal."""
    bad = ~torch.isfinite(t).reshape(t.shape[0], -1).all(dim=-1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        what = "NaN" if bool(torch.isnan(t[row]).any()) else "inf"
        raise ValueError(f"{name}: holds {what} at row {row} (position {row} of the sequence); the target's "
                         "features must be finite")


@torch.no_grad()
def agreement_by_depth(head, data: HeadData, depth: int, ids: list[int] | None = None, *,
                       level: float = 0.95) -> dict:
    """Teacher-forced agreement by depth on the sequences ``ids`` of ``data`` (all by default; module
    docstring). ``data`` needs the features of the layers the head reads and the target's top-1
    (``extract(..., top_k >= 1)``). Returns ``{"all": table, "generated": table, "mean_accepted": {scope:
    sum of reach}, "depth": D}``, tables as pandas DataFrames, one row per depth."""
    if depth < 1:
        raise ValueError(f"depth: must be >= 1, got {depth}")
    counts = {scope: _Counts() for scope in SCOPES}
    for j in (range(len(data.seqs)) if ids is None else ids):
        n = int(data.seqs[j].numel())
        m = n - depth  # positions t = 0 .. n-1-depth: x_{t+1} and the labels g_{t+1} .. g_{t+depth} exist
        if m < 1:
            continue
        feats = data.feats[j][:m].float()
        _check_finite_rows(f"data.feats[{j}]", feats)
        y = proposals(head, feats, data.seqs[j][1:m + 1], depth).cpu()
        greedy = data.topi[j][:, 0].long()
        labels = torch.stack([greedy[d: d + m] for d in range(1, depth + 1)], dim=1)  # g_{t+d}
        a = y == labels
        counts["all"].add(a)
        start = int(data.starts[j])
        if start > 0:
            counts["generated"].add(a[max(0, start - 2):])
    out = {scope: _table(counts[scope], depth, level) for scope in SCOPES}
    out["mean_accepted"] = {scope: float(out[scope]["reach"].fillna(0).sum()) for scope in SCOPES}
    out["depth"] = depth
    return out


def evaluate_head(target, head, sequences: Sequences, depth: int = 5, *, level: float = 0.95) -> dict:
    """:func:`agreement_by_depth` of ``head`` on ``sequences`` (the target's features and greedy tokens from
    one teacher-forced forward each, :func:`spade_lib.zoo.head_data.extract`); ``depth`` is capped at the
    head's ``max_depth`` (Medusa: its number of heads)."""
    if head.max_depth is not None:
        depth = min(depth, head.max_depth)
    data = extract(target, sequences, head.feature_layers, top_k=1, feature_dtype=torch.float32,
                   desc="held-out: features")
    result = agreement_by_depth(head, data, depth, level=level)
    result["sequences"] = len(sequences.seqs)
    result["tokens"] = sequences.n_tokens()
    return result


def format_table(result: dict, scope: str = "generated") -> str:
    """The by-depth table of one scope as text: counts, top-1 and alpha with their intervals, reach."""
    t = result[scope]
    lines = [f"{scope} positions: {int(t['n'].iloc[0]) if len(t) else 0}   mean accepted of a {result['depth']}-token "
             f"greedy chain: {result['mean_accepted'][scope]:.3f}",
             f"{'depth':>5} {'n':>7} {'agree':>7} {'top1':>6} {'95% CI':>15}  {'reached':>7} {'alpha':>6} "
             f"{'95% CI':>15}  {'reach':>6}"]
    for r in t.itertuples():
        lines.append(f"{r.depth:>5} {r.n:>7} {r.agree:>7} {r.top1:>6.3f} [{r.top1_low:.3f}, {r.top1_high:.3f}]  "
                     f"{r.reached:>7} {r.alpha:>6.3f} [{r.alpha_low:.3f}, {r.alpha_high:.3f}]  {r.reach:>6.3f}")
    return "\n".join(lines)
