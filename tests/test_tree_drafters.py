"""Tree drafters against references: greedy tree decoding through the real SpeculativeDecoder equals
autoregressive decoding token for token (the embedded pair; a tiny random Llama with a draft model, an
EAGLE head and Medusa heads), sampled tree decoding follows the target's exact distribution (chi-square
against enumeration), each sampled node carries the q it was drawn from, and the draft model's cache is
the committed text after every step (logits against a fresh forward)."""


import numpy as np
import pytest
import scipy.stats
import torch

from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
from spade_lib.decoding.model.adapter import CausalLMAdapter
from spade_lib.decoding.drafts.drafters import (ModelDrafter, NGramTreeDrafter, SuffixDrafter, drafter_options,
                                         make_drafter)
from spade_lib.decoding.drafts.policies import FixedGamma
from spade_lib.decoding.drafts.tree import path_of
from spade_lib.decoding.drafts.tree_drafting import SMALL_TREE, TreeConfig
from spade_lib.exactness import counts_chi_square_pvalue, sequence_law
from spade_lib.sampling import SamplingConfig, adjust
from tests import tiny_models
from tests.tiny_models import perturbed

GREEDY = SamplingConfig(temperature=0)
MODEL_TREES = ["eagle2:nodes=16,depth=4,topk=4", "static", "static:choices=medusa63,depth=3",
               "sampled:widths=3-2-1,draws=iid", "sampled:widths=3-2-1,draws=without_replacement"]
PROMPTS = ["def fibonacci(n):\n    ", "x = [1, 2, 3]\nfor i in"]


def llama(vocab=64, max_pos=128, **kw):
    return tiny_models.llama(vocab=vocab, max_pos=max_pos, **kw)


# ---------------------------------------------------------------------------------------------
# the config


def test_tree_config_specs_round_trip_and_bad_ones_are_refused():
    cfg = TreeConfig.parse("eagle2:nodes=16,depth=4,topk=4")
    assert (cfg.shape, cfg.total_nodes, cfg.depth, cfg.top_k) == ("eagle2", 16, 4, 4)
    for spec in ("eagle2:nodes=8,depth=3,topk=2", "static:choices=medusa63,depth=4", "trie:nodes=9,depth=5",
                 "sampled:widths=2-2-1,draws=without_replacement"):
        assert TreeConfig.parse(spec).spec() == spec and TreeConfig.parse(TreeConfig.parse(spec).spec()) == TreeConfig.parse(spec)
    assert TreeConfig.parse(None).is_chain and TreeConfig.parse("") == TreeConfig()
    assert TreeConfig.parse("sampled:topk=3,depth=3").level_widths() == (3, 1, 1)
    assert TreeConfig(shape="static").choice_list() == SMALL_TREE and TreeConfig(shape="static").max_depth == 4
    assert TreeConfig(shape="static", choices="medusa63", depth=2).max_depth == 2
    assert TreeConfig(shape="eagle2", top_k=4).levels(6, room=8) == 3  # 4 (depth - 1) rows fed must fit 8
    for bad in ("oak", "eagle2:nodes=x", "eagle2:width=3", "eagle2:nodes", "static:choices=big",
                "sampled:draws=both", "eagle2:depth=0"):
        with pytest.raises(ValueError):
            TreeConfig.parse(bad)
    with pytest.raises(ValueError, match="choices"):
        TreeConfig(shape="static", choices=((0, 1),))  # a choice without its prefix


