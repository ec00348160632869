"""Model construction and the training loop of the embedded pairs.

Models are plain ``LlamaForCausalLM`` (RMSNorm, RoPE, SwiGLU), bos = eos = pad = 0.

Objectives, over the positions ``t`` of a batch of windows ``x``:

- ``lm`` (data only): cross-entropy  ``L = -mean_t log q(x_{t+1} | x_{<=t})``.
- ``kl`` (distillation, forward KL to the target's temperature-1 distribution ``p``):
  ``L = mean_t sum_v p(v | x_{<=t}) [log p(v | x_{<=t}) - log q(v | x_{<=t})]``.
  Minimising it raises the draft's acceptance rate ``alpha = sum_v min(p, q) = 1 - TV(p, q)``, which
  Pinsker bounds by ``1 - sqrt(KL / 2)``.

Optimiser: AdamW (betas 0.9/0.95, decoupled weight decay on matrices only), linear warm-up then cosine
decay to ``min_lr_frac * lr``, global-norm gradient clipping. Determinism: ``torch.manual_seed`` before
the weights are initialised and a seeded generator for the batches, so the same seed and thread count
give bit-identical weights. Optional bf16 autocast (CPU) for speed; the weights stay fp32.
"""

from __future__ import annotations

import contextlib
import math
import sys

import torch
import torch.nn.functional as F
from tqdm import tqdm

from spade_lib.devices import clock
from spade_lib.zoo.configs import ModelConfig, TrainConfig
from spade_lib.zoo.data import random_batch


def new_model(config: ModelConfig, vocab_size: int, seed: int):
    """A freshly initialised ``LlamaForCausalLM`` (fp32, train mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=config.hidden,
        intermediate_size=config.intermediate,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_heads,
        max_position_embeddings=config.max_positions,
        tie_word_embeddings=config.tie_embeddings,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(hf_config)
    model.generation_config.pad_token_id = 0
    return model


def n_parameters(model) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``lr * min_lr_frac`` at the last step."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    span = max(1, config.steps - config.warmup - 1)
    frac = min(1.0, (step - config.warmup) / span)
    return config.lr * (config.min_lr_frac + (1 - config.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of ``KL(p_teacher || q_student)`` at temperature 1 (nats)."""
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    log_p = F.log_softmax(teacher_logits.float(), dim=-1)
    return F.kl_div(log_q.flatten(0, -2), log_p.flatten(0, -2), log_target=True, reduction="batchmean")


def _autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def train_model(model, stream: torch.Tensor, config: TrainConfig, *, teacher=None, bf16: bool = False,
                desc: str = "train") -> list[dict]:
    """Train ``model`` in place on ``stream``; return the training curve ``[{step, loss, lr, seconds}]``.

    ``config.objective == "kl"`` needs a ``teacher`` (the target), run without gradients on the same batch.
    """
    if config.objective == "kl" and teacher is None:
        raise ValueError("teacher: objective 'kl' needs the target model as teacher")
    generator = torch.Generator().manual_seed(config.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr, betas=config.betas,
    )
    model.train()
    if teacher is not None:
        teacher.eval()
    curve, t0, running = [], clock(), []
    bar = tqdm(range(config.steps), desc=desc, file=sys.stderr, leave=False, mininterval=1.0)
    for step in bar:
        lr = lr_at(step, config)
        for group in opt.param_groups:
            group["lr"] = lr
        x = random_batch(stream, config.batch_size, config.seq_len, generator)
        inputs, labels = x[:, :-1], x[:, 1:]
        with _autocast(bf16):
            logits = model(input_ids=inputs, use_cache=False).logits
            if config.objective == "kl":
                with torch.no_grad():
                    teacher_logits = teacher(input_ids=inputs, use_cache=False).logits
                loss = kl_to_teacher(logits, teacher_logits)
            else:
                loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        running.append(loss.item())
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            mean = sum(running) / len(running)
            curve.append({"step": step + 1, "loss": round(mean, 5), "lr": lr,
                          "seconds": round(clock() - t0, 3)})
            bar.set_postfix(loss=f"{mean:.3f}")
            running = []
    model.eval()
    return curve
