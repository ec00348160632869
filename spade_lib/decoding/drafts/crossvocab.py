"""Speculative verification across vocabularies (Timor et al., ICML 2025, arXiv 2502.05202): draft vocabulary ``V_q``,
target ``V_p``, ``I`` the strings that are one token in both. Three drafters, each lossless (emitted law ``p``):

- **String-level** (:class:`TextDrafter`, SLEM-style): the draft's text re-encoded for the target (:func:`continuation`)
  is proposed as ``q = one_hot(x)`` and verified by ``one_hot_q`` (accept ``x`` w.p. ``p(x)``, else draw from ``p``
  without ``x``): exact for any proposal independent of the verifier's uniforms (``exactness.proposal_law_error``).
- **TLI** (:class:`TLIDrafter`): ``I`` by each token's decoded text (:func:`token_strings`, :func:`vocab_intersection`:
  ``"Ġthe"``, ``"▁the"`` -> ``" the"``); draft from ``q_I(x) = q(x) / sum_{y in I} q(y)`` on ``I``, else 0
  (:func:`tli_q`); the standard rule (accept ``min(1, p/q_I)``, residual ``norm(max(p - q_I, 0))``) gives law ``p``
  (Leviathan 2023, Thm 1); full-``q`` drafting is lossy (``naive_emitted_law``). Text sync: :class:`TextSyncDrafter`.
- **SLRS** (:class:`SLRSDrafter`): the draft writes a string ``S`` from rows ``r = adjust(draft logits, sampling)``;
  ``psi(t) = Q(S starts with t) = sum over paths d_1..d_m with str(d_<m) a proper prefix of t and t a prefix of
  str(d_<=m) of prod_j r(d_j | D, d_<j)``. ``S`` proposes ``lambda(S)``, the longest target token it starts with:
  ``q(t) = psi(t) - sum_{t' in ext(t)} psi(t')`` (``ext(t)``: shortest target tokens extending ``t``) and
  ``P(STOP) = 1 - sum_t q(t)`` (STOP ends the block). Position ``i`` draws ``S`` afresh from ``D_i`` (draft tokens of
  the committed text and ``x_<i``; :func:`sample_string`) and verifies ``x_i`` by the standard rule told
  ``q_i = q / (1 - P(STOP))`` (:func:`slrs_law`, every path), ``x_i``'s exact conditional law: Thm 1 holds per position.
  Told normalised ``psi``, or one tokenization's probability, the rule is lossy (``tests/test_crossvocab.py``).

**Costs.** SLRS runs a draft forward per inner node of :class:`DraftPaths` (path whose text is a proper prefix of a
target token) per drafted token: ``n_nodes = sum_s N(s)`` (``N(s)``: draft spellings of prefix ``s``), exponential in
target-token length, refused above ``SLRSConfig.max_nodes`` (4,096; ``ValueError`` at build); greedy walks one path.
:class:`DraftStepCosts` (``Drafter.step_costs`` -> ``StepInfo.draft_costs``) splits ``t_forward`` from ``t_text``
(decode, windowed re-encode :func:`retokenize`, align; tails once a step, :func:`tail_of`) and counts tokenizer calls.
Importing this module registers rules ``"text"``, ``"tli"``, ``"slrs"`` for ``make_drafter(name, pair, rule=...)``.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from spade_lib.decoding.model.adapter import CausalLMAdapter, as_token_tensor
from spade_lib.decoding.drafts.drafters import (Drafter, DrafterKind, _signals, one_hot_proposal, register_cross_vocab_rule,
                                        sample_categorical)
from spade_lib.decoding.drafts.policies import Policy
from spade_lib.decoding.drafts.tree import DraftTree
from spade_lib.devices import clock
from spade_lib.sampling import SamplingConfig, adjust


def intersection_map(draft_vocab: dict[str, int], target_vocab: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft ids, target ids) of the strings that are one token in both vocabularies, by string."""
    if not draft_vocab or not target_vocab:
        raise ValueError("draft_vocab/target_vocab: must be non-empty")
    common = sorted(set(draft_vocab) & set(target_vocab))
    if not common:
        raise ValueError("draft_vocab: no string is a token of both vocabularies")
    return (torch.tensor([draft_vocab[s] for s in common]), torch.tensor([target_vocab[s] for s in common]))


def tli_distribution(q: torch.Tensor, draft_ids: torch.Tensor, target_ids: torch.Tensor,
                     target_size: int) -> torch.Tensor:
    """q restricted to the intersection, renormalised, as a distribution over target ids (last dim)."""
    mass = q[..., draft_ids]
    total = mass.sum(-1, keepdim=True)
    if bool((total <= 0).any()):
        raise ValueError("q: no mass on the vocabulary intersection")
    out = q.new_zeros(q.shape[:-1] + (target_size,))
    out[..., target_ids] = mass / total
    return out


def emitted_law(p: torch.Tensor, q_target: torch.Tensor) -> torch.Tensor:
    """Exact law of the emitted token of one verification step with draft law ``q_target`` over target ids."""
    accept = torch.minimum(torch.ones_like(p), torch.where(q_target > 0, p / q_target.clamp_min(1e-300), 1.0))
    accepted = q_target * accept
    residual = (p - q_target).clamp_min(0)
    rej = 1 - accepted.sum(-1, keepdim=True)
    z = residual.sum(-1, keepdim=True)
    return accepted + torch.where(z > 0, rej * residual / z.clamp_min(1e-300), 0.0)


def naive_emitted_law(p: torch.Tensor, q: torch.Tensor, to_target: torch.Tensor) -> torch.Tensor:
    """The lossy rule: draft id d from the full q, propose target id ``to_target[d]`` (first token of its
    re-encoding), accept with ``min(1, p(t)/q(d))``, else draw from ``norm(max(p - q_on_target, 0))``."""
    q_t = torch.zeros_like(p).index_add_(-1, to_target, q)  # pushed-forward mass, used only for the residual
    accept = torch.minimum(torch.ones_like(q), p[..., to_target] / q.clamp_min(1e-300))
    accepted = torch.zeros_like(p).index_add_(-1, to_target, q * accept)
    residual = (p - q_t).clamp_min(0)
    rej = 1 - accepted.sum(-1, keepdim=True)
    z = residual.sum(-1, keepdim=True)
    return accepted + torch.where(z > 0, rej * residual / z.clamp_min(1e-300), 0.0)


