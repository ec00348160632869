"""Drafters: whatever proposes the block ``x_0 .. x_{gamma-1}`` that the target then verifies.

Interface (:class:`Drafter`, driven by :class:`spade_lib.decoding.decode.SpeculativeDecoder`): ``reset(prompt_ids,
vocab_size)`` (the target's ``V``); ``propose(max_gamma, policy, sampling, generator)`` returns a
:class:`~spade_lib.decoding.drafts.tree.DraftTree` (``Draft``): the tokens and the adjusted ``q_i`` each was drawn from,
``[gamma, V]``, a chain unless it gives ``parents``; ``accept(n_accepted, next_token)`` / ``accept_path(path,
next_token)`` commit the accepted drafts and the residual/bonus token; ``observe(view)`` (if overridden) gets the
target's hidden states at committed positions for the layers in ``hidden_layers`` (:class:`TargetView`). A chain
drafter consults the policy after each token with its ``q``'s temperature-1 signals (:mod:`spade_lib.decoding.drafts.policies`;
one-hot ``q``: ``q_top_prob = 1``, ``h_q = 0``, no host sync) unless ``needs_signals = False`` (``FixedGamma``).

- :class:`ModelDrafter`: a small causal LM on its own cache (:class:`~spade_lib.decoding.model.adapter.CausalLMAdapter`),
  ``q_i = adjust(logits, sampling)`` warped exactly like the target, ``x_i ~ q_i`` (argmax when greedy), logits cut
  or ``-inf``-padded to the target's vocabulary (changes ``q``, never the output law: any ``q`` is lossless).
- :class:`NGramDrafter` (prompt lookup, Saxena 2023): what followed the latest earlier occurrence of the trailing
  n-gram (longest first), ``q_i = one_hot(x_i)`` (``one_hot_q`` rule: accept with ``p(x_i)``, else resample ``p``
  without ``x_i``); it may propose fewer than ``max_gamma`` tokens, or none (a plain target step).
- :class:`NullDrafter` (``"null"``), the physical control: ``max_gamma`` tokens the ``reject`` rule always rejects;
  a ``gamma + 1``-token forward per token ``~ p``, speedup ``1 / r(gamma) <= 1`` (above 1: the baseline's defect).
- Trees: ``tree=`` a :class:`~spade_lib.decoding.drafts.tree_drafting.TreeConfig` or spec, one level per draft forward, depth
  <= ``max_gamma``, no policy; model-free ``"ngram_tree"``, ``"suffix"``; feature heads ``eagle``, ``medusa``.

:func:`make_drafter(name, pair, tree=None, **options) <make_drafter>` builds a registered name, a pair's draft or head
(:func:`register_drafter`; cross-vocabulary: import :mod:`spade_lib.decoding.drafts.crossvocab`). Each class declares a
:class:`DrafterKind`, read by :func:`drafter_kind` and :func:`check_draft` (refuses what ``make_drafter`` would).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Callable, ClassVar

import torch

from spade_lib.decoding.drafts.policies import Policy
from spade_lib.decoding.drafts.tree import DraftTree
from spade_lib.decoding.drafts.tree_drafting import MODEL_SHAPES, TREE_SHAPES, TreeConfig, committed_rows, grow_tree
from spade_lib.decoding.drafts.tree_shapes import SuffixIndex, TreeShape, ngram_tree
from spade_lib.decoding.model.adapter import CausalLMAdapter, as_token_tensor
from spade_lib.sampling import SamplingConfig, adjust

__all__ = ["Draft", "Drafter", "DrafterKind", "HEAD_DRAFTER", "TargetView", "ModelDrafter", "one_hot_proposal", "NGramDrafter",
           "NGramTreeDrafter", "SuffixDrafter", "NullDrafter", "make_drafter", "check_draft", "drafter_kind",
           "register_drafter", "register_cross_vocab_rule", "drafter_names", "sample_categorical", "draw_token"]


# The chain draft is a DraftTree with parents=None (spade_lib.decoding.drafts.tree: one definition of a proposal); the
# name Draft stays importable from here, where drafters have always found it (STYLE: module paths are an API).
Draft = DraftTree


@dataclass
class TargetView:
    """What the target computed and committed, told to the drafter (:meth:`Drafter.observe`).

    After the prefill and after every verification the target's cache gains the states of some fed
    tokens: the prompt (all but its last token) at the start, then per step the pending token ``t`` and
    the accepted draft nodes (the accepted path of a tree). ``tokens [n]`` are those tokens in order, at
    absolute positions ``start .. start + n - 1``; ``hidden[l] [n, H]`` is the target's hidden state at
    each of them for every layer ``l`` the drafter named in :attr:`Drafter.hidden_layers` (indexing as
    Hugging Face's ``output_hidden_states``: 0 the embeddings, ``i`` the output of decoder layer ``i``,
    the last entry after the final norm); ``next_token`` is the token that follows them (emitted, not yet
    fed to the target). A drafter that reads features (EAGLE, Medusa) predicts from ``hidden`` at the
    last committed position and ``next_token``.
    """

    tokens: torch.Tensor                 # [n] long
    start: int                           # absolute position of tokens[0]
    hidden: dict[int, torch.Tensor]      # layer -> [n, H] (empty when the drafter asked for none)
    next_token: int


VOCABULARIES = ("same", "other")  # a drafter drafts in the target's vocabulary, or in its own (re-encoded)


@dataclass(frozen=True)
class DrafterKind:
    """What a drafter is, declared by its class (:attr:`Drafter.kind`) and read wherever a drafter is chosen
    by name: the decoder (``q``: which rule verifies it), the checks of runs and notebooks
    (:func:`check_draft`), a run's identity (a head's build is part of it), HF's assisted generation (never
    a head), ``RunConfig`` (its tree against ``shapes``)."""

    q: bool                  # proposes a distribution q (False: tokens only, q one-hot: a deterministic rule verifies)
    vocabulary: str          # "same": drafts in the target's vocabulary; "other": in its own, re-encoded as target tokens
    head: bool               # reads the target's features (a head: names hidden_layers, is told observe())
    model: bool              # runs a model every drafting step, so has a cost c > 0 (drafting_model() is not None)
    shapes: tuple[str, ...]  # the draft shapes it proposes (tree_drafting.TREE_SHAPES): ("chain",) drafts chains only

    def __post_init__(self) -> None:
        if self.vocabulary not in VOCABULARIES:
            raise ValueError(f"vocabulary: must be one of {VOCABULARIES}, got {self.vocabulary!r}")
        if not self.shapes or set(self.shapes) - set(TREE_SHAPES):
            raise ValueError(f"shapes: a non-empty tuple of {TREE_SHAPES}, got {self.shapes!r}")

    @property
    def chain_only(self) -> bool:
        return self.shapes == ("chain",)

    def check_tree(self, tree: TreeConfig | str | None, what: str) -> None:
        """Refuse a ``tree`` (a :class:`~spade_lib.decoding.drafts.tree_drafting.TreeConfig` or spec; ``None``: the
        drafter's own default) of a shape this kind does not propose; ``what`` names the drafter."""
        if tree is None:
            return
        shape = TreeConfig.parse(tree).shape
        if shape not in self.shapes:
            grows = "chains only" if self.chain_only else f"{self.shapes}"
            raise ValueError(f"tree: {what} drafts {grows}, not a {shape!r} tree")


class Drafter:
    """Interface of a drafter (see the module docstring). A subclass declares its :attr:`kind`."""

    # What a drafter is (DrafterKind). A class that declares none is taken to be a same-vocabulary drafter
    # of chains with a model and a q, reading no features (the interface's defaults); every drafter of the
    # library, and any registered one, declares its own.
    kind: ClassVar[DrafterKind] = DrafterKind(q=True, vocabulary="same", head=False, model=True, shapes=("chain",))
    mode: str | None = None      # the acceptance rule this drafter needs (None: by temperature and q)
    hidden_layers: tuple[int, ...] = ()  # target layers whose hidden states observe() receives

    @property
    def deterministic(self) -> bool:
        """True when ``q`` is one-hot (``kind.q`` is False): verify with a deterministic lossless rule."""
        return not self.kind.q

    def observe(self, view: TargetView) -> None:
        """Told what the target committed (see :class:`TargetView`); called after ``accept``. Default: ignore."""

    def drafting_model(self):
        """What one drafting step runs, for the cost model's ``c`` (:func:`spade_lib.runs.costs.pair_costs`
        times it with :func:`~spade_lib.decoding.studies.costs.measure_costs`): a decoding adapter
        (:class:`ModelDrafter`), a feature head (a :class:`~spade_lib.decoding.model.heads.DraftHead`), or ``None``
        for a drafter that runs no model (``c = 0``). Declared, never guessed: the default raises, so a new
        drafter says what it runs instead of being priced at ``c = 0``."""
        raise NotImplementedError(f"{type(self).__name__}: does not say what a drafting step runs "
                                  "(implement Drafter.drafting_model)")

    def reset(self, prompt_ids: torch.Tensor, vocab_size: int) -> None:
        raise NotImplementedError

    def propose(self, max_gamma: int, policy: Policy, sampling: SamplingConfig,
                generator: torch.Generator | None) -> DraftTree:
        raise NotImplementedError

    def accept(self, n_accepted: int, next_token: int) -> None:
        raise NotImplementedError

    def accept_path(self, path: list[int], next_token: int) -> None:
        """Told what was committed after a tree draft (``propose`` gave ``parents``): the accepted nodes
        root-down (:mod:`spade_lib.decoding.drafts.tree`), then the target's token. Default: a path ``0 .. n-1``
        is ``accept(n, next_token)``; a drafter that proposes other trees overrides this. (A step
        without a draft, the budget's last token, is ``accept(0, next_token)`` for every drafter.)"""
        if path != list(range(len(path))):
            raise NotImplementedError(f"{type(self).__name__}: proposed a tree, so it must implement accept_path "
                                      f"(accepted path {path})")
        self.accept(len(path), next_token)

    def step_costs(self) -> dict[str, float] | None:
        """The drafter's own account of the step just committed (its ``propose`` and the ``accept`` after
        it), read by the decoder into ``StepInfo.draft_costs``; ``None`` (the default) keeps none. The
        cross-vocabulary drafters keep their forwards and their text work apart
        (:class:`~spade_lib.decoding.drafts.crossvocab.DraftStepCosts`)."""
        return None


def _match_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Cut draft logits ``[..., Vd]`` to the target's ``V`` tokens, or pad them with ``-inf``."""
    vd = logits.shape[-1]
    if vd == vocab_size:
        return logits
    if vd > vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - vd), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def sample_categorical(q: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of ``q [n, V]`` (non-negative, rows need not be normalised) by inverse CDF:
    the first ``t`` with ``C(t) > u C(V-1)``, ``C`` the float64 cumulative sum and ``u ~ U[0, 1)`` from
    ``generator``. A zero-weight token is never returned (``C`` does not rise there). ~10x cheaper than
    ``torch.multinomial`` on CPU for ``V`` in the thousands."""
    c = q.to(torch.float64).cumsum(dim=-1)
    total = c[:, -1:]
    u = torch.rand((q.shape[0], 1), generator=generator, dtype=torch.float64, device=q.device)
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(c, target, right=True)[:, 0]


def draw_token(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One drafted token from draft ``logits [1, V]``: ``(argmax, None)`` when greedy, else ``(x ~ q, q)``
    with ``q = adjust(logits, sampling)`` (the distribution verification must be told)."""
    if sampling.greedy:
        return logits.argmax(dim=-1), None
    q = adjust(logits, sampling, validate=False)
    return sample_categorical(q, generator), q


def _signals(logits: torch.Tensor) -> tuple[float, float]:
    """(max probability, entropy in nats) of ``softmax(logits)`` at temperature 1 — one host sync."""
    q_raw = logits.float().softmax(dim=-1)
    top, h = torch.stack([q_raw.max(), torch.special.entr(q_raw).sum()]).tolist()
    return top, h


class ModelDrafter(Drafter):
    """A small causal LM with its own KV cache.

    The cache holds every committed token except the last few ``_unfed`` ones (the newest committed
    token, and ``x_{gamma-1}`` after a fully accepted block), which the next ``propose`` feeds first.

    ``tree`` (a :class:`~spade_lib.decoding.drafts.tree_drafting.TreeConfig` or its spec; default the chain):
    propose that tree instead, each level one tree-masked extend from the root's row on (``tree_from``);
    ``accept_path`` then keeps the accepted path's fed rows and leaves the rest of the path unfed.
    """

    kind = DrafterKind(q=True, vocabulary="same", head=False, model=True, shapes=("chain", *MODEL_SHAPES))

    def __init__(self, model: torch.nn.Module | CausalLMAdapter, *, max_length: int | None = None,
                 tree: TreeConfig | str | None = None):
        self.adapter = model if isinstance(model, CausalLMAdapter) else CausalLMAdapter(model, max_length=max_length)
        self.vocab_size = self.adapter.vocab_size
        self.tree = _model_tree(tree)
        self._unfed: torch.Tensor | None = None
        self._tokens: torch.Tensor | None = None
        self._length_before = 0
        self._rows: dict | None = None  # a proposed tree: path tokens -> fed row (after _base)
        self._tree_tokens: list[int] = []
        self._base = 0

    def drafting_model(self) -> CausalLMAdapter:
        """Its adapter: a drafting step is the draft model's one-token forward."""
        return self.adapter

    def reset(self, prompt_ids: torch.Tensor, vocab_size: int) -> None:
        prompt = as_token_tensor(prompt_ids, self.adapter.device)
        if prompt.numel() == 0:
            raise ValueError("prompt_ids: empty prompt")
        self.vocab_size = vocab_size
        self.adapter.reset()
        if prompt.numel() > 1:
            self.adapter.extend(prompt[:-1], last_only=True)
        self._unfed = prompt[-1:]
        self._tokens = None
        self._rows = None

    @torch.inference_mode()
    def propose(self, max_gamma: int, policy: Policy, sampling: SamplingConfig,
                generator: torch.Generator | None) -> DraftTree:
        """Draft up to ``max_gamma`` tokens. Greedy: ``x_i = argmax`` of the logits and the one-hot ``q``
        of all positions built in one call at the end; sampling: ``x_i ~ q_i`` by inverse CDF. With a
        tree: the tree, at most ``max_gamma`` deep."""
        if self._unfed is None:
            raise ValueError("propose: call reset(prompt_ids, vocab_size) first")
        if not self.tree.is_chain:
            return self._propose_tree(max_gamma, sampling, generator)
        self._length_before = self.adapter.length
        self._n_unfed = int(self._unfed.shape[0])
        feed = self._unfed
        greedy = sampling.greedy
        tokens, qs, logits_rows = [], [], []
        stop = "max_gamma"
        for i in range(max_gamma):
            logits = _match_vocab(self.adapter.extend(feed, last_only=True), self.vocab_size)  # [1, V]
            x, q = draw_token(logits, sampling, generator)
            if q is not None:
                qs.append(q)
            tokens.append(x)
            logits_rows.append(logits)
            feed = x
            if i + 1 < max_gamma and policy.needs_signals and not policy.keep_drafting(*_signals(logits)):
                stop = "policy"
                break
        if not tokens:
            empty = torch.empty(0, dtype=torch.long, device=self.adapter.device)
            self._tokens = empty
            return DraftTree(empty, torch.empty(0, self.vocab_size, device=self.adapter.device), None, stop)
        self._tokens = torch.cat(tokens)
        logits = torch.cat(logits_rows)
        q = adjust(logits, sampling, validate=False) if greedy else torch.cat(qs)
        return DraftTree(self._tokens, q, logits, stop)

    def _propose_tree(self, max_gamma: int, sampling: SamplingConfig, generator: torch.Generator | None) -> DraftTree:
        """The root's logits from the unfed tokens (a causal extend), then :func:`grow_tree`: each level
        one extend of its new rows with the parents of every tree row so far, from ``_base`` on."""
        a = self.adapter
        root = _match_vocab(a.extend(self._unfed, last_only=True), self.vocab_size)[0]
        base = self._base = a.length

        def feed(tokens: list[int], parents: list[int], depths: list[int]) -> torch.Tensor:
            ids = torch.tensor(tokens, dtype=torch.long, device=a.device)
            return _match_vocab(a.extend(ids, parents=parents, tree_from=base), self.vocab_size)

        room = None if a.max_length is None else a.max_length - base
        tree, self._rows = grow_tree(self.tree, root, feed, sampling, generator, max_depth=max_gamma, room=room)
        self._tree_tokens = tree.tokens.tolist()
        return tree

    def accept_path(self, path: list[int], next_token: int) -> None:
        """After a tree: keep the fed rows of the accepted path (its longest fed prefix) after the root's
        row, drop every other tree row; the rest of the path and ``next_token`` are fed next time."""
        if self._rows is None:
            return super().accept_path(path, next_token)
        tokens = [self._tree_tokens[i] for i in path]
        kept = committed_rows(self._rows, tokens)
        self.adapter.keep(kept, start=self._base)
        self._unfed = torch.tensor(tokens[len(kept):] + [int(next_token)], dtype=torch.long, device=self.adapter.device)
        self._rows = None

    def accept(self, n_accepted: int, next_token: int) -> None:
        if self._rows is not None:  # a tree was proposed (the decoder says accept(0, t) after an empty one)
            return self.accept_path(list(range(n_accepted)), next_token)
        k = 0 if self._tokens is None else int(self._tokens.shape[0])
        nxt = torch.tensor([next_token], dtype=torch.long, device=self.adapter.device)
        if k == 0:  # nothing drafted, nothing fed
            self._unfed = torch.cat([self._unfed, nxt])
        else:  # fed: _unfed, x_0 .. x_{k-2}; committed: x_0 .. x_{n-1}, next_token
            in_cache = min(n_accepted, k - 1)
            self.adapter.rollback(self._length_before + self._n_unfed + in_cache)
            self._unfed = torch.cat([self._tokens[in_cache:n_accepted], nxt])
        self._tokens = None


def one_hot_proposal(proposal: list[int], max_gamma: int, policy: Policy, vocab_size: int,
                     device) -> DraftTree:
    """A deterministic proposal as a chain ``DraftTree`` with one-hot ``q`` (verified by ``one_hot_q``):
    ``policy`` consulted after each token with the signals of a one-hot ``q`` (confidence 1, entropy 0,
    host values, no sync); ``stop`` is ``"policy"``, ``"max_gamma"`` or ``"no_match"`` (shorter)."""
    stop = "max_gamma" if len(proposal) == max_gamma else "no_match"
    if policy.needs_signals:
        for i in range(len(proposal) - 1):
            if not policy.keep_drafting(1.0, 0.0):
                proposal, stop = proposal[:i + 1], "policy"
                break
    tokens = torch.tensor(proposal, dtype=torch.long, device=device)
    q = torch.zeros(len(proposal), vocab_size, device=device)
    if proposal:
        q.scatter_(1, tokens[:, None], 1.0)
    return DraftTree(tokens, q, None, stop)


class NGramDrafter(Drafter):
    """Prompt lookup: propose what followed the latest earlier occurrence of the trailing n-gram.

    ``max_ngram`` down to ``min_ngram`` are tried in turn; a hash index of every n-gram's latest
    end position is kept up to date as tokens are committed, so a lookup costs O(max_ngram).
    """

    kind = DrafterKind(q=False, vocabulary="same", head=False, model=False, shapes=("chain",))

    def drafting_model(self) -> None:
        """None: a lookup in the committed text, no model (``c = 0``)."""
        return None

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, device: torch.device | str = "cpu"):
        """``device``: where proposals are made until ``reset`` is given a tensor (then: its device)."""
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"min_ngram/max_ngram: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.device = torch.device(device)
        self.vocab_size = 0
        self._ctx: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], int]] = {}
        self._indexed = 0  # n-grams ending at positions < _indexed are in the index
        self._proposed: list[int] = []

    def reset(self, prompt_ids: torch.Tensor, vocab_size: int) -> None:
        if isinstance(prompt_ids, torch.Tensor):
            self.device = prompt_ids.device  # propose on the decoder's device
        ids = as_token_tensor(prompt_ids, "cpu").tolist()
        if not ids:
            raise ValueError("prompt_ids: empty prompt")
        self.vocab_size = vocab_size
        self._ctx = []
        self._index = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self._indexed = 0
        self._extend(ids)

    def _extend(self, new: list[int]) -> None:
        ctx = self._ctx
        ctx.extend(new)
        # index n-grams ending at e <= len - 2 (their continuation ctx[e + 1] exists)
        for e in range(self._indexed, len(ctx) - 1):
            for n, table in self._index.items():
                if e + 1 >= n:
                    table[tuple(ctx[e + 1 - n:e + 1])] = e + 1
        self._indexed = max(self._indexed, len(ctx) - 1)

    def propose(self, max_gamma: int, policy: Policy, sampling: SamplingConfig,
                generator: torch.Generator | None) -> DraftTree:
        ctx, proposal = self._ctx, []
        for n in range(min(self.max_ngram, len(ctx)), self.min_ngram - 1, -1):
            start = self._index[n].get(tuple(ctx[len(ctx) - n:]))
            if start is not None:
                proposal = ctx[start:start + max_gamma]
                break
        tree = one_hot_proposal(proposal, max_gamma, policy, self.vocab_size, self.device)
        self._proposed = proposal[:len(tree.tokens)]
        return tree

    def accept(self, n_accepted: int, next_token: int) -> None:
        self._extend(self._proposed[:n_accepted] + [int(next_token)])
        self._proposed = []


