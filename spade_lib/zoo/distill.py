"""Distilling a cheap draft from a real target: teacher data, a frequency-restricted head, training.

The recipe (``DistillConfig``), for a target ``p`` such as SmolLM2-135M-Instruct:

1. **Teacher data: the target's own generations and its soft labels on code.** Prompts cut from the training split
   of the embedded corpus (function signatures with docstrings, and docstring prose paragraphs to explain; never the
   held-out files nor HumanEval), each in the target's chat template, are answered by the target in batches
   (``generate`` with left padding, greedy for even batches and ``T = 1`` sampling for odd ones); the same pass
   records, at every generated position ``t``, the target's top-``k`` logits: the soft labels ``p_t`` (renormalised
   over the top ``k``). Most soft labels come from teacher-forced windows of the same split's source files (one
   batched forward labels every position of a window; generation yields one token per row per forward).
2. **A frequent-token head (FR-Spec).** The draft scores only the ``head_vocab`` most frequent tokens of the target's
   generations plus the training text (``frspec.py``); ``q = 0`` elsewhere, still exact.
3. **A draft built from the target's own weights.** Its embedding and first ``n_prefix`` decoder layers are the
   target's (frozen), then ``n_adapter`` trainable layers initialised from the target's last layers, the target's
   final norm, and the head initialised from the target's (tied) output rows of the kept tokens: at initialisation
   "early exit after ``n_prefix`` layers, then the target's last layers", an adapter (Kangaroo, Liu et al. 2024)
   trained to map the shallow hidden state to the deep one's output distribution.
4. **Training** minimises, over generated positions ``t``, the cross-entropy to the soft labels
   ``L = -mean_t sum_{v in topk_t, v in head} p_t(v) log q_t(v)`` (= forward KL on the top ``k`` up to a constant),
   with AdamW. The frozen prefix's hidden states are computed once, so each step runs only the adapter and the head.

Everything is seeded; the build records its timings (wall and CPU) in the manifest.
"""

from __future__ import annotations

import copy
import math
import re
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from spade_lib import measures
from spade_lib.devices import clock