# ------------------------------------------------------------------------------------------------
# string-level drafting: the draft's text, re-encoded as target tokens (SLEM-style)
#
# A *tokenizer* here is anything with ``encode(text, add_special_tokens=False) -> list[int]`` and
# ``decode(ids, skip_special_tokens=True) -> str`` (a Hugging Face tokenizer, or the synthetic ones of the tests).


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of the token lists ``a`` and ``b``."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _tail_start(ids: list[int], tokenizer, window: int, protect: int) -> int:
    """Where the re-encoded tail of ``ids`` starts: ``window`` tokens from the end (never before
    ``protect``), moved earlier while the tail's text opens inside a character (a byte-level token
    that continues a UTF-8 sequence decodes to U+FFFD)."""
    start = max(protect, len(ids) - window)
    while start > protect and _decode(tokenizer, ids[start:start + 1]).startswith("\ufffd"):
        start -= 1
    return start


@dataclass(frozen=True)
class Tail:
    """The part of a token list that is re-encoded with new text: ``ids[start:]`` and its text."""

    start: int             # where the tail starts in the token list
    ids: tuple[int, ...]   # ids[start:]
    text: str              # decode(ids[start:])


def tail_of(ids: list[int], tokenizer, window: int = 16, protect: int = 0) -> Tail:
    """The :class:`Tail` of ``ids`` that :func:`continuation` and :func:`appended_text` re-encode (the
    last ``window`` tokens, moved earlier off a split character, never before ``protect``). A caller
    that re-encodes several texts after the same ``ids`` computes it once and passes it as ``tail``."""
    start = _tail_start(ids, tokenizer, window, protect)
    return Tail(start, tuple(ids[start:]), _decode(tokenizer, ids[start:]))


def retokenize(ids: list[int], new_text: str, tokenizer, *, window: int = 16, protect: int = 0) -> list[int]:
    """``ids`` followed by ``new_text``, with the last ``window`` tokens and ``new_text`` encoded together:
    ``ids[:s] + encode(decode(ids[s:]) + new_text)``, ``s = len(ids) - window`` (at least ``protect``, the
    leading special tokens). The boundary is re-tokenised as the tokenizer would (a merge across it
    happens), at a cost of ``O(window + len(new_text))`` per call instead of re-encoding the whole text."""
    if window < 1:
        raise ValueError(f"window: must be >= 1, got {window}")
    s = _tail_start(ids, tokenizer, window, protect)
    return ids[:s] + _encode(tokenizer, _decode(tokenizer, ids[s:]) + new_text)


def continuation(committed: list[int], new_text: str, tokenizer, *, window: int = 16,
                 tail: Tail | None = None) -> list[int]:
    """Target tokens ``x`` that continue the committed tokens with ``new_text`` (``committed + x`` is what
    the target would verify): the re-encoding of the committed tail and ``new_text`` together, aligned
    against the committed tokens.

    - the re-encoding starts with the committed tail (the usual case): ``x`` is what follows it;
    - it segments the committed text differently (``committed = [a, b]``, re-encoded ``[ab, ...]``)
      but one of its token boundaries falls at the end of the committed text: ``x`` is what follows
      that boundary;
    - a re-encoded token straddles the end of the committed text (``committed = [a]``, the draft
      wrote ``b``, re-encoded ``[ab]``): the committed tokens cannot be undone, so ``x = encode(new_text)``.

    Any ``x`` is lossless under :func:`spade_lib.verify.verify`'s ``one_hot_q`` rule (see
    :class:`TextDrafter`); the alignment only decides how often the proposal is accepted. ``tail``:
    ``tail_of(committed, tokenizer, window)`` when the caller holds it (computed here otherwise).
    """
    tail = tail if tail is not None else tail_of(committed, tokenizer, window)
    tail_text, tail = tail.text, list(tail.ids)
    t = _encode(tokenizer, tail_text + new_text)
    if t[:len(tail)] == tail:
        return t[len(tail):]
    for j in range(common_prefix(t, tail) + 1, len(t) + 1):
        text = _decode(tokenizer, t[:j])
        if len(text) >= len(tail_text):
            if text == tail_text:
                return t[j:]
            break
    return _encode(tokenizer, new_text)


def text_proposal(committed: list[int], new_text: str, tokenizer, max_gamma: int, *, window: int = 16,
                  hold_last: bool = True, ended: bool = False, eos: int | None = None,
                  tail: Tail | None = None) -> list[int]:
    """The block a string-level drafter proposes after ``committed`` when the draft wrote ``new_text``:
    :func:`continuation`, then the target's ``eos`` if the draft ``ended`` (wrote its EOS), else without
    its last token when ``hold_last`` (text still to come could merge into it), cut to ``max_gamma``."""
    x = continuation(committed, new_text, tokenizer, window=window, tail=tail)
    if ended:
        x = x + ([] if eos is None else [int(eos)])
    elif hold_last:
        x = x[:-1]
    return x[:max_gamma]


def appended_text(committed: list[int], added: list[int], tokenizer, *, window: int = 16,
                  tail: Tail | None = None) -> str:
    """The text ``added`` tokens append to ``committed`` ones: decoded after the committed tail, so a
    character whose bytes span the boundary is decoded whole (``tail``: as in :func:`continuation`)."""
    tail = tail if tail is not None else tail_of(committed, tokenizer, window)
    before, after = tail.text, _decode(tokenizer, list(tail.ids) + list(added))
    return after[len(before):] if after.startswith(before) else _decode(tokenizer, added)


@dataclass
class DraftStepCosts:
    """A cross-vocabulary drafter's own account of one step: its ``propose`` and the ``accept`` after it
    (``StepInfo.draft_costs`` holds it as a dict). Seconds are host wall clock (:func:`spade_lib.devices.clock`);
    a draw reads its token to the host, so a forward's time is in ``t_forward`` on any device.

    Per drafted target token the draft costs ``(t_forward + t_text) / gamma`` seconds: over the target's
    one-token forward that is the cost model's ``c`` of a cross-vocabulary draft (the one-token forward of
    the draft model alone, which ``spade_lib.runs.costs`` times, leaves out ``t_text`` and that a text
    drafter's ``draft_tokens`` need not equal ``gamma``)."""

    draft_tokens: int = 0     # tokens the draft model drew (its EOS included); a text drafter's may differ from gamma
    forwards: int = 0         # draft-model forwards (one per drawn token; SLRS: one per path it enumerates)
    fed: int = 0              # tokens fed through them (more than forwards where the draft's cache was re-synced)
    t_forward: float = 0.0    # seconds drafting outside the text work: the draft's forwards and draws
    t_text: float = 0.0       # seconds of text work: decoding, re-encoding, aligning (propose and accept)
    encode_calls: int = 0     # tokenizer encode calls, both tokenizers
    decode_calls: int = 0     # tokenizer decode calls, both tokenizers

    @property
    def tokenizer_calls(self) -> int:
        return self.encode_calls + self.decode_calls