def _trie_tree(config: TreeConfig | str | None) -> TreeConfig:
    tree = TreeConfig(shape="trie", total_nodes=16, depth=8) if config is None else TreeConfig.parse(config)
    if tree.shape != "trie":
        raise ValueError(f"tree: a model-free tree drafter grows a 'trie' (total_nodes, depth), not {tree.shape!r}")
    return tree


def _trie_draft(shape: TreeShape, depth: int, device: torch.device) -> DraftTree:
    """A trie (level order) cut to ``depth`` levels -- a prefix of its nodes -- as a deterministic DraftTree."""
    n = int((shape.depths() <= depth).sum())
    return DraftTree(shape.tokens[:n].to(device), None, None, "max_gamma" if n else "no_match",
                     shape.parents[:n].to(device), "deterministic")


class _ContextTreeDrafter(Drafter):
    """What the model-free tree drafters share: the committed text (``_ctx``, on the host), the last
    proposal's tokens, and committing an accepted path (:meth:`_committed` sees the new tokens)."""

    kind = DrafterKind(q=False, vocabulary="same", head=False, model=False, shapes=("trie",))

    def drafting_model(self) -> None:
        """None: a trie or suffix index of the committed text, no model (``c = 0``)."""
        return None

    def reset(self, prompt_ids: torch.Tensor, vocab_size: int) -> None:
        if isinstance(prompt_ids, torch.Tensor):
            self.device = prompt_ids.device
        self._ctx = as_token_tensor(prompt_ids, "cpu").tolist()
        if not self._ctx:
            raise ValueError("prompt_ids: empty prompt")
        self._proposed = []
        self._started()

    def _started(self) -> None:
        """A new prompt is in ``_ctx``."""

    def _committed(self, new: list[int]) -> None:
        """``new`` tokens were appended to ``_ctx``."""

    def accept_path(self, path: list[int], next_token: int) -> None:
        new = [self._proposed[i] for i in path] + [int(next_token)]
        self._ctx.extend(new)
        self._committed(new)
        self._proposed = []

    def accept(self, n_accepted: int, next_token: int) -> None:
        self.accept_path(list(range(n_accepted)), next_token)


