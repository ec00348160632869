"""Teacher data of the draft heads: token sequences, then the target's features and soft labels on them.

A head learns to predict what the *target* will say from the target's own hidden states, so the
data are (1) the target's own greedy answers (decoded by SPADE's batched decoder, :func:`generations`) to
prompts cut from the embedded corpus's training split
(the distilled draft's prompts, :func:`spade_lib.zoo.distill.teacher_prompts`: complete-this-function
and explain-this-paragraph, in the target's chat template when it has one) — text distributed like
what the head will draft — and (2) windows of the training split's source files, cheap to label
(one teacher-forced forward labels every position). Never the held-out files the benchmark suites
are cut from: a head trained on a suite's own prompts would be measured on its training data.

:class:`HeadData` is what training reads, from one teacher-forced forward per batch of sequences with
``output_hidden_states``: per sequence ``s`` of ``n`` tokens, the features ``h^l_t`` of the layers the
head reads (concatenated, ``[n, sum of widths]``, stored in ``feature_dtype``) and the soft labels
``p_t`` (the target's top-``k`` logits at every position, predicting ``s_{t+1}``, and the log of its
normaliser ``log sum_v exp z_t(v)``, so ``p_t(v) = exp(z_t(v) - lse_t)`` exactly on the top ``k``;
``p_{n-1}``, the prediction after the last token, is a label too). Sequences are cached (``heads.data_entry``); features
are recomputed per build (hundreds of MB for a real target), which takes seconds to a few minutes.
"""

from __future__ import annotations

import inspect
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from spade_lib.devices import clock


GENERATORS = {"spade": "spade_lib.decoding.decode.AutoregressiveDecoder.generate_batch (greedy, on the lean weights: "
                       "LeanBatch; BatchLM where the target has no lean forward)",
              "hf": "transformers generate (greedy, left padding)"}


@dataclass(frozen=True)
class HeadDataConfig:
    n_prompts: int = 48            # corpus prompts the target answers (greedy): its own text
    code_fraction: float = 0.75    # share of complete-this-function prompts (the rest: explain a paragraph)
    max_prompt_tokens: int = 160   # prompts longer than this (after the chat template) are skipped
    gen_tokens: int = 96           # new tokens per answer
    gen_batch: int = 16            # prompts decoded together (left holes / left padding)
    generator: str = "spade"       # "spade": SPADE's batched decoder (decoding.batch); "hf": HF generate
    n_windows: int = 96            # teacher-forced windows of training-split source code
    window: int = 256              # tokens per window
    heldout_every: int = 8         # every this-many-th sequence is held out for evaluation
    bos: bool = False              # prepend the tokenizer's <bos> to every prompt and window (Gemma needs it)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_prompts", "n_windows"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("max_prompt_tokens", "gen_tokens", "gen_batch", "window", "heldout_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.generator not in GENERATORS:
            raise ValueError(f"generator: must be one of {tuple(GENERATORS)}, got {self.generator!r}")
        if self.heldout_every < 2:
            raise ValueError(f"heldout_every: must be >= 2 (one sequence in heldout_every is held out), "
                             f"got {self.heldout_every}")


@dataclass
class Sequences:
    """Token sequences; ``starts[i]`` is where the target's own tokens begin in ``seqs[i]`` (0 for a window)."""

    seqs: list[torch.Tensor]
    starts: list[int]
    kinds: list[str]  # "generation" or "window"

    def n_tokens(self) -> int:
        return sum(int(s.numel()) for s in self.seqs)

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """Flat tensors for safetensors: ``tokens``, ``lengths``, ``starts``, ``is_generation``."""
        return {"tokens": torch.cat(self.seqs) if self.seqs else torch.empty(0, dtype=torch.long),
                "lengths": torch.tensor([s.numel() for s in self.seqs], dtype=torch.long),
                "starts": torch.tensor(self.starts, dtype=torch.long),
                "is_generation": torch.tensor([k == "generation" for k in self.kinds], dtype=torch.bool)}

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor]) -> "Sequences":
        seqs = list(torch.split(t["tokens"], t["lengths"].tolist())) if t["lengths"].numel() else []
        kinds = ["generation" if g else "window" for g in t["is_generation"].tolist()]
        return cls([s.clone() for s in seqs], t["starts"].tolist(), kinds)


def _encode_prompt(tokenizer, text: str, bos: bool = False) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        ids = tokenizer.encode(rendered, add_special_tokens=False)
    else:
        ids = tokenizer.encode(text, add_special_tokens=False)
    return _with_bos(tokenizer, ids) if bos else ids


def _with_bos(tokenizer, ids: list[int]) -> list[int]:
    """``ids`` starting with the tokenizer's ``<bos>`` (``ValueError`` naming ``bos`` if it has none)."""
    b = tokenizer.bos_token_id
    if b is None:
        raise ValueError("bos: the tokenizer has no bos_token_id to prepend")
    return ids if ids[:1] == [b] else [b] + list(ids)