def test_tree_specs_are_strict_and_every_tree_has_one_spelling():
    """Issue 57: a key the shape does not read, an unknown key or a repeated one is refused by name with the
    keys the shape reads (before, it was kept on the object but dropped from spec() and the run's hash, or the
    last value won); the chain's one spelling is "" (RunConfig's default); an empty choice list and an
    unbounded shape are refused up front with the bound."""
    from spade_lib.runs.config import RunConfig

    cases = {"eagle2:widths=9-9,nodes=16": r"key 'widths' .* not read by shape 'eagle2'; it reads nodes, depth, topk",
             "eagle2:widths=2-2": "key 'widths'",
             "sampled:widths=2-2,depth=5": r"key 'depth' .* shape 'sampled' with widths .* it reads widths, draws",
             "chain:nodes=4": "shape 'chain'; it reads no keys",
             "trie:nodes=9,depth=5,draws=iid": r"key 'draws' .* it reads nodes, depth",
             "eagle2:nodes=16,nodes=4": r"key 'nodes' given twice .*'16' and '4'",
             "eagle2:colour=red": r"unknown key 'colour' .* reads nodes, depth, topk",
             "eagle2:depth=100000000": r"depth: .*<= 1024",
             "sampled:widths=64-64": "widths: a sampled tree has at most 1024 nodes",
             "eagle2:topk=1000,depth=100": "top_k: .*at most 65536"}
    for spec, match in cases.items():
        with pytest.raises(ValueError, match=match):
            TreeConfig.parse(spec)
    with pytest.raises(ValueError, match="total_nodes: "):
        TreeConfig.parse("trie:nodes=5000")
    # the same on the object: a field the shape does not read must keep its default
    with pytest.raises(ValueError, match="widths: shape 'eagle2' does not read it"):
        TreeConfig(shape="eagle2", widths=(9, 9))
    with pytest.raises(ValueError, match="depth: shape 'sampled' with widths does not read it"):
        TreeConfig(shape="sampled", widths=(2, 2), depth=5)
    with pytest.raises(ValueError, match="choices: must hold 1 to 1024 paths"):
        TreeConfig(shape="static", choices=[])
    # one tree, one spelling, one run
    assert TreeConfig.parse("eagle2:topk=4,depth=4,nodes=16").spec() == "eagle2:nodes=16,depth=4,topk=4"
    assert TreeConfig.parse("chain").spec() == TreeConfig.parse("").spec() == TreeConfig().spec() == ""
    assert TreeConfig.parse("chain") == TreeConfig.parse(None) == TreeConfig()
    chain, default = RunConfig(tree="chain"), RunConfig()
    assert chain.tree == default.tree == "" and chain.hash == default.hash


def test_make_drafter_names_the_tree_in_one_place():
    class P:
        name, heads = "toy", {}

    pair = P()
    pair.target = llama()
    pair.drafts = {"d": llama(seed=3, layers=1)}
    assert "tree" in drafter_options("ngram_tree") and "tree" in drafter_options("suffix")
    assert make_drafter("d", pair, tree="eagle2").tree.shape == "eagle2"
    assert make_drafter("d", pair).tree.is_chain and make_drafter("ngram", pair, tree="chain") is not None
    assert make_drafter("ngram_tree", pair, tree="trie:nodes=5,depth=3").tree.total_nodes == 5
    with pytest.raises(ValueError, match="chains only"):
        make_drafter("ngram", pair, tree="eagle2")
    with pytest.raises(ValueError, match="trie"):
        make_drafter("d", pair, tree="trie")
    with pytest.raises(ValueError, match="trie"):
        make_drafter("suffix", pair, tree="eagle2")


# ---------------------------------------------------------------------------------------------
# the model-free tree drafters


def test_ngram_tree_proposes_every_earlier_continuation():
    d = NGramTreeDrafter(max_ngram=2, tree="trie:nodes=10,depth=2")
    d.reset(torch.tensor([7, 1, 2, 9, 1, 2, 5, 6, 1, 2]), 16)
    tree = d.propose(4, FixedGamma(4), GREEDY, None)
    paths = sorted(tuple(tree.tokens[path_of(tree.parents.tolist(), i)].tolist()) for i in range(tree.gamma))
    assert paths == [(5,), (5, 6), (9,), (9, 1)] and tree.draws == "deterministic" and tree.q is None
    assert tree.tokens[0] == 5  # siblings: the latest occurrence first (equal frequency)
    d.accept_path([0], 3)
    assert d._ctx[-2:] == [5, 3]
    assert d.propose(1, FixedGamma(1), GREEDY, None).gamma == 0  # "5 3" and "3" never occurred