class NGramTreeDrafter(_ContextTreeDrafter):
    """Prompt lookup as a tree (:func:`~spade_lib.decoding.drafts.tree_shapes.ngram_tree`): for the longest
    trailing n-gram (``max_ngram`` down to ``min_ngram``) that occurred earlier, *every* occurrence
    proposes what followed it, merged into a trie of at most ``tree.total_nodes`` nodes and ``tree.depth``
    levels (default ``TreeConfig("trie", total_nodes=16, depth=8)``). Deterministic nodes, ``q = None``."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, *, tree: TreeConfig | str | None = None,
                 device: torch.device | str = "cpu"):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"min_ngram/max_ngram: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tree = _trie_tree(tree)
        self.device = torch.device(device)
        self._ctx: list[int] = []
        self._proposed: list[int] = []

    def propose(self, max_gamma: int, policy: Policy, sampling: SamplingConfig,
                generator: torch.Generator | None) -> DraftTree:
        depth = self.tree.levels(max_gamma)
        shape = ngram_tree(self._ctx, self.max_ngram, self.min_ngram, max_nodes=self.tree.total_nodes, depth=depth)
        tree = _trie_draft(shape, depth, self.device)
        self._proposed = tree.tokens.tolist()
        return tree


class SuffixDrafter(_ContextTreeDrafter):
    """SuffixDecoding (Oliaro et al. 2024) with :class:`~spade_lib.decoding.drafts.tree_shapes.SuffixIndex`: two
    indexes, the prompt's (new at every ``reset``) and the outputs' (kept across prompts: every earlier
    output, and this one as its tokens are committed), as SuffixDecoding keeps a per-request and a global
    tree. Each proposes its candidate trie for the committed text (``speculate``: ``max_nodes =
    tree.total_nodes``, ``max_spec_factor``, ``min_token_prob``), cut to ``tree.depth`` levels; the one with
    the larger summed score (its expected accepted length under the empirical continuation
    probabilities) is proposed, the prompt's on a tie. Deterministic nodes, ``q = None``."""

    def __init__(self, *, tree: TreeConfig | str | None = None, max_depth: int = 24, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1, device: torch.device | str = "cpu"):
        self.tree = _trie_tree(tree)
        self.max_depth, self.max_spec_factor, self.min_token_prob = max_depth, max_spec_factor, min_token_prob
        self.outputs = SuffixIndex(max_depth)  # every output so far, one sequence per request
        self.prompt_index = SuffixIndex(max_depth)
        self.device = torch.device(device)
        self._request = -1
        self._ctx: list[int] = []
        self._proposed: list[int] = []

    def _started(self) -> None:
        self._request += 1
        self.prompt_index = SuffixIndex(self.max_depth)
        self.prompt_index.extend(0, self._ctx)

    def propose(self, max_gamma: int, policy: Policy, sampling: SamplingConfig,
                generator: torch.Generator | None) -> DraftTree:
        depth = self.tree.levels(max_gamma)
        best, best_score = None, -1.0
        for index in (self.prompt_index, self.outputs):
            shape = index.speculate(self._ctx, max_nodes=self.tree.total_nodes, max_spec_factor=self.max_spec_factor,
                                    min_token_prob=self.min_token_prob)
            tree = _trie_draft(shape, depth, self.device)
            score = float(shape.score[:tree.gamma].sum()) if tree.gamma else 0.0
            if score > best_score:
                best, best_score = tree, score
        self._proposed = best.tokens.tolist()
        return best

    def _committed(self, new: list[int]) -> None:
        self.outputs.extend(self._request, new)


