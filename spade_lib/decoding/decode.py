"""The SPADE speculative decoder: raw model forwards, KV-cache rollback, every decision recorded.

Notation (Leviathan et al. 2023): ``p`` target, ``q`` draft, ``gamma`` draft length. One *step*:

1. the drafter proposes ``x_0 .. x_{gamma-1}`` with adjusted draft distributions ``q_0 .. q_{gamma-1}``
   (``gamma`` chosen by the policy, capped so the block fits ``max_new_tokens`` and the context);
2. one target forward on ``[t, x_0 .. x_{gamma-1}]`` (``t`` the newest committed token, not yet in the
   target's cache) gives ``p_0 .. p_gamma`` — all through :func:`spade_lib.sampling.adjust`, the same
   warpers as ``q``;
3. :func:`spade_lib.verify.verify` accepts a prefix of ``n`` drafts and draws the next token (residual
   ``norm(max(0, p_n - q_n))`` at the first rejection, bonus ``~ p_gamma`` after ``gamma`` accepts);
4. the target cache is cropped to the committed text (``x_n ..`` removed), the drafter is told ``n``.

The step emits ``n + 1`` tokens, each distributed exactly as the target's adjusted ``p`` (lossless
modes; greedy when ``temperature == 0``). A step with ``gamma = 0`` (no proposal, or one token left) is
a plain target step. An EOS inside the emitted block ends generation there; ``max_new_tokens`` is exact
(a longer block is truncated); the prompt plus the continuation never exceeds the context limit.

Randomness: three ``torch.Generator``s seeded from ``seed`` through ``numpy.random.SeedSequence`` —
draft sampling, acceptance uniforms, residual/bonus sampling — so the same seed and inputs replay bit
for bit, and what one stream draws does not depend on how many draws the others consumed.

Records (``record=True``): one row per drafted token with the trace columns of
:data:`spade_lib.runs.trace.TRACE_SCHEMA` (:meth:`GenerationResult.records`). Per step the statistics are
computed vectorised over the ``gamma`` positions as named tensors (one per column of
``trace.POSITION_STATS``), stacked and moved to the host with a single ``.tolist()``.
``record="light"`` keeps only step-level facts (``n``, ``gamma``, next token, timings),
``record=False`` only the tokens and total times.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from spade_lib import rules
from spade_lib.runs import trace
from spade_lib.decoding.adapter import CausalLMAdapter, as_token_tensor
from spade_lib.decoding.drafters import Draft, Drafter, ModelDrafter
from spade_lib.measures import entropy, kl, tv
from spade_lib.decoding.policies import Policy, as_policy, step_cap
from spade_lib.sampling import SamplingConfig, adjust
from spade_lib.validate import ArgumentTypeError, check_int, check_token_ids
from spade_lib.verify import sample_inverse_cdf, verify

__all__ = ["SpeculativeDecoder", "AutoregressiveDecoder", "GenerationResult", "StepInfo", "RECORD_COLUMNS",
           "seed_streams"]

RECORD_COLUMNS: tuple[str, ...] = trace.RECORD_COLUMNS  # the trace's columns minus prompt_id/category/sample
# per-position statistics: the names of the tensors _stats returns, stacked in this order for the host
_STATS: tuple[str, ...] = trace.POSITION_STATS
_INT_STATS = frozenset(n for n in _STATS if pa.types.is_integer(trace.TRACE_SCHEMA.field(n).type))
_BOOL_STATS = frozenset(n for n in _STATS if pa.types.is_boolean(trace.TRACE_SCHEMA.field(n).type))
STREAMS = ("draft", "accept", "residual")


def seed_streams(seed: int, device: torch.device | str) -> dict[str, torch.Generator]:
    """Independent generators for draft sampling, acceptance uniforms and residual/bonus sampling."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: must be an integer >= 0, got {seed!r}")
    states = np.random.SeedSequence(int(seed)).spawn(len(STREAMS))
    return {name: torch.Generator(device=device).manual_seed(int(s.generate_state(1, np.uint64)[0] >> 1))
            for name, s in zip(STREAMS, states)}


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@dataclass
class StepInfo:
    """Step-level facts of one verification step."""

    gamma: int            # tokens drafted
    n_accepted: int       # accepted drafts
    next_token: int       # residual / bonus token
    emitted: int          # tokens appended to the output (n + 1, or fewer when truncated)
    abs_pos: int          # tokens emitted before this step
    draft_stop: str       # why drafting stopped: "max_gamma", "policy", "no_match" or "budget"
    t_draft: float = float("nan")
    t_verify: float = float("nan")
    t_overhead: float = float("nan")
    stats: dict[str, list] | None = None  # per-position statistics by column name, each [gamma] (record=True only)
    topk: list[Any] | None = None     # record_topk > 0: [p_ids, p_probs, q_ids, q_probs], each [gamma][k]