@dataclass(frozen=True)
class DistillConfig:
    n_prompts: int = 32            # prompts the target answers (teacher data)
    code_fraction: float = 0.75    # share of code prompts (the rest: explain a docstring paragraph)
    max_prompt_tokens: int = 160   # prompts longer than this (in the chat template) are skipped
    gen_tokens: int = 64           # new tokens per teacher generation
    gen_batch: int = 32            # prompts per batched generate call (larger: cheaper per token)
    n_windows: int = 48            # teacher-forced windows of training-split source code
    window: int = 256              # tokens per window
    top_k: int = 32                # teacher logits kept per generated position
    head_vocab: int = 8192         # tokens the draft's head scores (FR-Spec)
    n_prefix: int = 2              # frozen target layers at the bottom of the draft
    n_adapter: int = 1             # trainable layers on top, initialised from the target's last layers
    steps: int = 150               # optimiser steps
    batch_size: int = 4            # sequences per step
    lr: float = 5e-4               # AdamW peak learning rate (adapter layers, norm, head)
    warmup: int = 20               # linear warm-up steps, then cosine decay to 10 %
    weight_decay: float = 0.0
    heldout_fraction: float = 0.125  # generations kept aside for the held-out alpha
    seed: int = 0
    threads: int | None = 2        # torch threads while building

    def __post_init__(self) -> None:
        if self.n_prefix < 0 or self.n_adapter < 1:
            raise ValueError(f"n_prefix must be >= 0 and n_adapter >= 1, got {self.n_prefix}, {self.n_adapter}")
        if not 0 <= self.code_fraction <= 1 or not 0 < self.heldout_fraction < 1:
            raise ValueError("code_fraction must be in [0, 1] and heldout_fraction in (0, 1)")
        for name in ("gen_tokens", "gen_batch", "window", "top_k", "head_vocab", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")


# ----------------------------------------------------------------------------------------------- prompts

_DEF = re.compile(r'^(?:    )?def [A-Za-z_]\w*\([^)]*\)[^:\n]*:\n(?:\s+"""[\s\S]{20,600}?""")', re.M)


def teacher_prompts(n: int, code_fraction: float, seed: int, split: str = "train") -> list[str]:
    """``n`` user messages from the embedded corpus's *training* split (``split="heldout"``: from its
    held-out files, for evaluation only): ``round(n * code_fraction)`` "complete this function" prompts
    (a ``def`` line and its docstring) and explain-this-paragraph prompts from the corpus' prose
    documents (docstring paragraphs). Deterministic for a seed."""
    import random

    from spade_lib.zoo.build import cached_corpus
    from spade_lib.zoo.corpus import CorpusConfig

    if split not in ("train", "heldout"):
        raise ValueError(f"split: must be 'train' or 'heldout', got {split!r}")
    corpus = cached_corpus(CorpusConfig())
    code, prose = [], []
    for doc in getattr(corpus, split):
        if doc.kind == "prose":
            prose.extend(p.strip() for p in doc.text.split("\n\n") if 200 <= len(p.strip()) <= 700)
        else:
            code.extend(m.group(0).strip("\n") for m in _DEF.finditer(doc.text))
    rng = random.Random(seed)
    rng.shuffle(code)
    rng.shuffle(prose)
    n_code = round(n * code_fraction)
    prompts = [f"Complete this Python function:\n\n```python\n{c}\n```" for c in code[:n_code]]
    prompts += [f"Explain this in simple words:\n\n{p}" for p in prose[: n - len(prompts)]]
    rng.shuffle(prompts)
    return prompts


# ------------------------------------------------------------------------------------------ teacher data

@dataclass
class TeacherData:
    """Sequences ``prompt + generation`` (unpadded) with top-k soft labels at the generated positions.

    ``labels_at[i]`` is the index in ``seqs[i]`` of the first generated token: the target's logits at
    position ``j >= labels_at[i] - 1`` predict token ``j + 1``; ``topv[i][r]``/``topi[i][r]`` hold the
    top-k logits predicting ``seqs[i][labels_at[i] + r]``."""

    seqs: list[torch.Tensor]
    labels_at: list[int]
    topv: list[torch.Tensor]
    topi: list[torch.Tensor]

    def n_tokens(self) -> int:
        return sum(int(v.shape[0]) for v in self.topv)


@torch.no_grad()
def teacher_generations(target, tokenizer, prompts: list[str], cfg: DistillConfig,
                        desc: str = "teacher") -> TeacherData:
    """The target answers ``prompts`` in batches; returns its sequences and top-k logits (see ``TeacherData``)."""
    rendered = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                              add_generation_prompt=True) for p in prompts]
    enc = [tokenizer.encode(r, add_special_tokens=False) for r in rendered]
    enc = [e for e in enc if len(e) <= cfg.max_prompt_tokens]
    if not enc:
        return TeacherData([], [], [], [])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = set(_as_list(target.generation_config.eos_token_id) or [tokenizer.eos_token_id])
    data = TeacherData([], [], [], [])
    batches = [enc[i: i + cfg.gen_batch] for i in range(0, len(enc), cfg.gen_batch)]
    for b, batch in enumerate(tqdm(batches, desc=desc, file=sys.stderr, leave=False)):
        width = max(len(e) for e in batch)
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in batch])
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in batch])
        sample = b % 2 == 1
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + b)
        torch.manual_seed(cfg.seed * 1000 + b)  # HF sampling uses the global generator
        out = target.generate(ids, attention_mask=mask, max_new_tokens=cfg.gen_tokens, do_sample=sample,
                              temperature=1.0 if sample else None, top_k=0 if sample else None,
                              top_p=1.0 if sample else None, output_logits=True, return_dict_in_generate=True,
                              pad_token_id=pad)
        del gen
        new = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1)  # [B, T_new, V] raw logits
        topv, topi = logits.float().topk(cfg.top_k, dim=-1)
        for r, e in enumerate(batch):
            toks = new[r].tolist()
            n = len(toks)
            for j, t in enumerate(toks):
                if t in eos:
                    n = j + 1  # keep the eos prediction itself
                    break
            if n < 2:
                continue
            data.seqs.append(torch.tensor(e + toks[:n]))
            data.labels_at.append(len(e))
            data.topv.append(topv[r, :n].to(torch.float16))
            data.topi.append(topi[r, :n].to(torch.int32))
    return data