class NullDrafter(Drafter):
    """The null-draft control: ``max_gamma`` copies of token 0, verified by the ``reject`` rule (module
    docstring). Output is distributed exactly as ``p`` (greedy: identical to autoregressive decoding)."""

    kind = DrafterKind(q=False, vocabulary="same", head=False, model=False, shapes=("chain",))
    mode = "reject"

    def drafting_model(self) -> None:
        """None: constant tokens, no model (``c = 0``)."""
        return None

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.vocab_size = 0

    def reset(self, prompt_ids: torch.Tensor, vocab_size: int) -> None:
        if isinstance(prompt_ids, torch.Tensor):
            self.device = prompt_ids.device
        self.vocab_size = vocab_size

    def propose(self, max_gamma: int, policy: Policy, sampling: SamplingConfig,
                generator: torch.Generator | None) -> DraftTree:
        tokens = torch.zeros(max_gamma, dtype=torch.long, device=self.device)
        q = torch.zeros(max_gamma, self.vocab_size, device=self.device)
        q[:, 0] = 1.0
        return DraftTree(tokens, q, None, "max_gamma")

    def accept(self, n_accepted: int, next_token: int) -> None:
        pass


# ------------------------------------------------------------------------------------------------
# drafters by name

# The kind of every drafter that drafts with one of the pair's feature heads (the registered "eagle" and
# "medusa", and a head of pair.heads by its name); EagleDrafter and MedusaDrafter declare it as theirs.
HEAD_DRAFTER = DrafterKind(q=True, vocabulary="same", head=True, model=True, shapes=("chain", *MODEL_SHAPES))


