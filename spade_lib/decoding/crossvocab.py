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
:func:`proposal_law_error` proves a rule on a law of proposals by enumeration (fp64, through
:func:`spade_lib.verify.verify`). Still to build: TLI as a drafter, SLRS (string-level rejection sampling).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from spade_lib.decoding.adapter import CausalLMAdapter, as_token_tensor
from spade_lib.decoding.drafters import Drafter, one_hot_proposal, sample_categorical
from spade_lib.decoding.policies import Policy
from spade_lib.decoding.tree import DraftTree
from spade_lib.sampling import SamplingConfig
from spade_lib.verify import verify


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


def proposal_law_error(proposals: list[tuple[int, ...]], weights: list[float], p_of, *, mode: str = "one_hot_q",
                       q_of=None) -> float:
    """How far one verification step of a *random* proposal is from the target's law, exactly (fp64).

    ``proposals[k]`` (target ids, possibly empty) is proposed with probability ``weights[k]``;
    ``p_of(prefix) -> [V]`` is the target's distribution after the committed text and ``prefix`` (a
    tuple). Each block is verified by :func:`spade_lib.verify.verify` under ``mode`` once per cut ``n``
    with uniforms forcing it: the path has probability ``w_k prod_{i<n} a_i (1 - a_n)`` (``a`` the
    verifier's own ``accept_prob``) and emits ``x_<n`` then a token from the verifier's ``next_dist``;
    an empty block is a plain target step (``Y_0 ~ p``). ``q_of(k) -> [g, V]`` is the ``q`` the rule is
    told (default ``one_hot(x)``, the deterministic proposal). Returns
    ``max_y |P(Y_<j = y, Y_j = .) - P(Y_<j = y, Y_j emitted) p(. | y)|`` over every emitted prefix ``y``
    (``Y_j`` emitted: the step reached position ``j``): 0 exactly when every emitted token follows ``p``.
    """
    if len(proposals) != len(weights) or not proposals:
        raise ValueError(f"weights: need one weight per proposal, got {len(weights)} for {len(proposals)}")
    law: dict[tuple[int, ...], torch.Tensor] = {}

    def add(prefix: tuple[int, ...], mass: torch.Tensor) -> None:
        law[prefix] = law.get(prefix, 0) + mass

    for k, (x, w) in enumerate(zip(proposals, weights)):
        x = tuple(int(t) for t in x)
        if w <= 0:
            continue
        if not x:
            add((), w * p_of(()).double())
            continue
        g = len(x)
        p = torch.stack([p_of(x[:i]).double() for i in range(g + 1)])[None]       # [1, g+1, V]
        xt = torch.tensor([x])
        q = torch.zeros(1, g, p.shape[-1], dtype=torch.float64).scatter_(-1, xt[..., None], 1.0) \
            if q_of is None else q_of(k).double()[None]                          # [1, g, V]
        zero = torch.zeros(1, dtype=torch.float64)
        a = verify(p, q, xt, mode=mode, uniforms=torch.zeros(1, g, dtype=torch.float64),
                   next_uniforms=zero).accept_prob[0].double()
        below_one = torch.nextafter(torch.ones((), dtype=torch.float64), torch.zeros((), dtype=torch.float64))
        for n in range(g + 1):
            weight = w * float(a[:n].prod()) * (float(1 - a[n]) if n < g else 1.0)
            if weight <= 0:
                continue
            u = torch.zeros(1, g, dtype=torch.float64)
            if n < g:
                u[0, n] = below_one
            res = verify(p, q, xt, mode=mode, uniforms=u, next_uniforms=zero)
            if int(res.n_accepted[0]) != n:
                raise AssertionError(f"forced uniforms did not produce {n} acceptances")
            for j in range(n):
                add(x[:j], weight * torch.nn.functional.one_hot(torch.tensor(x[j]), p.shape[-1]).double())
            add(x[:n], weight * res.next_dist[0].double())
    return max(float((m - m.sum() * p_of(y).double()).abs().max()) for y, m in law.items())


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


class TextDrafter(Drafter):
    """A draft causal LM with its own tokenizer, drafting for a target with another: string-level
    drafting (Timor et al. 2025's SLEM; HF's ``AssistedCandidateGeneratorDifferentTokenizers``).

    The drafter keeps the committed target tokens ``C`` and the draft's own tokens ``D`` of the same
    text (``D`` re-tokenised at each commit by :func:`retokenize`, so a merge across the boundary
    happens as the draft's tokenizer would make it; the draft's KV cache is rolled back to the longest
    common prefix of what it holds and the new ``D``). ``propose``: the draft extends ``D`` by up to
    ``max_draft_tokens`` tokens (argmax, or sampled at ``temperature`` from the draft stream the
    decoder passes, never the verifier's), the new text is re-encoded with the target's tokenizer
    against ``C`` (:func:`continuation`: a draft token may split into several target tokens, several
    draft tokens may merge into one, the committed boundary may be segmented differently), and the
    first ``<= max_gamma`` target tokens ``x`` are proposed with ``q_i = one_hot(x_i)``.

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

    The two sides meet as text (``decode(..., skip_special_tokens=True)``): bytes the target emits that
    are not valid UTF-8 reach the draft as U+FFFD, and special tokens not at all. That can only lower
    acceptance, never change the output. Cost per step: a few encode/decode calls of ``window`` tokens
    per drafted token, and one draft forward per drafted token.
    """

    deterministic = True

    def __init__(self, model, draft_tokenizer, target_tokenizer, config: TextDraftConfig = TextDraftConfig(), *,
                 max_length: int | None = None):
        if not isinstance(config, TextDraftConfig):
            raise ValueError(f"config: expected a TextDraftConfig, got {type(config).__name__}")
        for name, tok in (("draft_tokenizer", draft_tokenizer), ("target_tokenizer", target_tokenizer)):
            if not (callable(getattr(tok, "encode", None)) and callable(getattr(tok, "decode", None))):
                raise ValueError(f"{name}: expected a tokenizer with encode and decode, got {type(tok).__name__}")
        self.adapter = model if isinstance(model, CausalLMAdapter) else CausalLMAdapter(model, max_length=max_length)
        self.draft_tokenizer, self.target_tokenizer, self.config = draft_tokenizer, target_tokenizer, config
        eos = getattr(draft_tokenizer, "eos_token_id", None)
        self._draft_eos = frozenset(() if eos is None else ([eos] if isinstance(eos, int) else eos))
        self._target_eos = getattr(target_tokenizer, "eos_token_id", None)
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

    def accept(self, n_accepted: int, next_token: int) -> None:
        added = self._proposed[:n_accepted] + [int(next_token)]
        cfg = self.config
        new_text = appended_text(self._committed, added, self.target_tokenizer, window=cfg.window)
        self._committed = self._committed + added
        self._draft_ids = retokenize(self._draft_ids, new_text, self.draft_tokenizer, window=cfg.window,
                                     protect=self._protect)
        self._proposed = []