@torch.no_grad()
def generations(target, prompt_ids: list[list[int]], cfg: HeadDataConfig, *, pad_id: int, eos_ids=(),
                desc: str = "head data: generations") -> Sequences:
    """The target's greedy answers (``cfg.gen_tokens`` new tokens, cut after an eos) to ``prompt_ids``,
    ``cfg.gen_batch`` prompts at a time; each sequence is ``prompt + answer``.

    ``cfg.generator="spade"``: SPADE's own batched decoder (:meth:`AutoregressiveDecoder.generate_batch`: one
    forward per new token for all the rows still running, ragged prompts as left holes, a row leaving at its
    eos; sliding-window models too, on the lean weights, :class:`spade_lib.decoding.model.lean_batch.LeanBatch`, else
    :class:`spade_lib.decoding.batch.BatchLM`), so the tokens per minute grow
    with the batch; ``"hf"``: Hugging Face ``generate`` on left-padded batches (the former way, kept to
    compare). Both are greedy: the same answers up to near ties of the target's top two logits."""
    out = Sequences([], [], [])
    dev = next(target.parameters()).device
    batches = [prompt_ids[i: i + cfg.gen_batch] for i in range(0, len(prompt_ids), cfg.gen_batch)]
    eos = sorted(set(eos_ids))
    if cfg.generator == "spade":
        from spade_lib.decoding.decode import AutoregressiveDecoder
        from spade_lib.sampling import SamplingConfig

        decoder = AutoregressiveDecoder(target, sampling=SamplingConfig(temperature=0), eos_token_id=eos)
    for batch in tqdm(batches, desc=desc, file=sys.stderr, leave=False):
        if cfg.generator == "spade":
            answers = [r.tokens for r in decoder.generate_batch(batch, cfg.gen_tokens)]
        else:
            width = max(len(p) for p in batch)
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch], device=dev)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=dev)
            gen = target.generate(ids, attention_mask=mask, max_new_tokens=cfg.gen_tokens, do_sample=False,
                                  pad_token_id=pad_id, temperature=None, top_k=None, top_p=None)
            answers = [gen[r, width:].tolist() for r in range(len(batch))]
        for p, new in zip(batch, answers):
            for j, t in enumerate(new):
                if t in eos:
                    new = new[: j + 1]
                    break
            if len(new) >= 2:
                out.seqs.append(torch.tensor(p + new, dtype=torch.long))
                out.starts.append(len(p))
                out.kinds.append("generation")
    return out


def windows(tokenizer, documents: list[str], cfg: HeadDataConfig) -> Sequences:
    """``cfg.n_windows`` windows of ``cfg.window`` tokens at seeded offsets, one per document in a seeded order."""
    out = Sequences([], [], [])
    if cfg.n_windows == 0:
        return out
    g = torch.Generator().manual_seed(cfg.seed + 1)
    for i in torch.randperm(len(documents), generator=g).tolist():
        ids = tokenizer(documents[i], add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) <= cfg.window:
            continue
        start = int(torch.randint(0, len(ids) - cfg.window, (1,), generator=g))
        window = ids[start: start + cfg.window]
        out.seqs.append(torch.tensor(_with_bos(tokenizer, window) if cfg.bos else window, dtype=torch.long))
        out.starts.append(0)
        out.kinds.append("window")
        if len(out.seqs) == cfg.n_windows:
            break
    return out


def corpus_texts(cfg: HeadDataConfig) -> tuple[list[str], list[str]]:
    """(prompts, documents) from the embedded corpus's training split (module docstring)."""
    from spade_lib.zoo.build import cached_corpus
    from spade_lib.zoo.corpus import CorpusConfig
    from spade_lib.zoo.distill import teacher_prompts

    prompts = teacher_prompts(cfg.n_prompts, cfg.code_fraction, cfg.seed) if cfg.n_prompts else []
    documents = [d.text for d in cached_corpus(CorpusConfig()).train if d.kind == "code"]
    return prompts, documents