@dataclass(frozen=True)
class _Registered:
    factory: Callable[..., Drafter]  # factory(pair, device=..., **options) -> Drafter
    kind: DrafterKind                # what the drafters it builds declare


_REGISTRY: dict[str, _Registered] = {}


def register_drafter(name: str, factory: Callable[..., Drafter], kind: DrafterKind, *, replace: bool = False) -> None:
    """Register ``factory(pair, device=..., **options) -> Drafter`` under ``name``; ``kind``: the
    :class:`DrafterKind` its drafters declare (e.g. ``NGramDrafter.kind``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: must be a non-empty string, got {name!r}")
    if not isinstance(kind, DrafterKind):
        raise ValueError(f"kind: must be a DrafterKind (the drafter class's kind), got {kind!r}")
    if name in _REGISTRY and not replace:
        raise ValueError(f"name: drafter {name!r} is already registered (pass replace=True)")
    _REGISTRY[name] = _Registered(factory, kind)


CROSS_VOCAB_RULES = ("text", "tli", "slrs")  # how a cross-vocabulary draft drafts; decoding.drafts.crossvocab registers each
_CROSS_VOCAB: dict[str, tuple[type, type[Drafter]]] = {}  # rule -> (its config dataclass, its drafter class)


def register_cross_vocab_rule(rule: str, config_class: type, drafter_class: type[Drafter], *,
                              replace: bool = False) -> None:
    """Register how a cross-vocabulary draft drafts by ``rule`` (one of :data:`CROSS_VOCAB_RULES`):
    ``drafter_class(model, draft_tokenizer, target_tokenizer, config_class(**options), max_length=...)``.
    :mod:`spade_lib.decoding.drafts.crossvocab` registers its drafters from its own module (it builds on this one)."""
    if rule not in CROSS_VOCAB_RULES:
        raise ValueError(f"rule: must be one of {CROSS_VOCAB_RULES}, got {rule!r}")
    if not (isinstance(drafter_class, type) and issubclass(drafter_class, Drafter)
            and drafter_class.kind.vocabulary == "other"):
        raise ValueError(f"drafter_class: a Drafter whose kind drafts in another vocabulary, got {drafter_class!r}")
    if rule in _CROSS_VOCAB and not replace:
        raise ValueError(f"rule: {rule!r} is already registered (pass replace=True)")
    _CROSS_VOCAB[rule] = (config_class, drafter_class)


def drafter_names(pair=None) -> tuple[str, ...]:
    """Registered drafter names, plus the pair's draft models and heads when ``pair`` is given."""
    if pair is None:
        return tuple(_REGISTRY)
    return tuple(_REGISTRY) + tuple(sorted(pair.drafts)) + tuple(sorted(getattr(pair, "heads", {}) or {}))