@torch.no_grad()
def teacher_windows(target, tokenizer, cfg: DistillConfig, batch: int = 8,
                    desc: str = "teacher windows") -> TeacherData:
    """``cfg.n_windows`` windows of ``cfg.window`` tokens at seeded offsets in the training split's
    source files, with the target's top-k logits at every position (``labels_at = 1``)."""
    from spade_lib.zoo.build import cached_corpus
    from spade_lib.zoo.corpus import CorpusConfig

    data = TeacherData([], [], [], [])
    if cfg.n_windows == 0:
        return data
    docs = [d for d in cached_corpus(CorpusConfig()).train if d.kind == "code"]
    g = torch.Generator().manual_seed(cfg.seed + 1)
    order = torch.randperm(len(docs), generator=g).tolist()
    windows = []
    for i in order:
        ids = tokenizer(docs[i].text, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) <= cfg.window:
            continue
        start = int(torch.randint(0, len(ids) - cfg.window, (1,), generator=g))
        windows.append(torch.tensor(ids[start: start + cfg.window]))
        if len(windows) == cfg.n_windows:
            break
    for i in tqdm(range(0, len(windows), batch), desc=desc, file=sys.stderr, leave=False):
        x = torch.stack(windows[i: i + batch])
        topv, topi = target(input_ids=x, use_cache=False).logits[:, :-1].float().topk(cfg.top_k, dim=-1)
        for r in range(x.shape[0]):
            data.seqs.append(x[r])
            data.labels_at.append(1)
            data.topv.append(topv[r].to(torch.float16))
            data.topi.append(topi[r].to(torch.int32))
    return data


def merge(a: TeacherData, b: TeacherData) -> TeacherData:
    return TeacherData(a.seqs + b.seqs, a.labels_at + b.labels_at, a.topv + b.topv, a.topi + b.topi)


def _as_list(x):
    if x is None:
        return None
    return list(x) if isinstance(x, (list, tuple)) else [x]


def frequent_tokens(counts: torch.Tensor, n: int, always: list[int]) -> torch.Tensor:
    """The ``n`` ids with the largest ``counts`` (ties by id), always including ``always`` (special tokens)."""
    score = counts.double().clone()
    score[always] = float("inf")
    order = torch.argsort(-score, stable=True)
    return torch.sort(order[:n]).values


# -------------------------------------------------------------------------------------------------- draft

def draft_from_target(target, head_ids: torch.Tensor, cfg: DistillConfig):
    """An ``FRSpecLlamaForCausalLM``: the target's embedding + first ``n_prefix`` layers, its last
    ``n_adapter`` layers, its final norm, and head rows ``head_ids`` of its output matrix."""
    from spade_lib.zoo.frspec import FRSpecLlamaConfig, FRSpecLlamaForCausalLM

    tc = target.config
    d = {k: v for k, v in tc.to_dict().items() if k not in ("model_type", "architectures", "transformers_version",
                                                            "tie_word_embeddings", "quantization_config")}
    d["num_hidden_layers"] = cfg.n_prefix + cfg.n_adapter
    config = FRSpecLlamaConfig(head_vocab=len(head_ids), **d)
    draft = FRSpecLlamaForCausalLM(config)
    src_layers = list(range(cfg.n_prefix)) + list(range(tc.num_hidden_layers - cfg.n_adapter, tc.num_hidden_layers))
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        for i, j in enumerate(src_layers):
            draft.model.layers[i].load_state_dict(target.model.layers[j].state_dict())
        draft.model.norm.load_state_dict(target.model.norm.state_dict())
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight[head_ids])
        draft.set_head_tokens(head_ids)
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()


def _suffix(draft, n_prefix: int):
    """A view of ``draft.model`` that runs only layers ``n_prefix..`` (and the final norm) on ``inputs_embeds``."""
    suffix = copy.copy(draft.model)
    suffix._modules = dict(draft.model._modules)
    suffix.layers = torch.nn.ModuleList(list(draft.model.layers)[n_prefix:])
    return suffix


@torch.no_grad()
def prefix_states(draft, seqs: list[torch.Tensor], n_prefix: int, batch: int = 8) -> list[torch.Tensor]:
    """Hidden states after the frozen prefix (``hidden_states[n_prefix]``) of every sequence."""
    out = []
    for i in range(0, len(seqs), batch):
        chunk = seqs[i: i + batch]
        width = max(len(s) for s in chunk)
        ids = torch.stack([F.pad(s, (0, width - len(s))) for s in chunk])  # right padding: causal, harmless
        h = draft.model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[n_prefix]
        out.extend(h[r, : len(s)].clone() for r, s in enumerate(chunk))
    return out


