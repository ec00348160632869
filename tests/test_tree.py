"""Draft trees: depth, sibling rank, ancestor mask and paths against a plain-Python reference on the
parent list; a chain is the tree with parents i - 1, stored without a tensor."""

import pytest
import torch

from spade_lib.decoding.drafts.drafters import Draft
from spade_lib.decoding.drafts.tree import DraftTree, depths, path_of, sibling_ranks
from spade_lib.decoding.model.masks import ancestor_mask

# root -> 0 -> 2 -> 4 ; root -> 1 -> 3 ; 0 -> 5 ; root -> 6
PARENTS = [-1, -1, 0, 1, 2, 0, -1]


def reference(parents):
    """Depth, sibling rank and ancestor sets by walking the parent list in Python."""
    n = len(parents)
    paths = [path_of(parents, i) for i in range(n)]
    depth = [len(p) - 1 for p in paths]
    rank = [sum(parents[j] == parents[i] for j in range(i)) for i in range(n)]
    mask = [[j in paths[i] for j in range(n)] for i in range(n)]
    return depth, rank, mask, paths


def random_parents(n, gen):
    return [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(n)]


def test_tree_helpers_match_a_python_reference():
    gen = torch.Generator().manual_seed(0)
    for parents in [PARENTS, [-1], [], list(range(-1, 9))] + [random_parents(n, gen) for n in (3, 8, 17, 33)]:
        depth, rank, mask, paths = reference(parents)
        t = torch.tensor(parents, dtype=torch.long)
        assert depths(t).tolist() == depth
        assert sibling_ranks(t).tolist() == rank
        assert ancestor_mask(t).tolist() == mask
        tree = DraftTree(torch.zeros(len(parents), dtype=torch.long), torch.zeros(len(parents), 4), parents=t)
        assert [tree.path(i) for i in range(len(parents))] == paths
        assert tree.depth.tolist() == depth and tree.positions.tolist() == depth
        assert tree.sibling_rank.tolist() == rank and tree.ancestor_mask().tolist() == mask
        tree.check()


def test_paths_of_the_example():
    assert path_of(PARENTS, 4) == [0, 2, 4] and path_of(PARENTS, 3) == [1, 3] and path_of(PARENTS, -1) == []
    assert depths(torch.tensor(PARENTS)).tolist() == [0, 0, 1, 1, 2, 1, 0]
    assert sibling_ranks(torch.tensor(PARENTS)).tolist() == [0, 1, 0, 0, 0, 1, 2]


def test_a_chain_needs_no_parent_tensor_and_equals_its_explicit_tree():
    x, q = torch.tensor([5, 6, 7]), torch.full((3, 4), 0.25)
    chain = Draft(x, q, None, "policy")  # the chain draft's positional order
    assert Draft is DraftTree and chain.parents is None and chain.is_chain and chain.gamma == 3
    assert chain.stop == "policy" and chain.draws == "iid"
    explicit = DraftTree(x, q, parents=torch.tensor([-1, 0, 1]))
    assert explicit.is_chain and not DraftTree(x, q, parents=torch.tensor([-1, 0, 0])).is_chain
    for name in ("depth", "positions", "sibling_rank"):
        assert getattr(chain, name).tolist() == getattr(explicit, name).tolist()
    assert chain.ancestor_mask().tolist() == explicit.ancestor_mask().tolist()
    assert chain.parent_index().tolist() == [-1, 0, 1] and chain.path(2) == explicit.path(2) == [0, 1, 2]
    assert DraftTree.chain(x, q, stop="budget").parents is None


def test_prefix_is_a_tree():
    t = torch.tensor(PARENTS)
    tree = DraftTree(torch.arange(7), torch.rand(7, 5), torch.rand(7, 5), parents=t)
    cut = tree.prefix(4)
    assert cut.gamma == 4 and cut.parents.tolist() == PARENTS[:4] and cut.q.shape == (4, 5) and cut.logits.shape == (4, 5)
    cut.check()


def test_bad_trees_are_refused_naming_the_argument():
    x, q = torch.tensor([1, 2]), torch.rand(2, 3)
    with pytest.raises(ValueError, match="draws"):
        DraftTree(x, q, draws="beam")
    with pytest.raises(ValueError, match="q: None"):
        DraftTree(x, None)
    assert DraftTree(x, None, draws="deterministic").q is None
    with pytest.raises(ValueError, match="q: expected"):
        DraftTree(x, torch.rand(3, 3))
    with pytest.raises(ValueError, match="parents: expected"):
        DraftTree(x, q, parents=torch.tensor([-1]))
    with pytest.raises(ValueError, match="tokens"):
        DraftTree(torch.zeros(2, 2, dtype=torch.long), q)
    for bad in ([-1, 1], [0, -1], [-1, -2]):
        with pytest.raises(ValueError, match="parents: node"):
            DraftTree(x, q, parents=torch.tensor(bad)).check()
    with pytest.raises(ValueError, match="node"):
        DraftTree(x, q).path(2)