def drafter_options(name: str) -> tuple[str, ...]:
    """Keyword options the registered drafter ``name`` takes (``()`` for a pair's draft model)."""
    import inspect

    if name not in _REGISTRY:
        return ()
    params = inspect.signature(_REGISTRY[name].factory).parameters.values()
    return tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name != "device")


def _cross_vocab(name: str, rule: str) -> tuple[type, type[Drafter]]:
    """The config and drafter classes of the cross-vocabulary draft ``name`` by ``rule``."""
    if rule not in CROSS_VOCAB_RULES:
        raise ValueError(f"rule: the cross-vocabulary draft {name!r} drafts by one of {CROSS_VOCAB_RULES}, not {rule!r}")
    if rule not in _CROSS_VOCAB:
        raise ValueError(f"rule: no drafter is registered for rule {rule!r} of the cross-vocabulary draft {name!r}; "
                         "spade_lib.decoding.drafts.crossvocab registers them: import it first")
    return _CROSS_VOCAB[rule]


def _pair_parts(pair) -> tuple[dict, dict, dict]:
    return (getattr(pair, "drafts", {}) or {}, getattr(pair, "heads", {}) or {},
            getattr(pair, "draft_tokenizers", {}) or {})


def drafter_kind(name: str, pair=None, *, rule: str = "text") -> DrafterKind | None:
    """The declared :class:`DrafterKind` of the drafter ``name`` (resolved as :func:`make_drafter` does): a
    registered drafter's, else -- with ``pair`` -- a draft model's (:class:`ModelDrafter`; a cross-vocabulary
    draft's by its ``rule``) or a feature head's (:data:`HEAD_DRAFTER`); ``None`` for any other name."""
    if name in _REGISTRY:
        return _REGISTRY[name].kind
    if pair is None:
        return None
    drafts, heads, draft_tokenizers = _pair_parts(pair)
    if name in drafts:
        return _cross_vocab(name, rule)[1].kind if name in draft_tokenizers else ModelDrafter.kind
    return HEAD_DRAFTER if name in heads else None