def _targets(data: TeacherData, i: int, head_pos: torch.Tensor):
    """(positions predicting generated tokens, head-index soft labels [n, k], their probabilities [n, k])."""
    start = data.labels_at[i] - 1
    n = data.topv[i].shape[0]
    pos = torch.arange(start, start + n)
    idx = head_pos[data.topi[i].long()]          # -1 where the token is outside the head
    prob = torch.softmax(data.topv[i].float(), -1)
    prob = torch.where(idx >= 0, prob, torch.zeros_like(prob))
    return pos, idx.clamp(min=0), prob


def soft_ce(logits_small: torch.Tensor, idx: torch.Tensor, prob: torch.Tensor) -> torch.Tensor:
    """``-sum_j prob_j log q(idx_j)``, summed over rows (``q = softmax(logits_small)``)."""
    logq = torch.log_softmax(logits_small.float(), -1)
    return -(prob * logq.gather(-1, idx)).sum()


def train_draft(draft, data: TeacherData, train_ids: list[int], cfg: DistillConfig, desc: str = "distil") -> list[dict]:
    """Train the draft's adapter layers, final norm and head (the prefix stays frozen)."""
    head_pos = torch.full((draft.config.vocab_size,), -1, dtype=torch.long)
    head_pos[draft.head_token_ids] = torch.arange(draft.config.head_vocab)
    states = prefix_states(draft, [data.seqs[i] for i in train_ids], cfg.n_prefix)
    labels = [_targets(data, i, head_pos) for i in train_ids]
    suffix = _suffix(draft, cfg.n_prefix)
    for p in draft.parameters():
        p.requires_grad_(False)
    params = [*suffix.layers.parameters(), *draft.model.norm.parameters(), *draft.lm_head.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    g = torch.Generator().manual_seed(cfg.seed)
    curve, running, t0 = [], [], clock()
    draft.train()
    for step in tqdm(range(cfg.steps), desc=desc, file=sys.stderr, leave=False, mininterval=1.0):
        lr = cfg.lr * ((step + 1) / cfg.warmup if step < cfg.warmup else
                       0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))))
        for group in opt.param_groups:
            group["lr"] = lr
        pick = torch.randint(0, len(train_ids), (cfg.batch_size,), generator=g).tolist()
        width = max(states[j].shape[0] for j in pick)
        h = torch.stack([F.pad(states[j], (0, 0, 0, width - states[j].shape[0])) for j in pick])
        hidden = suffix(inputs_embeds=h, use_cache=False).last_hidden_state
        loss, n = 0.0, 0
        for r, j in enumerate(pick):
            pos, idx, prob = labels[j]
            loss = loss + soft_ce(draft.lm_head(hidden[r, pos]), idx, prob)
            n += len(pos)
        loss = loss / n
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        running.append(loss.item())
        if (step + 1) % 10 == 0 or step + 1 == cfg.steps:
            curve.append({"step": step + 1, "loss": round(sum(running) / len(running), 5), "lr": lr,
                          "seconds": round(clock() - t0, 3)})
            running = []
    for p in draft.parameters():
        p.requires_grad_(False)
    return curve


@torch.no_grad()
def heldout_alpha(target, draft, data: TeacherData, ids: list[int], temperatures=(1.0,)) -> dict:
    """Teacher-forced acceptance on held-out generations, at the generated positions:
    ``alpha(T) = mean_t sum_v min(p_t, q_t)`` with full target logits, and greedy top-1 agreement
    (alpha at T = 0)."""
    acc = {t: 0.0 for t in temperatures}
    top1, n = 0.0, 0
    for i in ids:
        s = data.seqs[i][None]
        start = data.labels_at[i] - 1
        end = start + data.topv[i].shape[0]
        p_logits = target(input_ids=s, use_cache=False).logits[0, start:end].float()
        q_logits = draft(input_ids=s, use_cache=False).logits[0, start:end].float()
        top1 += (p_logits.argmax(-1) == q_logits.argmax(-1)).sum().item()
        for t in temperatures:
            acc[t] += measures.alpha(torch.softmax(p_logits / t, -1), torch.softmax(q_logits / t, -1)).sum().item()
        n += end - start
    return {"alpha_by_temperature": {"0": top1 / n, **{str(t): v / n for t, v in acc.items()}}, "n_positions": n}
