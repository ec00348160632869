"""Speculative verification across vocabularies: token-level intersection (TLI).

Timor et al., "Lossless Speculative Decoding Algorithms for Heterogeneous Vocabularies" (ICML 2025,
arXiv 2502.05202). The draft has vocabulary ``V_q`` and the target ``V_p``; ``I`` is the set of strings that
are one token in both. TLI drafts from

    q_I(x) = q(x) / sum_{y in I} q(y)   for x in I,   0 elsewhere,

mapped to target ids, and verifies with the standard rule (accept with ``min(1, p(x)/q_I(x))``, else draw
from ``norm(max(p - q_I, 0))``). Since ``q_I`` is a distribution over target tokens, the emitted token has
law exactly ``p`` (Leviathan et al. 2023, Theorem 1). A careless implementation drafts from the full ``q``
and rejects with ``p(x)/q(x)`` over target ids reached by re-encoding; its output law is not ``p``
(``naive_emitted_law``; the test shows the gap).

String-level drafting (:class:`TextDrafter`, SLEM-style): the draft writes text with its own tokenizer,
the text is re-encoded with the target's (:func:`continuation`, aligned against the committed target
tokens) and proposed as a deterministic block, ``q = one_hot(x)``, verified by ``one_hot_q``: accept
``x`` with probability ``p(x)``, else draw from ``p`` with ``x`` removed, which emits ``y`` with
probability ``p(y)`` for *any* proposal whose randomness is independent of the verifier's.
:func:`spade_lib.exactness.proposal_law_error` proves a rule on a law of proposals by enumeration (fp64,
through :func:`spade_lib.verify.verify`).

Token-level drafting (:class:`TLIDrafter`, TLI): the intersection ``I`` is found by the text each token
decodes to on its own (:func:`token_strings`, :func:`vocab_intersection`; byte-level BPE's ``"Ġthe"`` and
sentencepiece's ``"▁the"`` both decode to ``" the"``), the draft samples from ``q_I`` (:func:`tli_q`, the
decoder's sampling config applied to the draft's logits first) and the block is verified by the standard
rule with ``q_I`` over target ids. Both drafters keep the committed text in sync with the draft the same
way (:class:`TextSyncDrafter`). Still to build: SLRS (string-level rejection sampling).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from spade_lib.decoding.adapter import CausalLMAdapter, as_token_tensor
from spade_lib.decoding.drafters import Drafter, _signals, one_hot_proposal, sample_categorical
from spade_lib.decoding.policies import Policy
from spade_lib.decoding.tree import DraftTree
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


def retokenize(ids: list[int], new_text: str, tokenizer, *, window: int = 16, protect: int = 0) -> list[int]:
    """``ids`` followed by ``new_text``, with the last ``window`` tokens and ``new_text`` encoded together:
    ``ids[:s] + encode(decode(ids[s:]) + new_text)``, ``s = len(ids) - window`` (at least ``protect``, the
    leading special tokens). The boundary is re-tokenised as the tokenizer would (a merge across it
    happens), at a cost of ``O(window + len(new_text))`` per call instead of re-encoding the whole text."""
    if window < 1:
        raise ValueError(f"window: must be >= 1, got {window}")
    s = _tail_start(ids, tokenizer, window, protect)
    return ids[:s] + _encode(tokenizer, _decode(tokenizer, ids[s:]) + new_text)


def continuation(committed: list[int], new_text: str, tokenizer, *, window: int = 16) -> list[int]:
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
    :class:`TextDrafter`); the alignment only decides how often the proposal is accepted.
    """
    s = _tail_start(committed, tokenizer, window, 0)
    tail = committed[s:]
    tail_text = _decode(tokenizer, tail)
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
                  hold_last: bool = True, ended: bool = False, eos: int | None = None) -> list[int]:
    """The block a string-level drafter proposes after ``committed`` when the draft wrote ``new_text``:
    :func:`continuation`, then the target's ``eos`` if the draft ``ended`` (wrote its EOS), else without
    its last token when ``hold_last`` (text still to come could merge into it), cut to ``max_gamma``."""
    x = continuation(committed, new_text, tokenizer, window=window)
    if ended:
        x = x + ([] if eos is None else [int(eos)])
    elif hold_last:
        x = x[:-1]
    return x[:max_gamma]