def check_draft(pair, draft: str, *, tree: TreeConfig | str | None = None, needs: Mapping[str, object] | None = None,
                why: str = "", **options) -> DrafterKind:
    """The kind of the drafter ``draft`` of ``pair`` (:func:`drafter_kind`), once everything
    :func:`make_drafter(draft, pair, tree=tree, **options) <make_drafter>` would refuse by name is refused,
    nothing built: an unknown name, a head drafter of a pair without heads, a ``tree`` of a shape the kind
    does not propose, a cross-vocabulary ``rule`` or an option the drafter does not take. ``needs``: fields of
    :class:`DrafterKind` the caller requires (e.g. ``{"q": True, "vocabulary": "same"}``), refused with the
    pair's drafts that have them and ``why`` (a clause saying what needs them). Every ``ValueError`` names
    the argument: ``draft``, ``tree``, ``rule``, ``options`` or ``needs``."""
    drafts, heads, draft_tokenizers = _pair_parts(pair)
    pair_name = getattr(pair, "name", "?")
    needs = dict(needs or {})
    unknown = set(needs) - {f.name for f in fields(DrafterKind)}
    if unknown:
        raise ValueError(f"needs: fields of DrafterKind {[f.name for f in fields(DrafterKind)]}, not {sorted(unknown)}")
    cross = draft not in _REGISTRY and draft in drafts and draft in draft_tokenizers
    kind = drafter_kind(draft, pair, rule=options.get("rule", "text") if cross else "text")
    if kind is None:
        raise ValueError(f"draft: pair {pair_name!r} has drafts {sorted(drafts)}, heads {sorted(heads)} "
                         f"(or {sorted(_REGISTRY)}), not {draft!r}")
    if kind.head and not heads:
        raise ValueError(f"draft: {draft!r} drafts with one of the pair's feature heads, and pair {pair_name!r} has "
                         "none attached (load_pair(..., heads=(...)))")
    if draft in _REGISTRY:
        what, takes = f"drafter {draft!r}", set(drafter_options(draft)) - {"tree"}
    elif cross:
        rule = options.get("rule", "text")
        config_fields = sorted(_cross_vocab(draft, rule)[0].__dataclass_fields__)
        what, takes = f"the cross-vocabulary draft {draft!r}", {"rule", "max_length", *config_fields}
        if set(options) - takes:
            raise ValueError(f"options: {what} with rule {rule!r} takes rule, max_length and {config_fields}, not "
                             f"{sorted(set(options) - takes)}")
    elif draft in drafts:
        what, takes = f"the draft model {draft!r}", {"max_length"}
    else:
        what, takes = f"the feature head {draft!r}", set(options)  # the head's drafter takes its kind's own options
    kind.check_tree(tree, what)
    if set(options) - takes:
        raise ValueError(f"options: {what} takes {sorted(takes)}, not {sorted(set(options) - takes)}")
    if any(getattr(kind, f) != want for f, want in needs.items()):
        def fits(name: str) -> bool:
            k = drafter_kind(name, pair)
            return not (k.head and not heads) and all(getattr(k, f) == want for f, want in needs.items())

        have = [n for n in drafter_names(pair) if fits(n)]
        wanted = ", ".join(f"{f}={want!r}" for f, want in needs.items())
        raise ValueError(f"draft: {draft!r} is not a drafter of pair {pair_name!r} with {wanted}{why} (those: {have})")
    return kind


