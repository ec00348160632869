"""Training and evaluating the draft heads on :class:`~spade_lib.zoo.head_data.HeadData`, offline.

Soft labels: at position ``t`` the target's ``p_t(v) = exp(z_t(v) - lse_t)`` on its top-``k`` tokens
(exact probabilities, not renormalised), restricted to the head's draft vocabulary ``Vd``; the loss of
a prediction ``q`` of ``s_{t+1}`` is the cross-entropy

    CE(p_t, q) = - sum_{v in topk_t, v in Vd} p_t(v) log q(v)        (forward KL on those tokens + const).

- **EAGLE** (both variants; the training-time test, :meth:`~spade_lib.decoding.drafts.eagle.EagleHead.unrolled`):
  step ``i`` at ``t`` predicts ``s_{t+2+i}``, labelled by ``p_{t+1+i}``::

      L = ce_weight * sum_{i < steps} 0.8^i mean_t CE(p_{t+1+i}, q_i(t))
          + feature_weight * sum_i 0.8^i mean_t SmoothL1(o_i(t), f_{t+1+i})      (EAGLE-1: its one feature)

- **Medusa-1**: head ``i`` at ``t`` predicts ``s_{t+2+i}``: ``L = sum_i 0.8^i mean_t CE(p_{t+1+i}, q_i(t))``.

AdamW on the head's own parameters (the tied target embedding stays frozen), linear warm-up then cosine decay to
10 %, global-norm clipping, batches from a seeded generator: the same data, seed and thread count give the same
weights. ``deadline`` (a ``clock()`` value) is a guard, not the recipe (whose steps are sized to end before it); if it
trips, training stops there, the facts say so (``budget_hit``, ``steps_done``) and the weights depend on machine speed.

Evaluation (held-out sequences, teacher forcing: every depth conditions on the true tokens) per depth
``i``: ``top1`` = mean ``[argmax q_i = argmax p]`` (alpha at ``T = 0``) and ``alpha_lb`` =
``mean sum_{v in topk} min(p(v), q_i(v)) <= alpha(T = 1)`` (the target's mass outside its top ``k`` is not
counted), over all positions and over the target's own generated tokens alone.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from spade_lib import measures
from spade_lib.decoding.drafts.eagle import STEP_DECAY, EagleHead
from spade_lib.decoding.drafts.medusa import MedusaHead
from spade_lib.devices import clock
from spade_lib.zoo.head_data import HeadData


@dataclass(frozen=True)
class HeadTrainConfig:
    steps: int = 300              # optimiser steps
    batch_size: int = 4           # EAGLE: sequences per step
    seq_len: int = 256            # EAGLE: draft positions per sequence crop
    rows: int = 1024              # Medusa: positions per step
    ttt_steps: int = 3            # EAGLE: unrolled steps of the training-time test (>= 3: EAGLE-3's)
    step_decay: float = STEP_DECAY  # weight of step / head i is step_decay ** i
    lr: float = 1e-3              # AdamW peak learning rate
    warmup: int = 20              # linear warm-up steps, then cosine decay to 10 %
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ce_weight: float = 1.0        # weight of the cross-entropy to the target's soft labels
    feature_weight: float = 0.0   # EAGLE-1: weight of SmoothL1(o, next feature) (EAGLE-1 used 1 with ce 0.1)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "rows", "ttt_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not 0 < self.step_decay <= 1:
            raise ValueError(f"step_decay: must be in (0, 1], got {self.step_decay}")


def lr_at(step: int, cfg: HeadTrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def draft_index(head) -> torch.Tensor:
    """``[V]`` long: the draft row of each target id, ``-1`` off the draft vocabulary."""
    idx = torch.full((head.config.vocab_size,), -1, dtype=torch.long)
    idx[head.draft_ids.cpu()] = torch.arange(head.config.draft_vocab_size)
    return idx


def soft_labels(topv: torch.Tensor, topi: torch.Tensor, lse: torch.Tensor, index: torch.Tensor):
    """``(draft rows [.., k], p [.., k])``: the top-k tokens as draft rows (0 where off the vocabulary,
    with ``p = 0`` there) and their exact target probabilities."""
    rows = index[topi.long()]
    p = torch.exp(topv.float() - lse.float()[..., None])
    return rows.clamp(min=0), torch.where(rows >= 0, p, torch.zeros_like(p))


def soft_ce(logits: torch.Tensor, rows: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``-sum_j p_j log softmax(logits)[rows_j]`` per position: ``[.., Vd], [.., k], [.., k] -> [..]``."""
    return -(p * torch.log_softmax(logits.float(), dim=-1).gather(-1, rows)).sum(-1)