def appended_text(committed: list[int], added: list[int], tokenizer, *, window: int = 16) -> str:
    """The text ``added`` tokens append to ``committed`` ones: decoded after the committed tail, so a
    character whose bytes span the boundary is decoded whole."""
    tail = committed[_tail_start(committed, tokenizer, window, 0):]
    before, after = _decode(tokenizer, tail), _decode(tokenizer, tail + list(added))
    return after[len(before):] if after.startswith(before) else _decode(tokenizer, added)


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
    """

    config_type: type = object  # the config dataclass the subclass takes

    def __init__(self, model, draft_tokenizer, target_tokenizer, config, *, max_length: int | None = None):
        if not isinstance(config, self.config_type):
            raise ValueError(f"config: expected a {self.config_type.__name__}, got {type(config).__name__}")
        for name, tok in (("draft_tokenizer", draft_tokenizer), ("target_tokenizer", target_tokenizer)):
            if not (callable(getattr(tok, "encode", None)) and callable(getattr(tok, "decode", None))):
                raise ValueError(f"{name}: expected a tokenizer with encode and decode, got {type(tok).__name__}")
        self.adapter = model if isinstance(model, CausalLMAdapter) else CausalLMAdapter(model, max_length=max_length)
        self.draft_tokenizer, self.target_tokenizer, self.config = draft_tokenizer, target_tokenizer, config
        self.vocab_size = 0
        self._committed: list[int] | None = None  # C: the committed target tokens
        self._draft_ids: list[int] = []             # D: the draft's tokens of the same text
        self._protect = 0                            # D's leading special tokens (never re-tokenised)
        self._fed: list[int] = []                    # the tokens in the draft's KV cache
        self._proposed: list[int] = []

    def reset(self, prompt_ids: torch.Tensor, vocab_size: int) -> None:
        ids = as_token_tensor(prompt_ids, "cpu").tolist()
        if not ids:
            raise ValueError("prompt_ids: empty prompt")
        self.vocab_size = vocab_size
        self._committed = ids
        text = _decode(self.target_tokenizer, ids)
        full = list(self.draft_tokenizer.encode(text, add_special_tokens=True))
        plain = _encode(self.draft_tokenizer, text)
        self._protect = len(full) - len(plain) if full[len(full) - len(plain):] == plain else 0
        self._draft_ids = full
        self.adapter.reset()
        self._fed = []
        self._proposed = []

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
        new_text = appended_text(self._committed, added, self.target_tokenizer, window=cfg.window)
        self._committed = self._committed + added
        self._draft_ids = retokenize(self._draft_ids, new_text, self.draft_tokenizer, window=cfg.window,
                                     protect=self._protect)
        self._proposed = []


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

    Cost per step: a few encode/decode calls of ``window`` tokens per drafted token, and one draft
    forward per drafted token.
    """

    deterministic = True
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
        cfg, a = self.config, self.adapter
        proposal: list[int] = []
        if self._draft_ids:
            feed = self._sync_cache()
            base = list(self._draft_ids)
            n_draft = cfg.max_draft_tokens or 2 * max_gamma + 2
            if a.max_length is not None:
                n_draft = min(n_draft, a.max_length - len(base) + 1)
            drawn: list[int] = []
            for _ in range(max(n_draft, 0)):
                logits = a.extend(torch.tensor(feed, dtype=torch.long, device=a.device), last_only=True)[0]
                self._fed += feed
                if cfg.temperature == 0:
                    d = int(logits.argmax())
                else:  # the draft stream (independent of the verifier's uniforms)
                    d = int(sample_categorical(torch.softmax(logits.double() / cfg.temperature, -1)[None],
                                               generator)[0])
                ended = d in self._draft_eos
                if not ended:
                    drawn.append(d)
                    feed = [d]
                new_text = appended_text(base, drawn, self.draft_tokenizer, window=cfg.window)
                proposal = text_proposal(self._committed, new_text, self.target_tokenizer, max_gamma,
                                         window=cfg.window, hold_last=cfg.hold_last, ended=ended,
                                         eos=self._target_eos)
                if ended or len(proposal) >= max_gamma:
                    break
        tree = one_hot_proposal(proposal, max_gamma, policy, self.vocab_size, a.device)
        self._proposed = proposal[:len(tree.tokens)]
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

    window: int = 16  # tokens of committed tail re-encoded with the new text, on both sides

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
    ``sum_{x in I} min(p(x), q_I(x))``. Special tokens (EOS included) are outside ``I``.
    Cost per drafted token: one draft forward, a gather over ``|I|`` and one inverse-CDF draw; per
    step the re-sync of :class:`TextSyncDrafter` (encode/decode of ``window`` tokens).
    """

    deterministic = False
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
        a = self.adapter
        n, stop = max_gamma, "max_gamma"
        if not self._draft_ids:
            n, stop = 0, "no_match"
        elif a.max_length is not None and a.max_length - len(self._draft_ids) + 1 < n:
            n, stop = max(a.max_length - len(self._draft_ids) + 1, 0), "budget"  # the draft's context is full
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        feed = self._sync_cache() if n > 0 else []
        for i in range(n):
            logits = a.extend(torch.tensor(feed, dtype=torch.long, device=a.device), last_only=True)[0]  # [Vd]
            self._fed += feed
            drawn = self._draw(logits, sampling, generator)
            if drawn is None:  # no mass on the intersection: the block ends here
                stop = "no_match"
                break
            x, d, q = drawn
            tokens.append(x)
            qs.append(q)
            feed = [d]
            if i + 1 < n and policy.needs_signals and not policy.keep_drafting(*_signals(logits[self.draft_ids])):
                stop = "policy"
                break
        self._proposed = tokens
        if not tokens:
            return DraftTree(torch.empty(0, dtype=torch.long, device=a.device),
                             torch.zeros(0, self.vocab_size, device=a.device), None, stop)
        return DraftTree(torch.tensor(tokens, dtype=torch.long, device=a.device), torch.stack(qs), None, stop)
