"""The SPADE speculative decoder (:class:`SpeculativeDecoder`): raw forwards, KV-cache rollback, every step recorded.

Notation (Leviathan et al. 2023): ``p`` target, ``q`` draft, ``gamma`` draft length. One *step*: (1) the drafter
proposes ``x_0 .. x_{gamma-1}`` with adjusted ``q_0 .. q_{gamma-1}`` (``gamma`` from the policy, capped to fit
``max_new_tokens`` and the context); (2) one target forward on ``[t, x_0 .. x_{gamma-1}]`` (``t``: newest committed
token, not yet cached) gives ``p_0 .. p_gamma`` via the same warpers (:func:`spade_lib.sampling.adjust`); (3)
:func:`spade_lib.verify.verify` accepts ``n`` drafts, then draws a residual ``norm(max(0, p_n - q_n))`` or the bonus
``~ p_gamma``; (4) the cache is cropped to the committed text, the drafter told ``n``. (3) and the commit (statistics,
one host transfer, EOS / budget cut) are :mod:`spade_lib.decoding.step`'s, shared with :mod:`~spade_lib.decoding.batch`
(``R = 1`` here). A step emits ``n + 1`` tokens, each exactly ``~ p`` (lossless modes; greedy at ``temperature == 0``);
``gamma = 0`` is a plain target step; an EOS ends generation there; ``max_new_tokens`` is exact; context never exceeded.

**Trees** (:mod:`spade_lib.decoding.drafts.tree`): a ``DraftTree`` with ``parents`` is verified in one tree-masked forward
(row ``i + 1`` sees the cache, ``t`` and node ``i``'s path; ``CausalLMAdapter.extend``) by ``Step.verify_tree`` under
the tree rule for ``mode`` (``exact``; ``eagle`` for ``one_hot_q``; ``greedy``); the cache keeps ``t`` and the accepted
path (``CausalLMAdapter.keep``), told to the drafter (``accept_path``); ``parents=None`` is the chain path; a tree too
big for the context is cut to its first nodes. A drafter naming ``hidden_layers`` gets ``observe(TargetView(...))``
after the prefill and each step (target hidden states at its committed rows, same forwards); naming none costs nothing.

Randomness: three ``torch.Generator``s from ``seed`` via ``numpy.random.SeedSequence`` (draft sampling, acceptance
uniforms, residual/bonus): same seed and inputs replay bit for bit; no stream depends on how many draws others made.
``record=True``: one row per drafted token (:data:`spade_lib.runs.trace.TRACE_SCHEMA`), statistics vectorised
(:func:`spade_lib.decoding.records.position_stats`), one ``.tolist()``, timed apart (``Verdict.t_records``, out of
``t_verify``; timed runs subtract ``timing["records"]``); ``"light"``: step facts (``n``, ``gamma``, next token,
timings, ``StepInfo.draft_costs``); ``False``: tokens and total times.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from spade_lib import rules
from spade_lib.decoding.batch import autoregressive_generate_batch, speculative_generate_batch
from spade_lib.decoding.batch_tree import tree_generate_batch
from spade_lib.decoding.model.adapter import CausalLMAdapter, as_token_tensor
from spade_lib.decoding.common import (GenerationResult, StepInfo, _check_budget, _check_prompt, _truncate,
                                       seed_streams)
from spade_lib.decoding.drafts.drafters import Drafter, ModelDrafter, TargetView
from spade_lib.decoding.drafts.policies import Policy, as_policy, step_cap
from spade_lib.decoding.step import Step, commit, sample_next
from spade_lib.devices import clock
from spade_lib.sampling import SamplingConfig, adjust
from spade_lib.validate import ArgumentTypeError, check_int, check_token_ids

__all__ = ["SpeculativeDecoder", "AutoregressiveDecoder"]


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


def _check_draft_vocab(target: CausalLMAdapter, draft: CausalLMAdapter) -> None:
    """Refuse a draft model that cannot read the target's token ids: the committed tokens (prompt, accepted
    drafts, the target's next tokens, ids in ``[0, V)`` of the target) are fed to the draft's input embedding,
    which must have a row for each (a same-tokenizer draft with a padded or an FR-Spec-trimmed head has; a
    draft with another tokenizer goes through the text instead: ``make_drafter``). A draft of another
    tokenizer whose embedding happens to be as large cannot be told apart without the two tokenizers."""
    model = draft.model
    get = getattr(model, "get_input_embeddings", None)
    rows = getattr(get() if callable(get) else None, "num_embeddings", None)
    if rows is None:  # no nn.Embedding to ask: the config's vocabulary, if it has one
        config = getattr(model, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        rows = getattr(text, "vocab_size", None)
    if rows is not None and int(rows) < int(target.vocab_size):
        raise ValueError(f"draft: {type(model).__name__} embeds {int(rows)} token ids, the target emits "
                         f"{target.vocab_size}: another vocabulary (tokenizer), whose model cannot read the target's "
                         "tokens. Draft with it through make_drafter(name, pair, rule='text'|'tli'|'slrs') with its "
                         "tokenizer in pair.draft_tokenizers (spade_lib.decoding.drafts.crossvocab)")


class _Base:
    def __init__(self, target, sampling: SamplingConfig, tokenizer, eos_token_id, max_length):
        if not isinstance(sampling, SamplingConfig):
            raise ValueError(f"sampling: expected a SamplingConfig, got {type(sampling).__name__}")
        self.target = target if isinstance(target, CausalLMAdapter) else CausalLMAdapter(target, max_length=max_length)
        lean = getattr(self.target, "lean", None)
        if lean is not None and lean.prefill != "fp32":  # a draft's setting (lean.prepare(draft=True)) on the target
            raise ValueError(f"target: its lean forward prefills in {lean.prefill} (model.spade_prefill, a draft's "
                             "setting); a target's logits are the output distribution, so its prefill stays fp32")
        self._sampling = sampling
        self.tokenizer = tokenizer
        self.eos = _eos_set(self.target.model, eos_token_id)
        self.device = self.target.device
        self.max_length = self.target.max_length

    @property
    def sampling(self) -> SamplingConfig:
        """The sampling configuration, fixed at construction: the verification rule (``mode``) is chosen for
        it, so a decoder built greedy and then sampled would verify sampled drafts with the greedy rule."""
        return self._sampling

    @sampling.setter
    def sampling(self, value) -> None:
        raise AttributeError("sampling: fixed at construction (the verification rule was chosen for it); "
                             "build a new decoder for another SamplingConfig")

    def _finish(self, result: GenerationResult) -> GenerationResult:
        if self.tokenizer is not None:
            result.text = self.tokenizer.decode(result.tokens)
        return result

    def _sample(self, p: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One token ``~ p`` ([1, V]) by inverse CDF with a uniform from ``generator`` (argmax if greedy)."""
        return sample_next(p, (generator,), self.sampling.greedy)


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
        if not isinstance(draft, Drafter):  # a model given straight: it reads the target's token ids
            _check_draft_vocab(self.target, self.drafter.adapter)
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
        # tree steps: the tree rule that applies this chain rule to siblings (exact, eagle <- one_hot_q, greedy, ...)
        self.tree_mode = next((name for name in rules.tree_rule_names() if rules.get_tree_rule(name).chain == mode), None)
        if record not in (True, False, "light"):
            raise ValueError(f"record: must be True, 'light' or False, got {record!r}")
        self.record = record
        if isinstance(record_topk, bool) or not isinstance(record_topk, int) or record_topk < 0:
            raise ValueError(f"record_topk: must be an integer >= 0, got {record_topk!r}")
        self.record_topk = record_topk

    # -- the loop -----------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, prompt_ids, max_new_tokens: int, seed: int = 0) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids`` (list, 1-D or ``[1, L]`` tensor).

        A chain is verified and committed by :class:`spade_lib.decoding.step.Step` and
        :func:`~spade_lib.decoding.step.commit` with one row, the step :meth:`generate_batch` runs per
        group of rows; a tree by :meth:`~spade_lib.decoding.step.Step.verify_tree`, the step batched tree
        decoding (:mod:`spade_lib.decoding.batch_tree`) runs per row."""
        _check_budget(max_new_tokens)
        prompt = as_token_tensor(prompt_ids, self.device)
        _check_prompt(prompt, self.max_length, self.target.vocab_size)
        gens = seed_streams(seed, self.device)
        dev, target, drafter, policy, sampling = self.device, self.target, self.drafter, self.policy, self.sampling
        full, timed = self.record is True, self.record is not False
        L = int(prompt.numel())
        limit = self.max_length if self.max_length is not None else L + max_new_tokens
        # what the drafter reads of the target (TargetView): nothing, unless it names layers or overrides observe
        layers = tuple(drafter.hidden_layers)
        observes = bool(layers) or type(drafter).observe is not Drafter.observe
        hid = {"hidden_layers": layers} if layers else {}  # the target's extends are the plain ones without

        t_start = clock(dev)
        target.reset()
        hidden = {i: torch.empty(0, target.hidden_size or 0, device=dev, dtype=target.dtype) for i in layers}
        if L > 1:
            out = target.extend(prompt[:-1], last_only=True, **hid)
            if layers:
                hidden = out.hidden
        drafter.reset(prompt, target.vocab_size)
        if observes:
            drafter.observe(TargetView(prompt[:-1], 0, hidden, int(prompt[-1])))
        pending = prompt[-1:]
        t_prefill = clock(dev)

        tokens: list[int] = []
        steps: list[StepInfo] = []
        totals = {"draft": 0.0, "verify": 0.0, "overhead": 0.0, "records": 0.0}
        stop_reason = "max_new_tokens"
        # per-generation policy state (None: stateless); it caps each step from past steps (policies.step_cap)
        state = policy.start()
        step = Step(self.mode, self.mode_options, sampling.greedy, full, self.record_topk, self.tree_mode)
        one_row = (gens,)  # the step's streams: this one row's
        while True:
            budget = min(max_new_tokens, limit - L) - len(tokens)
            if budget <= 0:
                if len(tokens) < max_new_tokens:
                    stop_reason = "context_limit"
                break
            cap = step_cap(policy, state)
            max_gamma = min(cap, budget - 1)
            ta = clock(dev) if timed else 0.0
            cur = target.length
            if max_gamma > 0:
                draft = drafter.propose(max_gamma, policy, sampling, gens["draft"])
                if draft.stop == "max_gamma" and max_gamma < cap:
                    draft.stop = "budget"
                if draft.parents is not None and target.max_length is not None \
                        and cur + 1 + draft.gamma > target.max_length:
                    draft = draft.prefix(target.max_length - cur - 1)  # the nodes that fit the context
                    draft.stop = "budget"
            else:
                draft = None
            g = 0 if draft is None else draft.gamma
            tree = None  # a tree step: its TREE_COLUMNS per node
            tb = clock(dev) if timed else 0.0

            if g == 0:  # plain target step
                out = target.extend(pending, last_only=True, **hid)
                logits_p = out.logits if layers else out
                p = adjust(logits_p, sampling, validate=False)
                next_token = int(step.plain(p, one_row).item())
                n_acc, stats, topk, t_rec = 0, None, None, 0.0
                emitted, hit_eos = _truncate([next_token], budget, self.eos)
            elif draft.parents is None:  # a chain: the shared step (spade_lib.decoding.step) with R = 1
                x = draft.tokens[None]
                out = target.extend(torch.cat([pending, draft.tokens]), **hid)
                logits_p = out.logits if layers else out  # [g + 1, V]
                p = adjust(logits_p, sampling, validate=False)
                v = step.verify(logits_p[None], p[None], x, draft.q[None],
                                None if draft.logits is None else draft.logits[None], one_row)
                # one device -> host transfer per step: n, next token, the drafts (and the statistics)
                f, = commit(v.n_accepted, v.next_token, x, [((0,), v)], (budget,), self.eos)
                n_acc, next_token, stats, topk, emitted, hit_eos = f.n, f.next_token, f.stats, f.topk, f.emitted, f.hit_eos
                t_rec = v.t_records
            else:  # a tree: one forward over [t, x_0 .. x_{N-1}], row i + 1 masked to the path of node i
                parents = draft.check()
                out = target.extend(torch.cat([pending, draft.tokens]), parents=[-1] + [j + 1 for j in parents], **hid)
                logits_p = out.logits if layers else out  # [N + 1, V]: row 0 after t, row i + 1 after node i
                p = adjust(logits_p, sampling, validate=False)
                f = step.verify_tree(logits_p, p, draft, parents, gens, budget, self.eos)
                n_acc, next_token, stats, topk, emitted, hit_eos = f.n, f.next_token, f.stats, f.topk, f.emitted, f.hit_eos
                path, tree, t_rec = f.path, f.tree, f.t_records
            tc = clock(dev) if timed else 0.0

            if g == 0 or draft.parents is None:  # a chain, or no draft
                target.rollback(cur + 1 + n_acc)
                drafter.accept(n_acc, next_token)
                kept = slice(0, n_acc + 1)
            else:
                target.keep([0] + [i + 1 for i in path], start=cur)
                drafter.accept_path(path, next_token)
                kept = torch.tensor([0] + [i + 1 for i in path], dtype=torch.long, device=dev)
            if observes:  # the committed rows: t and the accepted drafts, at positions cur ..
                fed = pending if draft is None else torch.cat([pending, draft.tokens])
                drafter.observe(TargetView(fed[kept], cur, {i: h[kept] for i, h in out.hidden.items()} if layers
                                           else {}, next_token))
            if state is not None:
                state.observe(g, n_acc)
            pending = torch.tensor([next_token], dtype=torch.long, device=dev)
            steps.append(StepInfo(g, n_acc, next_token, len(emitted), len(tokens),
                                  "budget" if draft is None else draft.stop, stats=stats, topk=topk, tree=tree,
                                  draft_costs=drafter.step_costs()))
            tokens.extend(emitted)
            if timed:
                td = clock(dev)
                s = steps[-1]
                s.t_draft, s.t_verify, s.t_overhead = tb - ta, tc - tb - t_rec, td - tc
                totals["records"] += t_rec
                totals["draft"] += s.t_draft
                totals["verify"] += s.t_verify
                totals["overhead"] += s.t_overhead
            if hit_eos:
                stop_reason = "eos"
                break
        t_end = clock(dev)
        timing = {"prefill": t_prefill - t_start, **totals, "total": t_end - t_start}
        if not timed:
            timing.update(draft=float("nan"), verify=float("nan"), overhead=float("nan"))
        return self._finish(GenerationResult(tokens, L, stop_reason, steps, timing, seed=seed))

    def generate_batch(self, prompts, max_new_tokens: int, seed: int | Sequence[int] = 0) -> list[GenerationResult]:
        """Decode a list of prompts together, one result per prompt; ``seed``: one for every row, or
        one per row. Each row equals ``generate(prompt, seed=its seed)`` up to rounding: chains by
        :mod:`spade_lib.decoding.batch` (masked holes, ragged acceptance), a drafter's trees by
        :mod:`spade_lib.decoding.batch_tree` (every row its own tree)."""
        tree = getattr(self.drafter, "tree", None)
        if tree is not None and not tree.is_chain:
            return tree_generate_batch(self, prompts, max_new_tokens, seed)
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
        t_start = clock(dev)
        tokens: list[int] = []
        steps: list[StepInfo] = []
        stop_reason = "max_new_tokens" if budget == max_new_tokens else "context_limit"
        if budget > 0:
            logits = target.prefill(prompt)[None]
        t_prefill = clock(dev)
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
        t_end = clock(dev)
        timing = {"prefill": t_prefill - t_start, "draft": 0.0, "verify": t_end - t_prefill, "overhead": 0.0,
                  "records": 0.0, "total": t_end - t_start}
        return self._finish(GenerationResult(tokens, L, stop_reason, steps, timing, seed=seed))

    def generate_batch(self, prompts, max_new_tokens: int, seed: int | Sequence[int] = 0, *, lean: bool = True
                       ) -> list[GenerationResult]:
        """Batched :meth:`generate` (left padding, per-row seeds; :mod:`spade_lib.decoding.batch`): on the lean
        weights where the target has them (:mod:`spade_lib.decoding.model.lean_batch`), or, ``lean=False``, through
        the Hugging Face forward as the speculative batch runs (a like-with-like comparison)."""
        return autoregressive_generate_batch(self, prompts, max_new_tokens, seed, lean=lean)