class _CountingTokenizer:
    """``encode`` / ``decode`` of ``tokenizer``, counted into its drafter's current :class:`DraftStepCosts`."""

    def __init__(self, tokenizer, drafter: "TextSyncDrafter"):
        self.tokenizer, self.drafter = tokenizer, drafter

    def encode(self, text, add_special_tokens=False):
        self.drafter._costs.encode_calls += 1
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids, skip_special_tokens=True):
        self.drafter._costs.decode_calls += 1
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@dataclass(frozen=True)
class TextDraftConfig:
    """How :class:`TextDrafter` drafts (defaults: greedy, SLEM's setting)."""

    temperature: float = 0.0            # the draft's own sampling temperature (0: argmax); its own generator
    max_draft_tokens: int | None = None  # draft tokens per proposal (None: 2 * max_gamma + 2)
    window: int = 16                    # tokens of committed tail re-encoded with the new text, on both sides
    hold_last: bool = True              # withhold the re-encoding's last target token unless the draft ended
                                        # (more text could still merge into it)

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        if self.max_draft_tokens is not None and self.max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens: must be >= 1 or None, got {self.max_draft_tokens}")
        if self.window < 1:
            raise ValueError(f"window: must be >= 1, got {self.window}")


class TextSyncDrafter(Drafter):
    """What both cross-vocabulary drafters share: the committed text, held as tokens of both tokenizers.

    The drafter keeps the committed target tokens ``C`` and the draft's own tokens ``D`` of the same
    text (``D`` re-tokenised at each commit by :func:`retokenize`, so a merge across the boundary
    happens as the draft's tokenizer would make it; the draft's KV cache is rolled back to the longest
    common prefix of what it holds, ``_fed``, and the new ``D``: :meth:`_sync_cache`). A subclass's
    ``propose`` drafts after ``D`` and sets ``_proposed`` (the target ids it proposed); ``accept(n, t)``
    commits ``x_<n`` and ``t``: ``C`` gains them, ``D`` the text they append (:func:`appended_text`).

    The two sides meet as text (``decode(..., skip_special_tokens=True)``): bytes the target emits that
    are not valid UTF-8 reach the draft as U+FFFD, and special tokens not at all. That can only lower
    acceptance, never change the output (whatever ``D`` is, the verifier is told the law the proposal
    was drawn from). ``config``: an instance of the subclass's ``config_type`` (a dataclass with a
    ``window``).

    Each step's costs (:class:`DraftStepCosts`) accumulate in ``_costs`` through ``propose`` (the
    subclass times its forwards with :meth:`_forward` and its text work inside :meth:`_text_work`) and
    ``accept``, which closes the step: :meth:`step_costs` then returns it. The text work goes through
    ``_dtok`` / ``_ttok``, the two tokenizers with their calls counted.
    """

    config_type: type = object  # the config dataclass the subclass takes

    def drafting_model(self) -> CausalLMAdapter:
        """Its draft model's adapter: what a drafting step runs (its one-token forward; the text sync on top
        is in :meth:`step_costs`, not in the cost model's ``c``)."""
        return self.adapter

    def __init__(self, model, draft_tokenizer, target_tokenizer, config, *, max_length: int | None = None):
        if not isinstance(config, self.config_type):
            raise ValueError(f"config: expected a {self.config_type.__name__}, got {type(config).__name__}")
        for name, tok in (("draft_tokenizer", draft_tokenizer), ("target_tokenizer", target_tokenizer)):
            if not (callable(getattr(tok, "encode", None)) and callable(getattr(tok, "decode", None))):
                raise ValueError(f"{name}: expected a tokenizer with encode and decode, got {type(tok).__name__}")
        self.adapter = model if isinstance(model, CausalLMAdapter) else CausalLMAdapter(model, max_length=max_length)
        self.draft_tokenizer, self.target_tokenizer, self.config = draft_tokenizer, target_tokenizer, config
        self._dtok, self._ttok = _CountingTokenizer(draft_tokenizer, self), _CountingTokenizer(target_tokenizer, self)
        self._costs, self._last = DraftStepCosts(), None  # this step's account so far; the last closed one
        self._ttail: Tail | None = None              # tail_of(C) while C is unchanged
        self.vocab_size = 0
        self._committed: list[int] | None = None  # C: the committed target tokens
        self._draft_ids: list[int] = []             # D: the draft's tokens of the same text
        self._protect = 0                            # D's leading special tokens (never re-tokenised)
        self._target_special = frozenset(getattr(target_tokenizer, "all_special_ids", None) or ())
        self._tprotect = 0                           # C's tokens up to its last special token (never re-encoded)
        self._fed: list[int] = []                    # the tokens in the draft's KV cache
        self._proposed: list[int] = []

    def reset(self, prompt_ids: torch.Tensor, vocab_size: int) -> None:
        ids = as_token_tensor(prompt_ids, "cpu").tolist()
        if not ids:
            raise ValueError("prompt_ids: empty prompt")
        self.vocab_size = vocab_size
        self._committed = ids
        self._tprotect = self._after_special(ids, 0)
        text = _decode(self.target_tokenizer, ids)
        full = list(self.draft_tokenizer.encode(text, add_special_tokens=True))
        plain = _encode(self.draft_tokenizer, text)
        self._protect = len(full) - len(plain) if full[len(full) - len(plain):] == plain else 0
        self._draft_ids = full
        self.adapter.reset()
        self._fed = []
        self._proposed = []
        self._costs, self._last, self._ttail = DraftStepCosts(), None, None

    @contextmanager
    def _text_work(self):
        """Time the block inside as text work (``t_text``)."""
        t0 = clock()
        try:
            yield
        finally:
            self._costs.t_text += clock() - t0

    def _after_special(self, ids: list[int], offset: int) -> int:
        """``offset`` + 1 + the index of the last special token of the target's in ``ids`` (``offset``: none)."""
        for i in range(len(ids) - 1, -1, -1):
            if ids[i] in self._target_special:
                return offset + i + 1
        return offset

    def _target_tail(self) -> Tail:
        """``tail_of(C)`` with the target's tokenizer, decoded once per committed ``C``, never reaching back
        over a special token (a chat template's ``<|im_start|>``: decoded to nothing, it cannot be re-encoded,
        so a tail holding one never re-encodes to itself and every alignment took the slow path)."""
        if self._ttail is None:
            self._ttail = tail_of(self._committed, self._ttok, self.config.window, self._tprotect)
        return self._ttail

    def _forward(self, feed: list[int]) -> torch.Tensor:
        """The draft's logits ``[Vd]`` after feeding ``feed`` (counted in this step's costs)."""
        a = self.adapter
        logits = a.extend(torch.tensor(feed, dtype=torch.long, device=a.device), last_only=True)[0]
        self._fed += feed
        self._costs.forwards += 1
        self._costs.fed += len(feed)
        return logits

    def step_costs(self) -> dict[str, float] | None:
        """The last closed step's :class:`DraftStepCosts` as a dict (``None`` before the first ``accept``)."""
        return None if self._last is None else asdict(self._last)

    def _sync_cache(self) -> list[int]:
        """Roll the draft's cache back to what it shares with ``D``; return the tokens still to feed
        (at least one, so that the next extend yields the logits after ``D``)."""
        keep = min(common_prefix(self._fed, self._draft_ids), len(self._draft_ids) - 1)
        self.adapter.rollback(keep)
        self._fed = self._fed[:keep]
        return self._draft_ids[keep:]

    def accept(self, n_accepted: int, next_token: int) -> None:
        added = self._proposed[:n_accepted] + [int(next_token)]
        cfg = self.config
        with self._text_work():
            new_text = appended_text(self._committed, added, self._ttok, window=cfg.window, tail=self._target_tail())
            self._tprotect = self._after_special(added, len(self._committed)) if any(
                t in self._target_special for t in added) else self._tprotect
            self._committed = self._committed + added
            self._ttail = None
            self._draft_ids = retokenize(self._draft_ids, new_text, self._dtok, window=cfg.window,
                                         protect=self._protect)
        self._proposed = []
        self._last, self._costs = self._costs, DraftStepCosts()