def make_drafter(name: str, pair, *, tree: TreeConfig | str | None = None, **options) -> Drafter:
    """The drafter ``name`` for ``pair``: a registered name (built on the target's device), else the
    pair's draft model ``pair.drafts[name]`` (a :class:`ModelDrafter`, which takes ``max_length``; a
    cross-vocabulary draft, one in ``pair.draft_tokenizers``, drafts through the text: option ``rule``,
    ``"text"`` (a :class:`~spade_lib.decoding.drafts.crossvocab.TextDrafter`), ``"tli"`` or ``"slrs"``, and the
    rule's config fields; see :mod:`spade_lib.decoding.drafts.crossvocab`, which registers them), else the pair's
    head ``pair.heads[name]`` (its ``drafter(**options)``). ``tree``: the
    :class:`~spade_lib.decoding.drafts.tree_drafting.TreeConfig` (or spec string) of a drafter that drafts trees;
    one whose kind drafts chains only refuses any but the chain. Refuses what :func:`check_draft` refuses."""
    tree = None if tree is None else TreeConfig.parse(tree)
    check_draft(pair, name, tree=tree, **options)
    if tree is not None and (name not in _REGISTRY or "tree" in drafter_options(name)):
        options["tree"] = tree  # a registered drafter of chains only takes no tree: it was the chain
    if name in _REGISTRY:
        device = next(pair.target.parameters()).device
        return _REGISTRY[name].factory(pair, device=device, **options)
    drafts, heads, draft_tokenizers = _pair_parts(pair)
    if name in drafts and name in draft_tokenizers:
        options.pop("tree", None)  # the chain (check_draft refused any other)
        config_class, drafter_class = _cross_vocab(name, options.pop("rule", "text"))
        max_length = options.pop("max_length", None)
        return drafter_class(drafts[name], draft_tokenizers[name], pair.tokenizer, config_class(**options),
                             max_length=max_length)
    if name in drafts:
        return ModelDrafter(drafts[name], **options)
    return heads[name].drafter(**options)


def _model_tree(tree: TreeConfig | str | None) -> TreeConfig:
    """``tree`` for a drafter with a model: the chain or one of the model shapes."""
    tree = TreeConfig.parse(tree)
    if not tree.is_chain and tree.shape not in MODEL_SHAPES:
        raise ValueError(f"tree: a drafter with a model grows {('chain',) + MODEL_SHAPES}, not {tree.shape!r} "
                         "(the 'trie' is the model-free drafters' 'ngram_tree' / 'suffix')")
    return tree


def _ngram(pair, *, device, max_ngram: int = 3, min_ngram: int = 1) -> NGramDrafter:
    return NGramDrafter(max_ngram=max_ngram, min_ngram=min_ngram, device=device)


def _ngram_tree(pair, *, device, max_ngram: int = 3, min_ngram: int = 1,
                tree: TreeConfig | str | None = None) -> NGramTreeDrafter:
    return NGramTreeDrafter(max_ngram, min_ngram, tree=tree, device=device)


def _suffix(pair, *, device, tree: TreeConfig | str | None = None, max_depth: int = 24, max_spec_factor: float = 1.0,
            min_token_prob: float = 0.1) -> SuffixDrafter:
    return SuffixDrafter(tree=tree, max_depth=max_depth, max_spec_factor=max_spec_factor,
                         min_token_prob=min_token_prob, device=device)


def _head_drafter(kind: str) -> Callable[..., Drafter]:
    """The factory of ``"eagle"`` / ``"medusa"``: the pair's one head of ``kind`` (or the one named ``head``)."""

    def factory(pair, *, device, head: str | None = None, tree: TreeConfig | str | None = None) -> Drafter:
        heads = {n: h for n, h in (getattr(pair, "heads", {}) or {}).items() if getattr(h, "kind", None) == kind}
        if head is None:
            if len(heads) != 1:
                raise ValueError(f"head: pair {getattr(pair, 'name', '?')!r} has {kind} heads {sorted(heads)}; "
                                 f"name one with head=")
            head = next(iter(heads))
        if head not in heads:
            raise ValueError(f"head: pair {getattr(pair, 'name', '?')!r} has {kind} heads {sorted(heads)}, not {head!r}")
        return heads[head].drafter(tree=tree)

    return factory


register_drafter("ngram", _ngram, NGramDrafter.kind)
register_drafter("ngram_tree", _ngram_tree, NGramTreeDrafter.kind)
register_drafter("suffix", _suffix, SuffixDrafter.kind)
register_drafter("null", lambda pair, *, device: NullDrafter(device=device), NullDrafter.kind)
register_drafter("eagle", _head_drafter("eagle"), HEAD_DRAFTER)
register_drafter("medusa", _head_drafter("medusa"), HEAD_DRAFTER)
