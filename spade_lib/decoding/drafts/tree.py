"""Draft trees: what a drafter proposes, a chain being the tree in which every node has one child.

Terms (used with these meanings everywhere in SPADE; SpecInfer, Miao et al. 2024; Medusa, Cai et al. 2024). The
*root* is the pending token ``t``: the newest committed token, not yet in the target's cache. A draft tree has ``N``
*nodes* ``0 .. N-1``; node ``i`` carries the drafted token ``x_i`` and its *parent* ``parents[i]`` (``-1``: a child
of the root); nodes are in topological order (``parents[i] < i``), so every prefix ``0 .. m-1`` is itself a tree.
``depth[i]`` is the number of ancestors of ``i`` other than the root (a child of the root has depth 0), so ``x_i``
sits at absolute position ``root + 1 + depth[i]``; the *sibling rank* of ``i`` is the number of earlier nodes with the
same parent (the order siblings were drawn in). The *path* of ``i`` is its ancestors and itself, root-down;
verification accepts one path (possibly empty), then draws the next token from the target at its end.

``q[i]`` is the (adjusted) draft distribution ``x_i`` was drawn from, ``[N, V]``; ``draws`` (one of
:data:`spade_lib.rules.DRAWS`, read by :func:`spade_lib.verify.verify_tree`) says how siblings were drawn from their
parent's ``q``: ``"iid"`` (independently: the chain case, SpecInfer's multi-step sampling), ``"without_replacement"``
(distinct, each from ``q`` with the earlier ones removed and renormalised) or ``"deterministic"`` (e.g. top-``k``
children; ``q`` may be ``None``, verification then treats ``q[i]`` as ``one_hot(x_i)``).

A **chain** (node ``i``'s parent ``i - 1``) is stored with ``parents=None``: its shape is known on the host, so the
decoder takes the chain path (plain causal forward, no mask, no extra host sync). ``DraftTree(tokens, q, logits,
stop)``, the positional order of the chain draft :class:`spade_lib.decoding.drafts.drafters.Draft`, is a chain
(:func:`DraftTree.chain`). The target scores a tree in one forward over ``[t, x_0 .. x_{N-1}]`` in which row ``r``
attends to the cache and its own path's rows (:meth:`DraftTree.ancestor_mask`) at position ``length + depth``: row
``i + 1`` then computes exactly what a causal forward of the path of ``i`` would (``tests/test_adapter.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spade_lib.decoding.model.masks import ancestor_mask
from spade_lib.rules import DRAWS

__all__ = ["DraftTree", "depths", "sibling_ranks", "path_of"]


def depths(parents: torch.Tensor) -> torch.Tensor:
    """``[N]`` long: ancestors of each node other than the root (``0`` for a child of the root)."""
    return ancestor_mask(parents).sum(dim=-1) - 1


def sibling_ranks(parents: torch.Tensor) -> torch.Tensor:
    """``[N]`` long: earlier nodes with the same parent (``0`` for a first child)."""
    n = int(parents.shape[0])
    earlier = torch.ones(n, n, dtype=torch.bool, device=parents.device).tril(-1)
    return ((parents[:, None] == parents[None, :]) & earlier).sum(dim=-1)


def path_of(parents: list[int], node: int) -> list[int]:
    """The nodes from the root's child down to ``node`` (``[]`` for ``node = -1``, the root), on the host."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@dataclass