class TextDrafter(TextSyncDrafter):
    """A draft causal LM with its own tokenizer, drafting for a target with another: string-level
    drafting (Timor et al. 2025's SLEM; HF's ``AssistedCandidateGeneratorDifferentTokenizers``).

    The committed text is held on both sides as :class:`TextSyncDrafter` does. ``propose``: the draft
    extends ``D`` by up to ``max_draft_tokens`` tokens (argmax, or sampled at ``temperature`` from the
    draft stream the decoder passes, never the verifier's), the new text is re-encoded with the target's
    tokenizer against ``C`` (:func:`continuation`: a draft token may split into several target tokens,
    several draft tokens may merge into one, the committed boundary may be segmented differently), and
    the first ``<= max_gamma`` target tokens ``x`` are proposed with ``q_i = one_hot(x_i)``.

    **Lossless for any proposal.** ``x`` is a function of the committed text and of randomness
    independent of the verifier's uniforms, so conditionally on it the ``one_hot_q`` rule accepts
    ``x_i`` with probability ``p(x_i)`` and otherwise draws from ``(p - p(x_i) delta_{x_i})^+``
    normalised, ``p`` with ``x_i`` removed:
    ``P(y) = p(x_i) 1[y = x_i] + (1 - p(x_i)) p(y) 1[y != x_i] / (1 - p(x_i)) = p(y)``.
    The same holds position by position along the block and averages over the law of ``x``, so the
    emitted text has the target's law whatever the two tokenizers (``tests/test_crossvocab.py``: fp64
    enumeration through :func:`spade_lib.verify.verify` on vocabularies with splits and merges, and a
    chi-square test of :class:`~spade_lib.decoding.decode.SpeculativeDecoder` on two tokenizers).
    Greedy (``temperature == 0`` of the *target*): the greedy rule emits the target's argmax chain.
    What the draft's ``q`` over *its* tokens cannot be is the ``q`` of the exact rule over target
    tokens: mapped naively it is lossy (:func:`naive_emitted_law`; the tests).

    Cost per step: one draft forward and two tokenizer calls (of about ``window`` tokens) per draft
    token drawn, and a few calls per step (the committed tails, the commit's re-tokenisation):
    :class:`DraftStepCosts`.
    """

    kind = DrafterKind(q=False, vocabulary="other", head=False, model=True, shapes=("chain",))  # one-hot q
    config_type = TextDraftConfig

    def __init__(self, model, draft_tokenizer, target_tokenizer, config: TextDraftConfig = TextDraftConfig(), *,
                 max_length: int | None = None):
        super().__init__(model, draft_tokenizer, target_tokenizer, config, max_length=max_length)
        eos = getattr(draft_tokenizer, "eos_token_id", None)
        self._draft_eos = frozenset(() if eos is None else ([eos] if isinstance(eos, int) else eos))
        self._target_eos = getattr(target_tokenizer, "eos_token_id", None)

    @torch.inference_mode()
    def propose(self, max_gamma: int, policy: Policy, sampling: SamplingConfig,
                generator: torch.Generator | None) -> DraftTree:
        if self._committed is None:
            raise ValueError("propose: call reset(prompt_ids, vocab_size) first")
        cfg, a, costs = self.config, self.adapter, self._costs
        t0, text0 = clock(), costs.t_text
        proposal: list[int] = []
        if self._draft_ids:
            feed = self._sync_cache()
            base = list(self._draft_ids)
            n_draft = cfg.max_draft_tokens or 2 * max_gamma + 2
            if a.max_length is not None:
                n_draft = min(n_draft, a.max_length - len(base) + 1)
            drawn: list[int] = []
            with self._text_work():  # the committed tails on both sides, once per step
                d_tail, t_tail = tail_of(base, self._dtok, cfg.window), self._target_tail()
            for _ in range(max(n_draft, 0)):
                logits = self._forward(feed)
                if cfg.temperature == 0:
                    d = int(logits.argmax())
                else:  # the draft stream (independent of the verifier's uniforms)
                    d = int(sample_categorical(torch.softmax(logits.double() / cfg.temperature, -1)[None],
                                               generator)[0])
                costs.draft_tokens += 1
                ended = d in self._draft_eos
                if not ended:
                    drawn.append(d)
                    feed = [d]
                with self._text_work():
                    new_text = appended_text(base, drawn, self._dtok, window=cfg.window, tail=d_tail)
                    proposal = text_proposal(self._committed, new_text, self._ttok, max_gamma,
                                             window=cfg.window, hold_last=cfg.hold_last, ended=ended,
                                             eos=self._target_eos, tail=t_tail)
                if ended or len(proposal) >= max_gamma:
                    break
        tree = one_hot_proposal(proposal, max_gamma, policy, self.vocab_size, a.device)
        self._proposed = proposal[:len(tree.tokens)]
        costs.t_forward += clock() - t0 - (costs.t_text - text0)
        return tree