def test_suffix_drafter_reads_earlier_outputs_across_prompts():
    d = SuffixDrafter(tree="trie:nodes=8,depth=3", min_token_prob=0.0)
    d.reset([1, 2], 32)
    for t in (10, 11, 12, 13):  # a first output, committed one token at a time (plain steps)
        d.accept(0, t)
    d.reset([3, 10, 11], 32)  # a new prompt that ends as the earlier output began
    tree = d.propose(2, FixedGamma(2), GREEDY, None)
    assert tree.tokens.tolist() == [12, 13] and tree.parents.tolist() == [-1, 0]  # cut to max_gamma 2
    d.accept_path([0, 1], 20)
    assert d.outputs.sequence(1) == [12, 13, 20]


# ---------------------------------------------------------------------------------------------
# greedy: tree decoding equals autoregressive decoding


def _default_pair_built() -> bool:
    from spade_lib.zoo.build import zoo_dir

    return any(p.parent.name.startswith("default-") and "tokenizer" not in p.parent.name
               for p in zoo_dir().glob("default-*/manifest.json"))


@pytest.fixture(scope="module")
def embedded():
    """The embedded pair when it is built (after ``make run`` or ``python -m spade_lib.zoo default``), else
    the tiny pair the test suite builds in seconds: the check always runs, on the real embedded pair
    wherever it exists (building it here would add ~8 minutes to ``make test``)."""
    from spade_lib.zoo.pairs import load_pair

    pair = load_pair("default" if _default_pair_built() else "tiny")
    ar = AutoregressiveDecoder(pair.target, sampling=GREEDY, eos_token_id=[])
    prompts = [pair.tokenizer(text)["input_ids"] for text in PROMPTS]
    return pair, prompts, [ar.generate(ids, 24).tokens for ids in prompts]


@pytest.mark.parametrize("name,tree", [("distilled", t) for t in MODEL_TREES] + [("ngram_tree", None),
                                                                                  ("suffix", None)])
def test_greedy_tree_decoding_equals_autoregressive_on_the_embedded_pair(embedded, name, tree):
    pair, prompts, refs = embedded
    drafter = make_drafter(name, pair, tree=tree)
    dec = SpeculativeDecoder(pair.target, drafter, gamma=4, sampling=GREEDY, eos_token_id=[])
    for ids, ref in zip(prompts, refs):
        out = dec.generate(ids, 24)
        assert out.tokens == ref
        trees = [s for s in out.steps if s.gamma > 0]
        assert all(s.tree is not None for s in trees) and all(s.n_accepted <= 4 for s in out.steps)
    if name == "distilled":  # a draft model trained on the target agrees often
        assert sum(s.n_accepted for s in out.steps) > 0
        # the trees branch, but for distinct draws from a greedy (one-hot) q: a chain
        assert any(len(set(s.tree["parent"])) < s.gamma for s in trees) != ("without_replacement" in tree)


class CheckedTreeDrafter(ModelDrafter):
    """After every step, the draft's cache must be the committed text: its length plus the unfed tokens is
    the text, and the logits at the unfed tokens equal a fresh forward of the whole text."""

    def reset(self, prompt_ids, vocab_size):
        super().reset(prompt_ids, vocab_size)
        self.text, self.checks = list(torch.as_tensor(prompt_ids).tolist()), 0

    def accept_path(self, path, next_token):
        self.text += [self._tree_tokens[i] for i in path] + [int(next_token)]
        super().accept_path(path, next_token)
        self._check()

    def accept(self, n_accepted, next_token):
        if self._rows is not None:
            return self.accept_path(list(range(n_accepted)), next_token)
        self.text.append(int(next_token))
        super().accept(n_accepted, next_token)
        self._check()

    def _check(self):
        a = self.adapter
        n, u = a.length, int(self._unfed.numel())
        assert n + u == len(self.text)
        got = a.extend(self._unfed)
        with torch.no_grad():
            ref = a.model(torch.tensor([self.text])).logits[0, -u:]
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        a.rollback(n)
        self.checks += 1