@dataclass
class GenerationResult:
    """Output of one generation: the new tokens, step-level info, timings and token-level records."""

    tokens: list[int]                  # new token ids (prompt excluded)
    prompt_length: int
    stop_reason: str                   # "eos", "max_new_tokens" or "context_limit"
    steps: list[StepInfo] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)  # prefill, draft, verify, overhead, total (s)
    text: str | None = None
    seed: int = 0

    @property
    def n_steps(self) -> int:
        """Target verification calls after the prefill (= tokens for autoregressive decoding)."""
        return len(self.steps)

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def accept_lengths(self) -> list[int]:
        """``n + 1`` per step, the verification's outcome before truncation (``spade_lib.runs.metrics``)."""
        return [s.n_accepted + 1 for s in self.steps]

    @property
    def emitted_lengths(self) -> list[int]:
        """Tokens each step actually appended (``accept_lengths`` truncated by EOS / ``max_new_tokens``)."""
        return [s.emitted for s in self.steps]

    @property
    def gammas(self) -> list[int]:
        return [s.gamma for s in self.steps]

    def records(self) -> list[dict[str, Any]]:
        """One dict per drafted token with exactly the trace columns (minus prompt_id/category/sample);
        plus ``p_topk_ids``, ``p_topk_probs``, ``q_topk_ids``, ``q_topk_probs`` when recorded."""
        rows: list[dict[str, Any]] = []
        for step, s in enumerate(self.steps):
            if s.gamma == 0:
                continue
            if s.stats is None:
                raise ValueError("records: this generation ran with record='light' or False (no token records)")
            g = s.gamma
            cols = s.stats
            for pos in range(g):
                row: dict[str, Any] = {"step": step, "pos": pos, "abs_pos": s.abs_pos + pos, "gamma": g}
                for name in _STATS:
                    v = cols[name][pos]
                    row[name] = int(v) if name in _INT_STATS else bool(v) if name in _BOOL_STATS else v
                row["n_accepted"] = s.n_accepted
                row["next_token"] = s.next_token
                row["t_draft"], row["t_verify"], row["t_overhead"] = s.t_draft, s.t_verify, s.t_overhead
                rows.append({name: row[name] for name in RECORD_COLUMNS})
                if s.topk is not None:
                    for name, values in zip(("p_topk_ids", "p_topk_probs", "q_topk_ids", "q_topk_probs"), s.topk):
                        rows[-1][name] = values[pos]
        return rows