# ------------------------------------------------------------------------------------------------
# token-level drafting over the vocabulary intersection (TLI)


def token_strings(tokenizer) -> dict[str, int]:
    """The text each token decodes to on its own, ``{string: id}``, one-to-one.

    Kept: ids that are not special tokens (``all_special_ids``) and decode
    (``decode([i], skip_special_tokens=True)``) to non-empty valid text (no U+FFFD: a byte-level token
    holding part of a UTF-8 character is not a string). A string that several ids decode to (Gemma's
    byte-fallback ``<0x0A>`` and its ``"\\n"``) keeps the id the tokenizer encodes the string to on its
    own, ``encode(s) == [i]``, and is dropped when no single one is that id. The map must be one-to-one
    so that a law over the draft's strings pushed to target ids is a law (:func:`tli_distribution`).
    ``tokenizer``: ``get_vocab()``, ``encode``, ``decode`` (a Hugging Face tokenizer)."""
    if not callable(getattr(tokenizer, "get_vocab", None)):
        raise ValueError(f"tokenizer: expected a tokenizer with get_vocab, got {type(tokenizer).__name__}")
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    ids_of: dict[str, list[int]] = {}
    for i in sorted(set(tokenizer.get_vocab().values())):
        if i in special:
            continue
        s = _decode(tokenizer, [i])
        if s and "\ufffd" not in s:
            ids_of.setdefault(s, []).append(i)
    out = {}
    for s, ids in ids_of.items():
        if len(ids) > 1:
            ids = [i for i in ids if _encode(tokenizer, s) == [i]]
        if len(ids) == 1:
            out[s] = ids[0]
    return out


def vocab_intersection(draft_tokenizer, target_tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft ids, target ids) of the strings that are one token of both tokenizers
    (:func:`intersection_map` of the two :func:`token_strings`), in the same order: ``draft_ids[k]`` and
    ``target_ids[k]`` decode to the same text."""
    try:
        return intersection_map(token_strings(draft_tokenizer), token_strings(target_tokenizer))
    except ValueError as e:
        raise ValueError(f"draft_tokenizer: with target_tokenizer, {e}") from None


def tli_q(logits: torch.Tensor, sampling: SamplingConfig, draft_ids: torch.Tensor, target_ids: torch.Tensor,
          vocab_size: int) -> torch.Tensor | None:
    """The law TLI proposes the next target token from, after the draft's ``logits [Vd]``: ``q_I [V]``.

    ``q = adjust(logits, sampling)`` (temperature, top-k, top-p: warped as the target is), restricted to
    the intersection and renormalised over target ids (:func:`tli_distribution`); greedy
    (``sampling.greedy``): one-hot at the target id of the argmax of the draft's logits on the
    intersection. ``None`` when ``q`` has no mass on the intersection (top-k / top-p kept none of it):
    nothing is proposed there. In the logits' precision, at least fp32 (fp64 logits: an fp64 ``q``)."""
    if sampling.greedy:
        q = torch.zeros(vocab_size, dtype=torch.float32, device=logits.device)
        q[target_ids[logits[draft_ids].argmax()]] = 1.0
        return q
    q = adjust(logits, sampling, torch.promote_types(logits.dtype, torch.float32), validate=False)
    if not float(q[draft_ids].sum()) > 0:
        return None
    return tli_distribution(q, draft_ids, target_ids, vocab_size)


@dataclass(frozen=True)
class TLIConfig:
    """How :class:`TLIDrafter` keeps the text in sync (its sampling is the decoder's ``SamplingConfig``)."""

    window: int = 16         # tokens of committed tail re-encoded with the new text, on both sides
    stop_at_eos: bool = True  # end the block where the draft's likeliest next token is its EOS (its text ends)

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"window: must be >= 1, got {self.window}")