@pytest.mark.parametrize("backend", ["hf", "lean"])
@pytest.mark.parametrize("tree", MODEL_TREES)
def test_tiny_llama_tree_decoding_is_exact_and_the_draft_cache_is_the_committed_text(backend, tree):
    """Greedy: equals AR token for token. Sampling (T=1, the paths accepted are random): the draft's cache
    is checked against a fresh forward after every step, and near the context limit (the draft's room cuts
    the tree)."""
    target = llama()
    draft = perturbed(target, 0.2)  # agrees with the target on about a third of the drafted levels
    prompt = [5, 9, 33, 2, 17]
    ar = AutoregressiveDecoder(CausalLMAdapter(target, backend=backend), sampling=GREEDY, eos_token_id=[])
    drafter = CheckedTreeDrafter(CausalLMAdapter(draft, backend=backend), tree=tree)
    dec = SpeculativeDecoder(CausalLMAdapter(target, backend=backend), drafter, gamma=4, sampling=GREEDY,
                             eos_token_id=[])
    out = dec.generate(prompt, 24)
    assert out.tokens == ar.generate(prompt, 24).tokens and drafter.checks == out.n_steps
    assert any(s.n_accepted > 0 for s in out.steps)
    near = CheckedTreeDrafter(CausalLMAdapter(draft, backend=backend, max_length=len(prompt) + 12), tree=tree)
    sampled = SpeculativeDecoder(CausalLMAdapter(target, backend=backend), near, gamma=4,
                                 sampling=SamplingConfig(temperature=1.0), eos_token_id=[])
    got = sampled.generate(prompt, 30, seed=3)
    assert got.stop_reason == "context_limit" and near.checks == got.n_steps
    assert any(s.draft_stop == "budget" for s in got.steps)


def test_sampled_nodes_carry_the_q_they_were_drawn_from():
    """Each node of a sampled tree was drawn from q = adjust(draft logits at its parent's path), computed
    here by a fresh forward; without replacement, siblings are distinct."""
    draft = llama(seed=2, layers=1)
    sampling = SamplingConfig(temperature=0.8, top_k=20)
    prompt = [4, 8, 15]
    for draws in ("iid", "without_replacement"):
        d = ModelDrafter(draft, tree=f"sampled:widths=4-2,draws={draws}")
        d.reset(torch.tensor(prompt), 64)
        tree = d.propose(4, FixedGamma(4), sampling, torch.Generator().manual_seed(0))
        assert tree.gamma == 12 and tree.draws == draws
        parents = tree.parents.tolist()
        for i in range(tree.gamma):
            above = [int(tree.tokens[j]) for j in path_of(parents, parents[i])]
            with torch.no_grad():
                ref = adjust(draft(torch.tensor([prompt + above])).logits[0, -1:], sampling)[0]
            torch.testing.assert_close(tree.q[i], ref, rtol=1e-4, atol=1e-6)
            assert float(tree.q[i, tree.tokens[i]]) > 0
        if draws == "without_replacement":
            for p in set(parents):
                kids = [int(tree.tokens[i]) for i in range(tree.gamma) if parents[i] == p]
                assert len(set(kids)) == len(kids)


# ---------------------------------------------------------------------------------------------
# EAGLE and Medusa heads


def eagle_head(target, seed=1):
    from spade_lib.decoding.drafts.eagle import EagleHead

    torch.manual_seed(seed)
    head = EagleHead.from_target(target, draft_token_ids=torch.randperm(64)[:40])
    with torch.no_grad():
        for p in head.parameters():
            if p is not head.embed_tokens.weight:
                p.add_(0.05 * torch.randn_like(p))
    return head