def teacher_sequences(target, tokenizer, cfg: HeadDataConfig, *, prompts: list[str] | None = None,
                      documents: list[str] | None = None) -> tuple[Sequences, dict]:
    """Generations then windows (``prompts`` / ``documents`` default to the corpus's, :func:`corpus_texts`);
    returns the sequences and facts for the manifest."""
    t0 = clock()
    if prompts is None or documents is None:
        default_prompts, default_documents = corpus_texts(cfg)
        prompts = default_prompts if prompts is None else prompts
        documents = default_documents if documents is None else documents
    encoded = [_encode_prompt(tokenizer, p, cfg.bos) for p in prompts[: cfg.n_prompts]]
    kept = [e for e in encoded if 0 < len(e) <= cfg.max_prompt_tokens]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = getattr(target.generation_config, "eos_token_id", None)
    eos = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    eos |= {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    t1, cpu1 = clock(), time.process_time()
    gens = generations(target, kept, cfg, pad_id=int(pad if pad is not None else 0), eos_ids=eos)
    t_gen, cpu_gen = clock() - t1, time.process_time() - cpu1
    n_gen = sum(int(s.numel()) - st for s, st in zip(gens.seqs, gens.starts))
    wins = windows(tokenizer, list(documents), cfg)
    seqs = Sequences(gens.seqs + wins.seqs, gens.starts + wins.starts, gens.kinds + wins.kinds)
    facts = {"prompts": len(encoded), "prompts_kept": len(kept), "generations": len(gens.seqs),
             "generated_tokens": n_gen, "windows": len(wins.seqs), "tokens": seqs.n_tokens(),
             "generation": {"decoder": GENERATORS[cfg.generator], "generator": cfg.generator,
                            "batch_size": cfg.gen_batch, "prompts": len(kept), "max_new_tokens": cfg.gen_tokens,
                            "tokens": n_gen, "seconds": t_gen, "cpu_seconds": cpu_gen,
                            "threads": torch.get_num_threads(),
                            "tokens_per_minute": 60.0 * n_gen / t_gen if t_gen > 0 else None,
                            "note": "wall-clock on the build machine (inflated if it was shared); cpu_seconds "
                                    "counts every thread"},
             "seconds": {"generations": t_gen, "total": clock() - t0}}
    return seqs, facts


@dataclass
class HeadData:
    """Features and soft labels of a set of sequences (module docstring)."""

    seqs: list[torch.Tensor]        # [n] long
    starts: list[int]
    feats: list[torch.Tensor]       # [n, F] in feature_dtype: the concatenated target states
    topv: list[torch.Tensor]        # [n, k] float16: the target's top-k logits at each position ...
    topi: list[torch.Tensor]        # [n, k] int32: ... and their token ids (predicting s_{t+1})
    lse: list[torch.Tensor]         # [n] float32: log of the softmax normaliser over all V logits

    def n_tokens(self) -> int:
        return sum(int(s.numel()) for s in self.seqs)

    def subset(self, ids: list[int]) -> "HeadData":
        return HeadData(*([getattr(self, f)[i] for i in ids]
                          for f in ("seqs", "starts", "feats", "topv", "topi", "lse")))


def output_logits(target, hidden: torch.Tensor) -> torch.Tensor:
    """The target's logits from its last hidden state ``h^L`` (after the final norm, ``hidden_states[L]``):
    its output layer, then the final soft-capping ``c tanh(z / c)`` where the config has one (Gemma-2 style)."""
    logits = target.get_output_embeddings()(hidden)
    cap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


@torch.no_grad()
def extract(target, seqs: Sequences, layers: tuple[int, ...], *, top_k: int = 32, batch: int = 8,
            feature_dtype: torch.dtype = torch.bfloat16, logit_rows: int = 512,
            desc: str = "head data: features") -> HeadData:
    """One teacher-forced forward per batch (right padding: causal, so padding never reaches a real
    position) with ``output_hidden_states``: the states of ``layers`` and the top-``k`` logits.

    The logits are never held for a whole batch: the forward keeps only the last position's, and the
    top-``k`` and ``lse`` come from :func:`output_logits` of ``h^L`` over ``logit_rows`` positions at a time
    (Gemma-3's ``V = 262,144``: a batch of 8 x 256 positions is 2.1 GB of fp32 logits; 512 rows are 0.5 GB)."""
    if logit_rows < 1:
        raise ValueError(f"logit_rows: must be >= 1, got {logit_rows}")
    dev = next(target.parameters()).device
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(target.forward).parameters else {}
    data = HeadData([], [], [], [], [], [])
    order = sorted(range(len(seqs.seqs)), key=lambda i: -int(seqs.seqs[i].numel()))  # similar lengths together
    out: dict[int, tuple] = {}
    for b in tqdm(range(0, len(order), batch), desc=desc, file=sys.stderr, leave=False):
        chunk = order[b: b + batch]
        width = max(int(seqs.seqs[i].numel()) for i in chunk)
        ids = torch.stack([F.pad(seqs.seqs[i], (0, width - int(seqs.seqs[i].numel()))) for i in chunk]).to(dev)
        res = target(input_ids=ids, output_hidden_states=True, use_cache=False, **keep)
        feats = torch.cat([res.hidden_states[layer] for layer in layers], dim=-1)
        last = res.hidden_states[-1].reshape(-1, res.hidden_states[-1].shape[-1])  # [B * width, H]
        topv, topi, lse = [], [], []
        for a in range(0, last.shape[0], logit_rows):
            logits = output_logits(target, last[a: a + logit_rows]).float()
            v, i = logits.topk(top_k, dim=-1)
            topv.append(v)
            topi.append(i)
            lse.append(logits.logsumexp(dim=-1))
            del logits
        shape = (len(chunk), width)
        topv, topi = torch.cat(topv).view(*shape, top_k), torch.cat(topi).view(*shape, top_k)
        lse = torch.cat(lse).view(shape)
        for r, i in enumerate(chunk):
            n = int(seqs.seqs[i].numel())
            out[i] = (feats[r, :n].to("cpu", feature_dtype), topv[r, :n].to("cpu", torch.float16),
                      topi[r, :n].to("cpu", torch.int32), lse[r, :n].to("cpu"))
    for i in range(len(seqs.seqs)):
        data.seqs.append(seqs.seqs[i])
        data.starts.append(seqs.starts[i])
        for field, value in zip(("feats", "topv", "topi", "lse"), out[i]):
            getattr(data, field).append(value)
    return data