class TLIDrafter(TextSyncDrafter):
    """Token-level intersection (Timor et al. 2025's TLI; HF's ``UniversalSpeculativeDecodingGenerator``):
    a draft with its own tokenizer proposes, token by token, only strings that are one token of both.

    ``I`` (:func:`vocab_intersection`) pairs draft id ``d_k`` with target id ``t_k`` of the same text.
    The committed text is held on both sides as :class:`TextSyncDrafter` does. ``propose``: at drafted
    position ``i`` the draft's logits after ``D`` and ``d(x_0) .. d(x_{i-1})`` give
    ``q_I = tli_q(logits, sampling)`` over target ids (the decoder's sampling config applied to the
    draft's logits, then restricted to ``I`` and renormalised); ``x_i ~ q_I`` from the *draft's*
    generator (argmax on ``I`` when greedy), and the draft consumes its own id ``d(x_i)`` of that
    string. The block stops at ``max_gamma``, when the policy says so, or when ``q`` has no mass on
    ``I`` (an empty block is a plain target step). The chain is returned with ``q_i = q_I`` over the
    *target* vocabulary, for the standard (``exact``) rule.

    **Why it is exact.** ``q_I`` at position ``i`` is a function of the committed tokens and ``x_<i``
    only (the draft's state is ``D`` plus the ids of ``x_<i``), and ``x_i`` is drawn from it with
    randomness independent of the verifier's uniforms: ``q_I`` *is* the conditional law of the proposed
    target token given the prefix, a distribution over target ids (the map ``d_k -> t_k`` is one-to-one).
    Leviathan et al.'s Theorem 1 then applies position by position: accepting with
    ``min(1, p(x)/q_I(x))`` and otherwise drawing from ``norm(max(p - q_I, 0))`` emits ``y`` with
    probability ``p(y)``. (Proved on synthetic vocabularies by fp64 enumeration through
    :func:`spade_lib.verify.verify` and by a chi-square test of the real decoder, in
    ``tests/test_crossvocab.py``, beside a naive variant shown lossy.) Greedy: the greedy rule emits the
    target's argmax chain whatever is proposed.

    **What it gives up.** A token outside ``I`` is never proposed (the target's ``" the"`` is, its
    ``"ing the"`` merge is not; the draft's mass there is dropped by the renormalisation), so the
    target emits those only through a rejection or a bonus token, and acceptance is at most
    ``sum_{x in I} min(p(x), q_I(x))``. Special tokens (EOS included) are outside ``I``: where the draft
    would end its text (its logits' argmax is one of its EOS ids; ``stop_at_eos``) the block ends there
    (``"no_match"``) instead of proposing the intersection's best string after the draft's end. The
    target still writes its own EOS, as the residual or bonus token (``q_I`` puts no mass on it, so
    ``max(p - q_I, 0)`` keeps all of ``p(EOS)``). Ending the block is decided by the draft's logits
    alone, independent of the verifier's uniforms, so it changes only where blocks end, never the law.
    Cost per drafted token: one draft forward, a gather over ``|I|`` and one inverse-CDF draw; per
    step the re-sync of :class:`TextSyncDrafter` (encode/decode of ``window`` tokens).
    """

    kind = DrafterKind(q=True, vocabulary="other", head=False, model=True, shapes=("chain",))
    config_type = TLIConfig

    def __init__(self, model, draft_tokenizer, target_tokenizer, config: TLIConfig = TLIConfig(), *,
                 max_length: int | None = None):
        super().__init__(model, draft_tokenizer, target_tokenizer, config, max_length=max_length)
        draft_ids, target_ids = vocab_intersection(draft_tokenizer, target_tokenizer)
        vd = self.adapter.vocab_size
        if int(draft_ids.max()) >= vd:
            raise ValueError(f"draft_tokenizer: id {int(draft_ids.max())} is beyond the draft model's {vd} logits")
        dev = self.adapter.device
        self.draft_ids, self.target_ids = draft_ids.to(dev), target_ids.to(dev)  # [|I|] each, d_k <-> t_k
        self._draft_list, self._target_list = draft_ids.tolist(), target_ids.tolist()
        eos = getattr(draft_tokenizer, "eos_token_id", None)
        self._draft_eos = frozenset(() if eos is None else ([eos] if isinstance(eos, int) else eos))

    def reset(self, prompt_ids: torch.Tensor, vocab_size: int) -> None:
        if max(self._target_list) >= vocab_size:
            raise ValueError(f"vocab_size: {vocab_size}, but target_tokenizer has id {max(self._target_list)} "
                             "in the intersection")
        super().reset(prompt_ids, vocab_size)

    def _draw(self, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None
              ) -> tuple[int, int, torch.Tensor] | None:
        """One drafted position from the draft's ``logits [Vd]``: (target id proposed, draft id the draft
        consumes, ``q [V]`` the verifier is told), or ``None`` to end the block here."""
        q = tli_q(logits, sampling, self.draft_ids, self.target_ids, self.vocab_size)
        if q is None:
            return None
        w = q[self.target_ids]  # [|I|]: q_I over the intersection's strings
        k = int(w.argmax()) if sampling.greedy else int(sample_categorical(w[None], generator)[0])
        return self._target_list[k], self._draft_list[k], q

    @torch.inference_mode()
    def propose(self, max_gamma: int, policy: Policy, sampling: SamplingConfig,
                generator: torch.Generator | None) -> DraftTree:
        if self._committed is None:
            raise ValueError("propose: call reset(prompt_ids, vocab_size) first")
        a, costs = self.adapter, self._costs
        t0 = clock()
        n, stop = max_gamma, "max_gamma"
        if not self._draft_ids:
            n, stop = 0, "no_match"
        elif a.max_length is not None and a.max_length - len(self._draft_ids) + 1 < n:
            n, stop = max(a.max_length - len(self._draft_ids) + 1, 0), "budget"  # the draft's context is full
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        feed = self._sync_cache() if n > 0 else []
        for i in range(n):
            logits = self._forward(feed)  # [Vd]
            if self.config.stop_at_eos and self._draft_eos and int(logits.argmax()) in self._draft_eos:
                stop = "no_match"  # the draft would end its text here: nothing of I after it
                break
            drawn = self._draw(logits, sampling, generator)
            if drawn is None:  # no mass on the intersection: the block ends here
                stop = "no_match"
                break
            costs.draft_tokens += 1
            x, d, q = drawn
            tokens.append(x)
            qs.append(q)
            feed = [d]
            if i + 1 < n and policy.needs_signals and not policy.keep_drafting(*_signals(logits[self.draft_ids])):
                stop = "policy"
                break
        self._proposed = tokens
        costs.t_forward += clock() - t0  # TLI's propose does no text work
        if not tokens:
            return DraftTree(torch.empty(0, dtype=torch.long, device=a.device),
                             torch.zeros(0, self.vocab_size, device=a.device), None, stop)
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=a.device), torch.stack(qs), None, stop)


# ------------------------------------------------------------------------------------------------
# string-level rejection sampling (SLRS): the draft's law of the next target token, over all its paths

STOP = -2   # a path whose text holds no target token (the draft's text ended first): the block ends there
INNER = -1  # a path whose text is still a proper prefix of a target token: the draft writes on


def draft_strings(tokenizer, vocab_size: int) -> tuple[str | None, ...]:
    """The text of each of the draft's ``vocab_size`` ids on its own, ``None`` where an id is not text
    (a special token, an id the tokenizer does not have, one that decodes to nothing or to U+FFFD: part
    of a character). Unlike :func:`token_strings` several ids may share a string: each is a path of its own.
    ``tokenizer``: ``get_vocab()``, ``decode`` (a Hugging Face tokenizer)."""
    if not callable(getattr(tokenizer, "get_vocab", None)):
        raise ValueError(f"tokenizer: expected a tokenizer with get_vocab, got {type(tokenizer).__name__}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size: must be an int >= 1, got {vocab_size!r}")
    ids = set(tokenizer.get_vocab().values()) - set(getattr(tokenizer, "all_special_ids", None) or ())
    out = []
    for i in range(vocab_size):
        s = _decode(tokenizer, [i]) if i in ids else ""
        out.append(s if s and "\ufffd" not in s else None)
    return tuple(out)