class DraftTree:
    """One proposed draft tree (module docstring); ``parents=None`` is the chain ``x_0 .. x_{gamma-1}``."""

    tokens: torch.Tensor                # [N] long: x_i, the token of node i
    q: torch.Tensor | None              # [N, V] float32: adjusted draft distribution x_i was drawn from (None: deterministic)
    logits: torch.Tensor | None = None  # [N, V] raw draft logits (None for model-free drafters)
    stop: str = "max_gamma"             # why drafting stopped: "max_gamma", "policy", "no_match" or "budget"
    parents: torch.Tensor | None = None  # [N] long: parent node (-1: the root); None: a chain (parent i - 1)
    draws: str = "iid"                  # how siblings were drawn: "iid", "without_replacement", "deterministic"

    def __post_init__(self):  # shapes only: host metadata, no tensor is read
        n = int(self.tokens.shape[0])
        if self.tokens.dim() != 1:
            raise ValueError(f"tokens: expected shape [N], got {tuple(self.tokens.shape)}")
        if self.draws not in DRAWS:
            raise ValueError(f"draws: must be one of {DRAWS}, got {self.draws!r}")
        if self.q is None and self.draws != "deterministic":
            raise ValueError(f"q: None is only allowed with draws='deterministic', got draws={self.draws!r}")
        if self.q is not None and (self.q.dim() != 2 or int(self.q.shape[0]) != n):
            raise ValueError(f"q: expected shape [{n}, V], got {tuple(self.q.shape)}")
        if self.parents is not None and tuple(self.parents.shape) != (n,):
            raise ValueError(f"parents: expected shape [{n}], got {tuple(self.parents.shape)}")

    @classmethod
    def chain(cls, tokens: torch.Tensor, q: torch.Tensor | None, logits: torch.Tensor | None = None,
              stop: str = "max_gamma", *, draws: str = "iid") -> DraftTree:
        """The chain ``x_0 .. x_{gamma-1}`` (node ``i``'s parent is ``i - 1``)."""
        return cls(tokens, q, logits, stop, None, draws)

    @property
    def gamma(self) -> int:
        """Nodes drafted, ``N`` (a chain's draft length)."""
        return int(self.tokens.shape[0])

    @property
    def n_nodes(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def is_chain(self) -> bool:
        """Every node's parent is the node before it. Free for ``parents=None``; otherwise reads ``parents``."""
        if self.parents is None:
            return True
        return bool(torch.equal(self.parents.cpu(), torch.arange(-1, self.gamma - 1)))

    def parent_index(self) -> torch.Tensor:
        """``[N]`` long parents, materialised for a chain (``-1, 0, .., N-2``)."""
        if self.parents is not None:
            return self.parents
        return torch.arange(-1, self.gamma - 1, device=self.tokens.device)

    @property
    def depth(self) -> torch.Tensor:
        """``[N]`` long: each node's depth (``0``: a child of the root; a chain's node ``i``: ``i``)."""
        if self.parents is None:
            return torch.arange(self.gamma, device=self.tokens.device)
        return depths(self.parents)

    @property
    def positions(self) -> torch.Tensor:
        """``[N]``: each node's position after the root's child, ``= depth`` (node ``i`` sits at ``root + 1 + depth[i]``)."""
        return self.depth

    @property
    def sibling_rank(self) -> torch.Tensor:
        """``[N]`` long: each node's rank among its siblings (all ``0`` in a chain)."""
        if self.parents is None:
            return torch.zeros(self.gamma, dtype=torch.long, device=self.tokens.device)
        return sibling_ranks(self.parents)

    def ancestor_mask(self) -> torch.Tensor:
        """``[N, N]`` bool: ``[i, j]`` iff ``j`` is on the path of ``i`` (lower-triangular for a chain)."""
        if self.parents is None:
            return torch.ones(self.gamma, self.gamma, dtype=torch.bool, device=self.tokens.device).tril()
        return ancestor_mask(self.parents)

    def path(self, node: int) -> list[int]:
        """The path of ``node`` root-down (``[]`` for ``-1``); reads ``parents`` on the host."""
        if not -1 <= node < self.gamma:
            raise ValueError(f"node: must be in [-1, {self.gamma}), got {node}")
        if self.parents is None:
            return list(range(node + 1))
        return path_of(self.parents.tolist(), node)

    def check(self) -> list[int]:
        """Refuse ``parents`` that are not a tree in topological order (``-1 <= parents[i] < i``); reads them
        and returns them as a host list (a chain's ``-1, 0, .., N-2``)."""
        if self.parents is None:
            return list(range(-1, self.gamma - 1))
        if self.parents.dtype.is_floating_point or self.parents.dtype == torch.bool:
            raise ValueError(f"parents: must be integers, got dtype {self.parents.dtype}")
        ps = self.parents.tolist()
        for i, p in enumerate(ps):
            if not -1 <= p < i:
                raise ValueError(f"parents: node {i} has parent {p}; need -1 <= parents[i] < i (topological order)")
        return ps

    def prefix(self, m: int) -> DraftTree:
        """The tree of the first ``m`` nodes (a tree again: nodes are in topological order)."""
        cut = lambda t: None if t is None else t[:m]  # noqa: E731
        return DraftTree(self.tokens[:m], cut(self.q), cut(self.logits), self.stop, cut(self.parents), self.draws)