def medusa_head(target, seed=1):
    from spade_lib.decoding.drafts.medusa import MedusaHead

    torch.manual_seed(seed)
    head = MedusaHead.from_target(target, draft_token_ids=torch.randperm(64)[:40], num_heads=3)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return head


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
@pytest.mark.parametrize("tree", MODEL_TREES[:3] + MODEL_TREES[4:])
def test_head_tree_decoding_equals_autoregressive(kind, tree):
    target = llama(layers=8 if kind == "eagle" else 2)
    head = eagle_head(target) if kind == "eagle" else medusa_head(target)

    class P:
        name, drafts = "toy", {}

    pair = P()
    pair.target, pair.heads = target, {"h": head}
    drafter = make_drafter(kind, pair, tree=tree)
    assert drafter.tree == TreeConfig.parse(tree)
    prompt = [5, 9, 33, 2, 17]
    ar = AutoregressiveDecoder(target, sampling=GREEDY, eos_token_id=[]).generate(prompt, 24)
    out = SpeculativeDecoder(target, drafter, gamma=4, sampling=GREEDY, eos_token_id=[]).generate(prompt, 24)
    assert out.tokens == ar.tokens
    assert all(s.tree is not None for s in out.steps if s.gamma > 0)
    if not tree.startswith("sampled"):  # greedy sampled trees are the greedy chain, which these heads miss
        assert any(s.n_accepted > 0 for s in out.steps)


def test_eagle_tree_levels_equal_the_chain_on_its_greedy_path():
    """A static tree's first path (rank 0 at every level) is the head's greedy chain, computed position by
    position on its cache: the one-pass-per-level tree mask reproduces it."""
    from spade_lib.decoding.drafts.drafters import TargetView
    from spade_lib.decoding.drafts.eagle import EagleDrafter

    target = llama(layers=8)
    head = eagle_head(target)
    prompt = [3, 4, 5, 6, 7]
    with torch.no_grad():
        hs = target(input_ids=torch.tensor([prompt[:-1]]), output_hidden_states=True).hidden_states

    def fresh(tree=None):
        d = EagleDrafter(head, tree=tree)
        d.reset(torch.tensor(prompt), 64)
        d.observe(TargetView(torch.tensor(prompt[:-1]), 0, {k: hs[k][0] for k in d.hidden_layers}, prompt[-1]))
        return d

    chain = fresh().propose(4, FixedGamma(4), GREEDY, None)
    tree = fresh("static").propose(4, FixedGamma(4), GREEDY, None)
    first = [i for i, c in enumerate(sorted(SMALL_TREE, key=lambda c: (len(c), c))) if set(c) == {0}]
    assert tree.tokens[first].tolist() == chain.tokens.tolist()
    torch.testing.assert_close(tree.logits[first], chain.logits, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# sampling: the output follows the target's exact distribution


N_TOKENS, VOCAB = 3, 6


def exact_joint(target, prompt, sampling):
    """P(first N_TOKENS tokens = t) under target-only sampling, by enumeration: [VOCAB ** N_TOKENS]."""
    return sequence_law(target, prompt, sampling, N_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["sampled:widths=2-2,draws=iid", "sampled:widths=3-1,draws=without_replacement",
                                  "eagle2:nodes=4,depth=2,topk=2"])
def test_sampled_tree_decoding_follows_the_target_distribution(tree, record_property):
    """T=1 through the decoder with the draft model's tree (exact tree rule, q as drawn): the first
    N_TOKENS tokens follow the target-only joint (chi-square against enumeration)."""
    target = llama(vocab=VOCAB, seed=0)
    draft = perturbed(target, 0.3)
    sampling = SamplingConfig(temperature=1.0)
    prompt = [2, 4]
    dec = SpeculativeDecoder(target, ModelDrafter(draft, tree=tree), gamma=2, sampling=sampling, record="light")
    assert dec.tree_mode == "exact"
    counts = np.zeros(VOCAB ** N_TOKENS, dtype=np.int64)
    first = []
    for seed in range(1500):
        out = dec.generate(prompt, N_TOKENS, seed=seed)
        t = out.tokens
        counts[(t[0] * VOCAB + t[1]) * VOCAB + t[2]] += 1
        first.append(out.accept_lengths[0])
    p = counts_chi_square_pvalue(counts, exact_joint(target, prompt, sampling))
    record_property("p_value", p)
    print(f"{tree}: chi-square vs the exact target joint p = {p:.4f}; first-step accept lengths "
          f"{np.bincount(first).tolist()}")
    assert set(first) == {1, 2, 3}  # rejections, one and two accepted nodes
    assert p > 1e-3