class DraftPaths:
    """What SLRS enumerates, from the two tokenizers alone: the draft-token paths whose text is a proper
    prefix of a target token (*inner nodes*, each one draft forward), and where every other path ends.

    ``draft_strings[d]``: the text of draft id ``d`` or ``None`` (:func:`draft_strings`);
    ``target_strings``: ``{text: target id}`` of the tokens that may be proposed (:func:`token_strings`).
    A path's text ``s`` is a prefix of the draft's continuation ``S``; the proposal is
    ``lambda(S)``, the longest target token that is a prefix of ``S``. It is decided once ``s`` is no
    proper prefix of a target token (every target prefix of ``S`` is then one of ``s``), or when the draft
    draws an id that is not text (its text ends: ``S = s``); ``STOP`` when no target token is a prefix.

    ``n_nodes`` (inner nodes: the draft forwards of one drafted target token when every path has mass) is
    ``sum_s N(s)`` over the proper prefixes ``s`` of target tokens, ``N(s)`` the number of draft-id
    sequences spelling ``s``: exponential in the target tokens' lengths where the draft has short tokens
    (``"        "``, 8 spaces, over draft tokens of 1, 2 and 4 spaces has 56 spellings of its prefixes).
    ``depth``: the most draft tokens on an inner path. More than ``max_nodes`` is refused (``ValueError``).
    """

    def __init__(self, draft_strings: tuple[str | None, ...] | list[str | None], target_strings: dict[str, int], *,
                 max_nodes: int = 4096):
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
            raise ValueError(f"max_nodes: must be an int >= 1, got {max_nodes!r}")
        if not target_strings or any(not s for s in target_strings):
            raise ValueError("target_strings: need a non-empty {text: id} with non-empty texts")
        if not any(draft_strings):
            raise ValueError("draft_strings: no draft id is text")
        self.draft_strings = tuple(draft_strings)
        self.target_strings = dict(target_strings)
        self.longest = max(map(len, self.target_strings))
        self.prefixes = {t[:i] for t in self.target_strings for i in range(len(t))}  # P: proper prefixes, "" included
        spell: dict[str, int] = {}
        for s in self.draft_strings:
            if s is not None:
                spell[s] = spell.get(s, 0) + 1
        longest_draft = max(map(len, spell))
        n_paths, depth = {"": 1}, {"": 0}  # N(s), and the most draft tokens spelling s
        for s in sorted(self.prefixes, key=len)[1:]:
            parts = [(s[:-k], spell[s[-k:]]) for k in range(1, min(longest_draft, len(s)) + 1) if s[-k:] in spell]
            n_paths[s] = sum(n_paths[head] * m for head, m in parts)  # every prefix of s is in P too
            depth[s] = 1 + max((depth[head] for head, _ in parts if n_paths[head]), default=-1)
        self.n_nodes = sum(n_paths.values())
        self.depth = max(d for s, d in depth.items() if n_paths[s])
        if self.n_nodes > max_nodes:
            raise ValueError(f"max_nodes: SLRS enumerates {self.n_nodes} draft-token paths (one draft forward each, up "
                             f"to {self.depth} draft tokens deep) per drafted target token with these tokenizers, more "
                             f"than max_nodes={max_nodes}; the count is exponential in the target tokens' lengths: "
                             "raise max_nodes, or draft with rule='tli' or 'text'")
        self._slots: dict[str, tuple[torch.Tensor, list[tuple[int, str]]]] = {}

    def outcome(self, text: str) -> int:
        """``lambda``: the id of the longest target token that is a prefix of ``text``, else ``STOP``."""
        for k in range(min(len(text), self.longest), 0, -1):
            t = self.target_strings.get(text[:k])
            if t is not None:
                return t
        return STOP

    def slots(self, s: str) -> tuple[torch.Tensor, list[tuple[int, str]]]:
        """After an inner node of text ``s``: ``leaf [Vd]`` (long), the target id each draft id decides, ``STOP``,
        or ``INNER`` for the ids whose text keeps it a proper prefix, listed as ``(id, new text)``. Cached by text."""
        if s not in self._slots:
            leaf, inner = [], []
            for d, ds in enumerate(self.draft_strings):
                if ds is None:
                    leaf.append(self.outcome(s))  # the text ends at s
                elif s + ds in self.prefixes:
                    leaf.append(INNER)
                    inner.append((d, s + ds))
                else:
                    leaf.append(self.outcome(s + ds))
            self._slots[s] = (torch.tensor(leaf, dtype=torch.long), inner)
        return self._slots[s]


def slrs_law(paths: DraftPaths, next_law, vocab_size: int) -> tuple[torch.Tensor, dict[tuple[int, ...], torch.Tensor]]:
    """The law of the proposed target token ``lambda(S)`` (:class:`DraftPaths`), summed over every draft path.

    ``next_law(path) -> [Vd]``: the draft's (adjusted) distribution of its next id after the committed
    context and ``path`` (a tuple of draft ids); called parent before children, depth first, once per inner
    node with mass (a zero-mass subtree is skipped: greedy walks one path). Each row is renormalised in fp64.
    Returns ``q [vocab_size + 1]`` (fp64; ``q[vocab_size]`` is ``P(STOP)``; ``sum q = 1``) with

        q(t) = sum over inner nodes n (text s_n, mass pi_n = prod of the path's r) of
               pi_n * sum_{d : lambda(s_n + str(d)) = t, decided} r_n(d),

    and the rows ``{path: r_n}`` visited (what :func:`sample_string` walks)."""
    V = vocab_size
    q = torch.zeros(V + 1, dtype=torch.float64)
    laws: dict[tuple[int, ...], torch.Tensor] = {}
    stack: list[tuple[tuple[int, ...], str, float]] = [((), "", 1.0)]
    while stack:
        path, s, w = stack.pop()
        r = next_law(path).detach().to("cpu", torch.float64)
        r = r / r.sum()
        laws[path] = r
        leaf, inner = paths.slots(s)
        if int(leaf.max()) >= V:
            raise ValueError(f"vocab_size: {V}, but a target id {int(leaf.max())} may be proposed")
        done = leaf != INNER
        q.index_add_(0, torch.where(leaf[done] == STOP, V, leaf[done]), w * r[done])
        for d, u in reversed(inner):  # pushed reversed: visited in id order
            if r[d] > 0:
                stack.append((path + (d,), u, w * float(r[d])))
    return q, laws