def _loop(head, params, cfg: HeadTrainConfig, loss_fn, deadline: float | None, desc: str) -> tuple[list, dict]:
    for p in head.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    curve, running, t0, done, hit = [], [], clock(), 0, False
    head.train()
    for step in tqdm(range(cfg.steps), desc=desc, file=sys.stderr, leave=False, mininterval=1.0):
        if deadline is not None and clock() > deadline:
            hit = True
            break
        lr = lr_at(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = loss_fn(gen)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        running.append(loss.item())
        done = step + 1
        if done % 10 == 0 or done == cfg.steps:
            curve.append({"step": done, "loss": round(sum(running) / len(running), 5), "lr": lr,
                          "seconds": round(clock() - t0, 3)})
            running = []
    if running:
        curve.append({"step": done, "loss": round(sum(running) / len(running), 5), "lr": lr_at(done - 1, cfg),
                      "seconds": round(clock() - t0, 3)})
    head.eval()
    for p in head.parameters():
        p.requires_grad_(False)
    return curve, {"steps_done": done, "budget_hit": hit, "train_seconds": clock() - t0}


def _eagle_batch(data: HeadData, pick: list[int], cfg: HeadTrainConfig, gen: torch.Generator, index: torch.Tensor,
                 with_features: bool):
    """Right-padded crops: features ``[B, T, F]``, tokens ``[B, T + steps - 1]``, and per step ``i``
    soft labels ``[B, T, k]`` and a validity mask ``[B, T]`` (label ``p_{a+1+i+t}`` inside the sequence)."""
    s = cfg.ttt_steps
    crops = []
    for j in pick:
        n = int(data.seqs[j].numel())
        t = min(cfg.seq_len, n - 1)
        a = int(torch.randint(0, n - t, (1,), generator=gen))  # t draft positions a .. a+t-1, pairs inside
        crops.append((j, n, t, a))
    width = max(c[2] for c in crops)
    feats, toks, labels, masks, targets = [], [], [[] for _ in range(s)], [[] for _ in range(s)], [[] for _ in range(s)]
    for j, n, t, a in crops:
        feats.append(F.pad(data.feats[j][a: a + t].float(), (0, 0, 0, width - t)))
        tk = data.seqs[j][a + 1: a + t + s]
        toks.append(F.pad(tk, (0, width + s - 1 - tk.numel())))
        for i in range(s):
            lo, hi = a + 1 + i, min(a + 1 + i + t, n)
            m = hi - lo
            rows, p = soft_labels(data.topv[j][lo:hi], data.topi[j][lo:hi], data.lse[j][lo:hi], index)
            labels[i].append((F.pad(rows, (0, 0, 0, width - m)), F.pad(p, (0, 0, 0, width - m))))
            mask = torch.zeros(width, dtype=torch.bool)
            mask[:m] = True
            masks[i].append(mask)
            if with_features:
                targets[i].append(F.pad(data.feats[j][lo:hi].float(), (0, 0, 0, width - m)))
    out = {"feats": torch.stack(feats), "tokens": torch.stack(toks),
           "rows": [torch.stack([r for r, _ in labels[i]]) for i in range(s)],
           "p": [torch.stack([p for _, p in labels[i]]) for i in range(s)],
           "mask": [torch.stack(masks[i]) for i in range(s)]}
    if with_features:
        out["targets"] = [torch.stack(targets[i]) for i in range(s)]
    return out


def eagle_loss(head: EagleHead, batch: dict, cfg: HeadTrainConfig) -> torch.Tensor:
    """The training-time-test loss of one batch (module docstring)."""
    dev = head.fc.weight.device
    logits, outputs = head.unrolled(batch["feats"].to(dev), batch["tokens"].to(dev), steps=cfg.ttt_steps)
    loss = torch.zeros((), device=dev)
    for i in range(cfg.ttt_steps):
        mask = batch["mask"][i].to(dev)
        if not mask.any():
            continue
        w = cfg.step_decay ** i
        if cfg.ce_weight:
            ce = soft_ce(logits[i], batch["rows"][i].to(dev), batch["p"][i].to(dev))
            loss = loss + cfg.ce_weight * w * ce[mask].mean()
        if cfg.feature_weight:
            reg = F.smooth_l1_loss(outputs[i][mask], batch["targets"][i].to(dev)[mask])
            loss = loss + cfg.feature_weight * w * reg
    return loss


def train_eagle(head: EagleHead, data: HeadData, train_ids: list[int], cfg: HeadTrainConfig, *,
                deadline: float | None = None) -> tuple[list, dict]:
    """Train ``head`` in place; returns the loss curve and facts (steps done, budget guard, seconds)."""
    if cfg.feature_weight and head.config.variant != "eagle1":
        raise ValueError("feature_weight: the feature regression is the eagle1 variant's (its output is a "
                         "target feature); an eagle3 head's output is not")
    usable = [j for j in train_ids if int(data.seqs[j].numel()) >= 2]
    if not usable:
        raise ValueError("data: no training sequence has two tokens")
    index = draft_index(head)
    picker = torch.Generator().manual_seed(cfg.seed + 1)

    def loss_fn(gen):
        pick = [usable[k] for k in torch.randint(0, len(usable), (cfg.batch_size,), generator=picker).tolist()]
        return eagle_loss(head, _eagle_batch(data, pick, cfg, gen, index, bool(cfg.feature_weight)), cfg)

    return _loop(head, head.trainable_parameters(), cfg, loss_fn, deadline, f"train {head.config.variant}")


def _medusa_rows(data: HeadData, ids: list[int], k: int, index: torch.Tensor):
    """Flat per-position tensors of ``ids``: features ``[N, H]``, per head ``i`` soft labels of
    ``p_{t+1+i}`` and a validity mask (``t + 1 + i`` inside the sequence)."""
    feats = torch.cat([data.feats[j] for j in ids])
    n_all = feats.shape[0]
    rows, ps, masks = [], [], []
    for i in range(k):
        r_i, p_i, m_i = [], [], []
        for j in ids:
            n = int(data.seqs[j].numel())
            lo = 1 + i
            m = max(0, n - lo)
            r, p = soft_labels(data.topv[j][lo:], data.topi[j][lo:], data.lse[j][lo:], index)
            kk = data.topv[j].shape[1]
            r_i.append(torch.cat([r, torch.zeros(n - m, kk, dtype=torch.long)]))
            p_i.append(torch.cat([p, torch.zeros(n - m, kk)]))
            mask = torch.zeros(n, dtype=torch.bool)
            mask[:m] = True
            m_i.append(mask)
        rows.append(torch.cat(r_i))
        ps.append(torch.cat(p_i))
        masks.append(torch.cat(m_i))
    assert rows[0].shape[0] == n_all
    return feats, rows, ps, masks


def medusa_loss(head: MedusaHead, feats, rows, ps, masks, cfg: HeadTrainConfig) -> torch.Tensor:
    dev = head.d2t.device
    logits = head(feats.to(dev).float())  # [N, k, Vd]
    loss = torch.zeros((), device=dev)
    for i in range(head.config.num_heads):
        m = masks[i].to(dev)
        if m.any():
            ce = soft_ce(logits[:, i], rows[i].to(dev), ps[i].to(dev))
            loss = loss + cfg.step_decay ** i * ce[m].mean()
    return loss


def train_medusa(head: MedusaHead, data: HeadData, train_ids: list[int], cfg: HeadTrainConfig, *,
                 deadline: float | None = None) -> tuple[list, dict]:
    """Train ``head`` in place on random positions of ``train_ids``; returns the curve and facts."""
    if not train_ids:
        raise ValueError("train_ids: no training sequences")
    feats, rows, ps, masks = _medusa_rows(data, train_ids, head.config.num_heads, draft_index(head))
    n = feats.shape[0]

    def loss_fn(gen):
        pick = torch.randint(0, n, (min(cfg.rows, n),), generator=gen)
        return medusa_loss(head, feats[pick], [r[pick] for r in rows], [p[pick] for p in ps],
                           [m[pick] for m in masks], cfg)

    return _loop(head, head.trainable_parameters(), cfg, loss_fn, deadline, "train medusa")


@torch.no_grad()
def evaluate(head, data: HeadData, ids: list[int], depth: int) -> dict:
    """Teacher-forced ``top1`` and ``alpha_lb`` per depth (module docstring) on ``ids``; ``"all"`` positions
    and ``"generated"`` ones (labels of the target's own answer tokens). The depths a head drafts
    (:attr:`~spade_lib.decoding.model.heads.DraftHead.max_depth`) beyond it count no positions."""
    index = draft_index(head)
    drafted = depth if head.max_depth is None else min(depth, head.max_depth)
    dev = head.d2t.device
    sums = {scope: {"top1": [0.0] * depth, "alpha_lb": [0.0] * depth, "n": [0] * depth}
            for scope in ("all", "generated")}
    for j in ids:
        n = int(data.seqs[j].numel())
        if n < 2:
            continue
        feats = data.feats[j][: n - 1].float().to(dev)
        logits = head.chain_logits(feats, data.seqs[j][1:], drafted)
        for i, lg in enumerate(logits):
            lo, hi = 1 + i, n  # labels p_{t+1+i} for t = 0 .. n-2-i
            m = hi - lo
            if m <= 0:
                continue
            lg = lg[:m]
            q = torch.softmax(lg.float(), -1)
            rows, p = soft_labels(data.topv[j][lo:hi], data.topi[j][lo:hi], data.lse[j][lo:hi], index)
            rows, p = rows.to(dev), p.to(dev)
            agree = (head.draft_ids[lg.argmax(-1)] == data.topi[j][lo:hi, 0].to(dev).long()).float()
            overlap = measures.alpha(p, q.gather(-1, rows))  # sum over the target's top k only: <= alpha
            gen = torch.arange(lo, hi, device=dev) >= data.starts[j] - 1  # p_pos labels s_{pos+1}: generated?
            gen = gen & torch.tensor(data.starts[j] > 0, device=dev)
            for scope, sel in (("all", slice(None)), ("generated", gen)):
                sums[scope]["top1"][i] += float(agree[sel].sum())
                sums[scope]["alpha_lb"][i] += float(overlap[sel].sum())
                sums[scope]["n"][i] += int(agree[sel].numel())
    out = {}
    for scope, s in sums.items():
        out[scope] = {"n_positions": s["n"],
                      "top1": [a / n if n else None for a, n in zip(s["top1"], s["n"])],
                      "alpha_lb": [a / n if n else None for a, n in zip(s["alpha_lb"], s["n"])]}
    return out