def _eos_set(model: torch.nn.Module, eos_token_id) -> frozenset[int]:
    if eos_token_id is None:
        gen = getattr(model, "generation_config", None)
        eos_token_id = getattr(gen, "eos_token_id", None) if gen is not None else None
        if eos_token_id is None:
            eos_token_id = getattr(model.config, "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (int, np.integer)) and not isinstance(eos_token_id, bool):
        return frozenset({check_int("eos_token_id", eos_token_id, min=0)})
    if isinstance(eos_token_id, (str, bytes)):  # "10" would iterate as {1, 0}
        raise ArgumentTypeError(f"eos_token_id: must be an int or a list of ints, got {eos_token_id!r} (str)")
    try:
        return frozenset(check_token_ids("eos_token_id", eos_token_id))
    except ArgumentTypeError:
        raise
    except TypeError:
        raise ArgumentTypeError(f"eos_token_id: must be an int or a list of ints, got {eos_token_id!r}") from None


def _check_budget(max_new_tokens: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: must be an integer >= 0, got {max_new_tokens!r}")


def _check_prompt(prompt: torch.Tensor, limit: int | None, vocab_size: int | None = None) -> None:
    if prompt.numel() == 0:
        raise ValueError("prompt_ids: empty prompt (at least one token, e.g. BOS, is needed to condition on)")
    if limit is not None and prompt.numel() > limit:
        raise ValueError(f"prompt_ids: {prompt.numel()} tokens exceed the context limit of {limit} positions")
    if vocab_size is not None and (int(prompt.min()) < 0 or int(prompt.max()) >= vocab_size):
        bad = int(prompt.min()) if int(prompt.min()) < 0 else int(prompt.max())
        raise ValueError(f"prompt_ids: token ids must lie in [0, {vocab_size}) (the vocabulary), got {bad}")


def _truncate(emitted: list[int], budget: int, eos: frozenset[int]) -> tuple[list[int], bool]:
    """Cut ``emitted`` after the first EOS and to ``budget`` tokens; also return whether EOS was hit."""
    for i, t in enumerate(emitted[:budget]):
        if t in eos:
            return emitted[:i + 1], True
    return emitted[:budget], False


class _Base:
    def __init__(self, target, sampling: SamplingConfig, tokenizer, eos_token_id, max_length):
        if not isinstance(sampling, SamplingConfig):
            raise ValueError(f"sampling: expected a SamplingConfig, got {type(sampling).__name__}")
        self.target = target if isinstance(target, CausalLMAdapter) else CausalLMAdapter(target, max_length=max_length)
        self.sampling = sampling
        self.tokenizer = tokenizer
        self.eos = _eos_set(self.target.model, eos_token_id)
        self.device = self.target.device
        self.max_length = self.target.max_length

    def _finish(self, result: GenerationResult) -> GenerationResult:
        if self.tokenizer is not None:
            result.text = self.tokenizer.decode(result.tokens)
        return result

    def _sample(self, p: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One token ``~ p`` ([1, V]) by inverse CDF with a uniform from ``generator`` (argmax if greedy)."""
        if self.sampling.greedy:
            return p.argmax(dim=-1)
        u = torch.rand(1, generator=generator, dtype=p.dtype, device=p.device)
        return sample_inverse_cdf(p, u)


class SpeculativeDecoder(_Base):
    """Speculative decoding of ``target`` with ``draft`` (an HF model, an adapter, or a :class:`Drafter`).

    Give exactly one of ``gamma`` (fixed draft length) or ``policy``. ``mode`` defaults to ``"greedy"``
    at temperature 0, ``"one_hot_q"`` for deterministic drafters and ``"exact"`` otherwise; lossy modes
    (``"typical"``, ``"lenience"``, with ``mode_options``) are allowed for experiments.
    ``eos_token_id=None`` takes the target's generation config; ``[]`` disables stopping on EOS.
    ``record``: ``True`` (token-level records), ``"light"`` (step-level only) or ``False``.
    ``record_topk=k`` also records the top-``k`` ids/probabilities of adjusted ``p`` and ``q``.
    """

    def __init__(self, target, draft, *, gamma: int | None = None, policy: Policy | None = None,
                 sampling: SamplingConfig = SamplingConfig(), mode: str | None = None, tokenizer=None,
                 eos_token_id: int | Sequence[int] | None = None, record: bool | str = True,
                 record_topk: int = 0, max_length: int | None = None, **mode_options: float):
        super().__init__(target, sampling, tokenizer, eos_token_id, max_length)
        self.policy = as_policy(gamma, policy)
        if isinstance(draft, Drafter):
            self.drafter = draft
        elif isinstance(draft, (CausalLMAdapter, torch.nn.Module)):
            self.drafter = ModelDrafter(draft, max_length=max_length)
        else:
            raise ValueError(f"draft: expected an HF causal LM, a CausalLMAdapter or a Drafter, got {type(draft).__name__}")
        if isinstance(self.drafter, ModelDrafter):
            dl = self.drafter.adapter.max_length
            if dl is not None:
                self.max_length = dl if self.max_length is None else min(self.max_length, dl)
            if self.drafter.adapter.device != self.device:
                raise ValueError(f"draft: on {self.drafter.adapter.device}, target on {self.device}")
        if mode is None:
            mode = self.drafter.mode or (
                "greedy" if sampling.greedy else ("one_hot_q" if self.drafter.deterministic else "exact"))
        if mode not in rules.rule_names():
            raise ValueError(f"mode: must be one of {rules.rule_names()}, got {mode!r}")
        self.mode = mode
        self.mode_options = rules.get_rule(mode).check_options(mode_options)
        if record not in (True, False, "light"):
            raise ValueError(f"record: must be True, 'light' or False, got {record!r}")
        self.record = record
        if isinstance(record_topk, bool) or not isinstance(record_topk, int) or record_topk < 0:
            raise ValueError(f"record_topk: must be an integer >= 0, got {record_topk!r}")
        self.record_topk = record_topk

    # -- per-step statistics ------------------------------------------------------------------
    def _stats(self, logits_p: torch.Tensor, p: torch.Tensor, draft: Draft, res) -> dict[str, torch.Tensor]:
        """The per-position statistics of one step: ``{column: tensor [gamma]}`` for every column of
        ``_STATS`` (``trace.POSITION_STATS``)."""
        g = draft.gamma
        x = draft.tokens
        p_g, q = p[:g], draft.q
        p_raw = logits_p[:g].float().softmax(dim=-1)
        q_raw = draft.q if draft.logits is None else draft.logits.float().softmax(dim=-1)
        xi = x[:, None]
        top2 = torch.topk(p_raw, 2, dim=-1)
        return {
            "draft_token": x, "p_x": res.p_x[0], "q_x": res.q_x[0], "accept_prob": res.accept_prob[0],
            "uniform": res.uniforms[0], "reached": res.reached[0], "accepted": res.accepted[0],
            "h_p": entropy(p_g), "h_q": entropy(q), "tv": tv(p_g, q), "kl": kl(p_g, q),
            "p_top1": top2.indices[:, 0], "p_margin": top2.values[:, 0] - top2.values[:, 1],
            "q_top_prob": q_raw.amax(dim=-1), "p_x_raw": p_raw.gather(1, xi)[:, 0],
            "q_x_raw": q_raw.gather(1, xi)[:, 0], "h_p_raw": entropy(p_raw), "h_q_raw": entropy(q_raw),
            "tv_raw": tv(p_raw, q_raw),
        }

    def _topk(self, p: torch.Tensor, q: torch.Tensor) -> list[torch.Tensor]:
        k = min(self.record_topk, p.shape[-1])
        tp, tq = torch.topk(p, k, dim=-1), torch.topk(q, k, dim=-1)
        return [tp.indices, tp.values, tq.indices, tq.values]

    # -- the loop -----------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, prompt_ids, max_new_tokens: int, seed: int = 0) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids`` (list, 1-D or ``[1, L]`` tensor)."""
        _check_budget(max_new_tokens)
        prompt = as_token_tensor(prompt_ids, self.device)
        _check_prompt(prompt, self.max_length, self.target.vocab_size)
        gens = seed_streams(seed, self.device)
        dev, target, drafter, policy, sampling = self.device, self.target, self.drafter, self.policy, self.sampling
        full, timed = self.record is True, self.record is not False
        L = int(prompt.numel())
        limit = self.max_length if self.max_length is not None else L + max_new_tokens

        t_start = _clock(dev)
        target.reset()
        if L > 1:
            target.extend(prompt[:-1], last_only=True)
        drafter.reset(prompt, target.vocab_size)
        pending = prompt[-1:]
        t_prefill = _clock(dev)

        tokens: list[int] = []
        steps: list[StepInfo] = []
        totals = {"draft": 0.0, "verify": 0.0, "overhead": 0.0}
        stop_reason = "max_new_tokens"
        # per-generation policy state (None: stateless); it caps each step from past steps (policies.step_cap)
        state = policy.start()
        while True:
            budget = min(max_new_tokens, limit - L) - len(tokens)
            if budget <= 0:
                if len(tokens) < max_new_tokens:
                    stop_reason = "context_limit"
                break
            cap = step_cap(policy, state)
            max_gamma = min(cap, budget - 1)
            ta = _clock(dev) if timed else 0.0
            cur = target.length
            if max_gamma > 0:
                draft = drafter.propose(max_gamma, policy, sampling, gens["draft"])
                if draft.stop == "max_gamma" and max_gamma < cap:
                    draft.stop = "budget"
            else:
                draft = None
            g = 0 if draft is None else draft.gamma
            tb = _clock(dev) if timed else 0.0

            if g == 0:  # plain target step
                logits_p = target.extend(pending, last_only=True)
                p = adjust(logits_p, sampling, validate=False)
                nxt = self._sample(p, gens["residual"])
                n_acc, next_token, drafted = 0, int(nxt.item()), []
                stats = topk = None
            else:
                logits_p = target.extend(torch.cat([pending, draft.tokens]))  # [g + 1, V]
                p = adjust(logits_p, sampling, validate=False)
                res = verify(p[None], draft.q[None], draft.tokens[None], mode=self.mode,
                             generator=gens["accept"], residual_generator=gens["residual"], validate=False,
                             **self.mode_options)
                # one device -> host transfer per step: n, next token, the drafts (and the statistics)
                head = torch.cat([res.n_accepted, res.next_token, draft.tokens]).to(torch.float64)
                if full:
                    named = self._stats(logits_p, p, draft, res)
                    flat = torch.stack([named[name].to(torch.float64) for name in _STATS]).flatten()
                    host = torch.cat([head, flat]).tolist()
                    stats = {name: host[2 + g + j * g:2 + g + (j + 1) * g] for j, name in enumerate(_STATS)}
                    topk = ([t.tolist() for t in self._topk(p[:g], draft.q)] if self.record_topk else None)
                else:
                    host, stats, topk = head.tolist(), None, None
                n_acc, next_token = int(host[0]), int(host[1])
                drafted = [int(t) for t in host[2:2 + n_acc]]
            tc = _clock(dev) if timed else 0.0

            block = drafted + [next_token]
            emitted, hit_eos = _truncate(block, budget, self.eos)
            target.rollback(cur + 1 + n_acc)
            drafter.accept(n_acc, next_token)
            if state is not None:
                state.observe(g, n_acc)
            pending = torch.tensor([next_token], dtype=torch.long, device=dev)
            steps.append(StepInfo(g, n_acc, next_token, len(emitted), len(tokens),
                                  "budget" if draft is None else draft.stop, stats=stats, topk=topk))
            tokens.extend(emitted)
            if timed:
                td = _clock(dev)
                s = steps[-1]
                s.t_draft, s.t_verify, s.t_overhead = tb - ta, tc - tb, td - tc
                totals["draft"] += s.t_draft
                totals["verify"] += s.t_verify
                totals["overhead"] += s.t_overhead
            if hit_eos:
                stop_reason = "eos"
                break
        t_end = _clock(dev)
        timing = {"prefill": t_prefill - t_start, **totals, "total": t_end - t_start}
        if not timed:
            timing.update(draft=float("nan"), verify=float("nan"), overhead=float("nan"))
        return self._finish(GenerationResult(tokens, L, stop_reason, steps, timing, seed=seed))

    def generate_batch(self, prompts, max_new_tokens: int, seed: int | Sequence[int] = 0) -> list[GenerationResult]:
        """Decode a list of prompts together, one result per prompt; ``seed``: one for every row, or
        one per row. Each row equals ``generate(prompt, seed=its seed)`` up to rounding
        (:mod:`spade_lib.decoding.batch`: masked holes, ragged acceptance)."""
        from spade_lib.decoding.batch import speculative_generate_batch

        return speculative_generate_batch(self, prompts, max_new_tokens, seed)


class AutoregressiveDecoder(_Base):
    """Plain KV-cached decoding of ``target`` on the same adapter and sampling (the speedup baseline).

    Token ``t ~ adjust(logits, sampling)`` by inverse CDF with the residual/bonus stream of
    :func:`seed_streams` (argmax when greedy). Each step is one "step" of the result with gamma 0.
    """

    def __init__(self, target, *, sampling: SamplingConfig = SamplingConfig(), tokenizer=None,
                 eos_token_id: int | Sequence[int] | None = None, max_length: int | None = None):
        super().__init__(target, sampling, tokenizer, eos_token_id, max_length)

    @torch.inference_mode()
    def generate(self, prompt_ids, max_new_tokens: int, seed: int = 0) -> GenerationResult:
        _check_budget(max_new_tokens)
        prompt = as_token_tensor(prompt_ids, self.device)
        _check_prompt(prompt, self.max_length, self.target.vocab_size)
        gen = seed_streams(seed, self.device)["residual"]
        dev, target, sampling = self.device, self.target, self.sampling
        L = int(prompt.numel())
        limit = self.max_length if self.max_length is not None else L + max_new_tokens
        budget = min(max_new_tokens, limit - L)
        t_start = _clock(dev)
        tokens: list[int] = []
        steps: list[StepInfo] = []
        stop_reason = "max_new_tokens" if budget == max_new_tokens else "context_limit"
        if budget > 0:
            logits = target.prefill(prompt)[None]
        t_prefill = _clock(dev)
        for i in range(budget):
            if i > 0:
                logits = target.extend(nxt, last_only=True)
            nxt = self._sample(adjust(logits, sampling, validate=False), gen)
            t = int(nxt.item())
            tokens.append(t)
            steps.append(StepInfo(0, 0, t, 1, i, "none"))
            if t in self.eos:
                stop_reason = "eos"
                break
        t_end = _clock(dev)
        timing = {"prefill": t_prefill - t_start, "draft": 0.0, "verify": t_end - t_prefill, "overhead": 0.0,
                  "total": t_end - t_start}
        return self._finish(GenerationResult(tokens, L, stop_reason, steps, timing, seed=seed))

    def generate_batch(self, prompts, max_new_tokens: int, seed: int | Sequence[int] = 0) -> list[GenerationResult]:
        """Batched :meth:`generate` (left padding, per-row seeds; :mod:`spade_lib.decoding.batch`)."""
        from spade_lib.decoding.batch import autoregressive_generate_batch

        return autoregressive_generate_batch(self, prompts, max_new_tokens, seed)