def sample_string(paths: DraftPaths, laws: dict[tuple[int, ...], torch.Tensor], generator: torch.Generator | None,
                  greedy: bool = False) -> tuple[int, int]:
    """The draft writes its string: ids from the rows of :func:`slrs_law` (inverse CDF from ``generator``; the
    argmax when ``greedy``) until one decides the target token. Returns ``(target id or STOP, ids drawn)``:
    its law is :func:`slrs_law`'s ``q`` (the same rows, the same map)."""
    path, s = (), ""
    while True:
        r = laws[path]
        d = int(r.argmax()) if greedy else int(sample_categorical(r[None], generator)[0])
        leaf, _ = paths.slots(s)
        slot = int(leaf[d])
        if slot != INNER:
            return slot, len(path) + 1
        path, s = path + (d,), s + paths.draft_strings[d]


@dataclass(frozen=True)
class SLRSConfig:
    """How :class:`SLRSDrafter` drafts (its sampling is the decoder's ``SamplingConfig``)."""

    window: int = 16        # tokens of committed tail re-encoded with the new text, on both sides
    max_nodes: int = 4096   # the most draft-token paths (each a draft forward) per drafted target token; more: refused

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"window: must be >= 1, got {self.window}")
        if isinstance(self.max_nodes, bool) or not isinstance(self.max_nodes, int) or self.max_nodes < 1:
            raise ValueError(f"max_nodes: must be an int >= 1, got {self.max_nodes!r}")


class SLRSDrafter(TextSyncDrafter):
    """String-level rejection sampling (module docstring): the draft writes a string, the proposal is the
    longest target token it starts with, and the verifier is told that token's exact law over target ids,
    summed over every draft-token path (:func:`slrs_law`), for the standard (``exact``) rule.

    The committed text is held on both sides as :class:`TextSyncDrafter` does. ``propose``: at drafted
    position ``i`` the draft's context is ``D_i``, the draft's tokens of the committed text and of
    ``x_<i``'s text (re-encoded against ``D``'s tail, :func:`tail_of`); the draft's rows ``r = adjust(logits,
    sampling)`` are computed at every inner node of :class:`DraftPaths` with mass (one forward each, depth
    first, the draft's cache rolled back between siblings); ``x_i ~ q_i`` is drawn by :func:`sample_string`
    (the draft's own generator) and proposed with ``q_i = q[:V] / (1 - q[STOP])``. A ``STOP`` draw ends the
    block (``"no_match"``), as do ``max_gamma``, the policy and the draft's context limit (``"budget"``).
    Greedy: the rows are one-hot, one path is walked (at most ``depth + 1`` forwards a position).
    """

    kind = DrafterKind(q=True, vocabulary="other", head=False, model=True, shapes=("chain",))
    config_type = SLRSConfig

    def __init__(self, model, draft_tokenizer, target_tokenizer, config: SLRSConfig = SLRSConfig(), *,
                 max_length: int | None = None):
        super().__init__(model, draft_tokenizer, target_tokenizer, config, max_length=max_length)
        targets = token_strings(target_tokenizer)
        try:
            self.paths = DraftPaths(draft_strings(draft_tokenizer, self.adapter.vocab_size), targets,
                                    max_nodes=config.max_nodes)
        except ValueError as e:
            raise ValueError(str(e).replace("draft_strings:", "draft_tokenizer:").replace(
                "target_strings:", "target_tokenizer:")) from None
        self._text_of = {i: s for s, i in targets.items()}  # target id -> its text

    def reset(self, prompt_ids: torch.Tensor, vocab_size: int) -> None:
        if max(self._text_of) >= vocab_size:
            raise ValueError(f"vocab_size: {vocab_size}, but target_tokenizer has text token {max(self._text_of)}")
        super().reset(prompt_ids, vocab_size)

    def _logits_after(self, ids: list[int]) -> torch.Tensor:
        """The draft's logits ``[Vd]`` after ``ids``: its cache rolled back to what it shares with them."""
        keep = min(common_prefix(self._fed, ids), len(ids) - 1)
        self.adapter.rollback(keep)
        self._fed = self._fed[:keep]
        return self._forward(ids[keep:])

    @torch.inference_mode()
    def propose(self, max_gamma: int, policy: Policy, sampling: SamplingConfig,
                generator: torch.Generator | None) -> DraftTree:
        if self._committed is None:
            raise ValueError("propose: call reset(prompt_ids, vocab_size) first")
        a, costs, paths, V = self.adapter, self._costs, self.paths, self.vocab_size
        t0, text0 = clock(), costs.t_text
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        stop, text = "max_gamma", ""
        dtype = torch.promote_types(a.dtype, torch.float32)  # q's precision: the draft's, at least fp32
        if not self._draft_ids:
            stop, max_gamma = "no_match", 0
        elif max_gamma > 1:
            with self._text_work():  # the draft's committed tail, once per step
                tail = tail_of(self._draft_ids, self._dtok, self.config.window, self._protect)

        def next_law(path: tuple[int, ...]) -> torch.Tensor:
            return adjust(self._logits_after(ctx + list(path)), sampling, dtype, validate=False)

        for i in range(max_gamma):
            if i == 0:
                ctx = list(self._draft_ids)
            else:
                with self._text_work():
                    ctx = self._draft_ids[:tail.start] + _encode(self._dtok, tail.text + text)
            if a.max_length is not None and len(ctx) + paths.depth > a.max_length:
                stop = "budget"  # the deepest path would not fit the draft's context
                break
            q, laws = slrs_law(paths, next_law, V)
            x, drawn = sample_string(paths, laws, generator, greedy=sampling.greedy)
            costs.draft_tokens += drawn
            if x == STOP:
                stop = "no_match"  # the draft's text ended before a target token: the block ends here
                break
            q = (q[:V] / q[:V].sum()).to(dtype)
            tokens.append(x)
            qs.append(q)
            text += self._text_of[x]
            if i + 1 < max_gamma and policy.needs_signals and not policy.keep_drafting(
                    float(q.max()), float(torch.special.entr(q).sum())):
                stop = "policy"
                break
        self._proposed = tokens
        costs.t_forward += clock() - t0 - (costs.t_text - text0)
        if not tokens:
            return DraftTree(torch.empty(0, dtype=torch.long, device=a.device),
                             torch.zeros(0, V, device=a.device), None, stop)
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=a.device), torch.stack(qs).to(a.device),
                         None, stop)


# the rules of a cross-vocabulary draft (drafters.make_drafter builds them by name: option ``rule``)
register_cross_vocab_rule("text", TextDraftConfig, TextDrafter)
register_cross_vocab_rule("tli", TLIConfig, TLIDrafter)
register_cross_vocab_rule("slrs", SLRSConfig, SLRSDrafter)
