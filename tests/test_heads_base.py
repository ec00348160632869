"""The draft-head interface (``spade_lib.decoding.model.heads``) and the zoo's registry of head kinds
(``spade_lib.zoo.heads.HEAD_KINDS``): the one vocabulary scatter against a plain loop, every registered
kind against what the interface promises, and a new kind -- one class here and one registry entry --
built, trained, evaluated, saved, loaded, costed and decoded with through the same code as EAGLE and Medusa."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from spade_lib import paths
from spade_lib.decoding.drafts.drafters import Draft, Drafter, TargetView, draw_token, make_drafter
from spade_lib.decoding.drafts.medusa import MedusaConfig
from spade_lib.decoding.model.adapter import CausalLMAdapter
from spade_lib.decoding.model.heads import DraftHead, scatter_vocab
from spade_lib.sampling import SamplingConfig, adjust
from spade_lib.zoo import heads as zoo_heads
from spade_lib.zoo.head_data import HeadDataConfig, Sequences
from spade_lib.zoo.head_train import HeadTrainConfig, train_medusa
from spade_lib.zoo.heads import HEAD_KINDS, HeadConfig, HeadKind, head_kind, head_kinds, register_head_kind
from tests.test_eagle import V, hidden_at, tiny_target

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def test_scatter_vocab_puts_each_draft_row_at_its_token_and_minus_inf_elsewhere():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([7, 0, 3, 9, 4])
    got = scatter_vocab(logits, ids, 11)
    want = torch.full((2, 3, 11), float("-inf"))
    for j, t in enumerate(ids.tolist()):
        want[..., t] = logits[..., j]
    assert torch.equal(got, want)


def test_the_fr_spec_draft_scatters_with_the_same_function():
    from spade_lib.zoo.frspec import FRSpecLlamaConfig, FRSpecLlamaForCausalLM

    cfg = FRSpecLlamaConfig(head_vocab=6, vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1)
    model = FRSpecLlamaForCausalLM(cfg).eval()
    model.set_head_tokens(torch.tensor([19, 2, 5, 11, 0, 7]))
    small = torch.randn(4, 6)
    assert torch.equal(model.scatter_full(small), scatter_vocab(small, model.head_token_ids, 20))


@pytest.mark.parametrize("kind", ["eagle3", "eagle1", "medusa"])
def test_every_registered_kind_keeps_the_interfaces_promises(target, kind):
    """Built by its registry entry: a DraftHead of that variant, reading the layers its drafter asks the
    target for, features of ``in_features`` width, a draft vocabulary that the scatter and a state-dict
    load respect, and trainable parameters that are all but the ones tied to the target."""
    assert kind in head_kinds()
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(1))[:40]
    head = head_kind(kind).new(target, HeadConfig(kind, draft_vocab_size=40), ids)
    assert isinstance(head, DraftHead) and isinstance(head, head_kind(kind).head_class) and head.variant == kind
    drafter = head.drafter()
    assert drafter.hidden_layers == head.feature_layers and drafter.drafting_model() is head
    hidden = hidden_at(target, [3, 5, 8], head.feature_layers)
    assert head.features(hidden).shape == (3, head.in_features)
    assert torch.equal(head.draft_ids, ids.sort().values) and torch.equal(head.d2t, head.draft_ids - torch.arange(40))
    draft_logits = torch.randn(2, 40)
    full = head.target_logits(draft_logits)
    assert full.shape == (2, V) and torch.equal(full[:, head.draft_ids], draft_logits)
    assert bool(torch.isinf(full).sum() == 2 * (V - 40))
    again = head_kind(kind).new(target, HeadConfig(kind, draft_vocab_size=40), torch.arange(40))
    again.load_state_dict(head.state_dict(), strict=False)
    assert torch.equal(again.draft_ids, head.draft_ids)  # rebuilt from the loaded d2t
    tied = {id(p) for n, p in head.named_parameters() if n in head.tied}
    assert [id(p) for p in head.trainable_parameters()] == [id(p) for p in head.parameters() if id(p) not in tied]
    if kind != "medusa":
        assert head.embed_tokens.weight is target.get_input_embeddings().weight and len(tied) == 1
    with pytest.raises(ValueError, match="token_ids"):
        head.set_draft_vocab(torch.arange(39))


def test_registry_lookups_name_the_argument_and_the_known_kinds():
    with pytest.raises(ValueError, match=r"kind: must be one of \('eagle3', 'eagle1', 'medusa'.*got 'eagle2'"):
        head_kind("eagle2")
    with pytest.raises(ValueError, match="kind: must be one of"):
        HeadConfig("eagle2")
    with pytest.raises(ValueError, match="already registered"):
        register_head_kind(HEAD_KINDS["medusa"])
    with pytest.raises(ValueError, match="head_class"):
        HeadKind("linear", nn.Linear, lambda *a: None, train_medusa)


# ------------------------------------------------------------------ a new kind: one class and one entry

class ToyHead(DraftHead):
    """One linear layer on ``h^L_t`` guessing ``x_{t+2}`` (a one-head Medusa without its ResBlock): the
    smallest head kind, written against the interface only. Medusa's config and trainer fit it."""

    kind = "toy"
    config_class = MedusaConfig

    def __init__(self, config: MedusaConfig):
        super().__init__(config)
        self.proj = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)

    @property
    def feature_layers(self):
        return (int(self.config.feature_layer),)

    @property
    def in_features(self):
        return int(self.config.hidden_size)

    @property
    def max_depth(self):
        return 1

    def forward(self, hidden, n_heads=None):  # [..., H] -> [..., 1, Vd], Medusa's layout (train_medusa)
        return self.proj(hidden)[..., None, :]

    @classmethod
    def from_target(cls, target, config=None, *, draft_token_ids=None, init_from_target=True, **options):
        vd = None if draft_token_ids is None else len(draft_token_ids)
        head = cls(config or MedusaConfig.for_target(target.config, num_heads=1, draft_vocab_size=vd))
        if draft_token_ids is not None:
            head.set_draft_vocab(draft_token_ids)
        if init_from_target:
            with torch.no_grad():
                head.proj.weight.copy_(target.get_output_embeddings().weight[head.draft_ids])
        return head.to(next(target.parameters()).device).eval()

    def chain_logits(self, features, next_tokens, depth, *, own_tokens=False):
        if depth > 1:
            raise ValueError(f"depth: a toy head drafts one token, not {depth}")
        return [self.proj(features.float())]

    def drafter(self, **options):
        return ToyDrafter(self, **options)

    def cost_step(self):
        head = self

        class Step:
            length = 0

            def prefill(self, features, tokens):
                self.length = int(tokens.numel())

            def step(self, feature, token, position):
                return head.proj(feature)

            def crop(self, length):
                self.length = min(self.length, length)

        return Step()


class ToyDrafter(Drafter):
    """One token a step from the toy head on the newest committed state."""

    def __init__(self, head: ToyHead, tree=None):
        self.head, self.hidden_layers, self.vocab_size, self._h = head, head.feature_layers, head.config.vocab_size, None

    def drafting_model(self):
        return self.head

    def reset(self, prompt_ids, vocab_size):
        self.vocab_size, self._h = int(vocab_size), None

    def observe(self, view: TargetView):
        if view.tokens.numel():
            self._h = view.hidden[self.hidden_layers[0]][-1:]

    @torch.inference_mode()
    def propose(self, max_gamma, policy, sampling, generator):
        if self._h is None or max_gamma < 1:
            return Draft(torch.empty(0, dtype=torch.long), torch.empty(0, self.vocab_size), None, "no_match")
        logits = self.head.target_logits(self.head.proj(self._h), self.vocab_size)
        self._h = None
        x, q = draw_token(logits, sampling, generator)
        return Draft(x, adjust(logits, sampling, validate=False) if q is None else q, logits, "heads")

    def accept(self, n_accepted, next_token):
        pass


def _new_toy(target, cfg, ids):
    return ToyHead.from_target(target, draft_token_ids=ids)


def test_a_new_head_kind_is_one_class_and_one_registry_entry(target, tmp_path, monkeypatch):
    """Registered, the toy kind goes through the zoo's build (features of its layers, evaluation to its
    max_depth, its trainer, its cost step), SPADE's folder both ways, the held-out evaluation, the pair's
    cost table (c > 0) and the decoder (greedy output = autoregressive), none of which names it."""
    from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
    from spade_lib.runs.costs import pair_costs
    from spade_lib.zoo.head_eval import evaluate_head

    monkeypatch.setitem(HEAD_KINDS, "toy", HeadKind("toy", ToyHead, _new_toy, train_medusa))
    gen = torch.Generator().manual_seed(0)
    seqs = Sequences([torch.randint(0, V, (40,), generator=gen) for _ in range(6)], [0] * 6, ["window"] * 6)
    tokenizer = types.SimpleNamespace(bos_token_id=0, eos_token_id=0, pad_token_id=None, unk_token_id=None)
    cfg = HeadConfig("toy", draft_vocab_size=48, data=HeadDataConfig(heldout_every=3), eval_depth=3, budget_s=600,
                     train=HeadTrainConfig(steps=4, rows=32, warmup=1), feature_dtype="float32", top_k=4)
    head, facts = zoo_heads.build_head(target, tokenizer, cfg, tmp_path, sequences=seqs, cost_reps=2)
    assert isinstance(head, ToyHead) and facts["kind"] == "toy" and facts["feature_layers"] == [8]
    assert facts["steps_done"] == 4 and len(facts["heldout"]["all"]["top1"]) == 1  # evaluated to max_depth
    assert facts["n_trainable"] == 32 * 48 and facts["costs"]["c"] > 0
    loaded = zoo_heads.load_head(tmp_path / "head", target)
    assert isinstance(loaded, ToyHead)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), head.state_dict().values()))
    assert evaluate_head(target, loaded, seqs, depth=3)["depth"] == 1

    monkeypatch.setattr(paths, "RUNS_DIR", tmp_path)
    pair = types.SimpleNamespace(name="mini", target=target, drafts={}, heads={"t": loaded})
    got = pair_costs(pair, ["t"], 2, context=16, reps=2, overhead=False)
    assert got["t"]["c"] > 0 and got["t"]["key"]["head"]["kind"] == "toy"
    drafter = make_drafter("t", pair)
    assert isinstance(drafter, ToyDrafter)
    prompt = [5, 9, 33, 2, 17]
    ar = AutoregressiveDecoder(CausalLMAdapter(target), sampling=GREEDY, eos_token_id=[]).generate(prompt, 12)
    spec = SpeculativeDecoder(CausalLMAdapter(target), drafter, gamma=3, sampling=GREEDY, eos_token_id=[])
    assert spec.generate(prompt, 12).tokens == ar.tokens


def test_a_spade_head_folder_is_checked_when_it_loads(target, tmp_path):
    """Issue 57: every head's state dict is checked before it loads (DraftHead.load_state_dict, which the zoo's
    load_head calls): shape against the config, floating weights, integer maps, finite weights, each error
    starting with the tensor's key; a config's fields are checked by type and name (no bare KeyError or int())."""
    from safetensors.torch import load_file, save_file

    from spade_lib.decoding.drafts.eagle import EagleConfig
    from spade_lib.decoding.drafts.medusa import MedusaHead

    head = MedusaHead.from_target(target, num_heads=2)
    folder = zoo_heads.save_head(head, tmp_path / "m")
    assert zoo_heads.load_head(folder, target) is not None
    state = load_file(str(folder / "model.safetensors"))
    key = "heads.0.1.weight"
    for tensors, error, match in (({key: torch.full_like(state[key], float("nan"))}, ValueError, f"^{key}: .*model.safetensors holds NaN"),
                                  ({key: state[key][:-1]}, ValueError, rf"^{key}: .*model.safetensors has shape .*the head's config gives"),
                                  ({key: state[key].long()}, TypeError, f"^{key}: .*model.safetensors holds torch.int64"),
                                  ({"d2t": state["d2t"].double()}, TypeError, "^d2t: .*model.safetensors holds torch.float64")):
        save_file({**state, **tensors}, str(folder / "model.safetensors"))
        with pytest.raises(error, match=match):
            zoo_heads.load_head(folder, target)
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="folder: .* has no config.json"):
        zoo_heads.load_head(folder, target)
    with pytest.raises(TypeError, match="draft_vocab_size: must be an integer >= 1, got 'abc'"):
        MedusaConfig(hidden_size=8, vocab_size=16, feature_layer=2, draft_vocab_size="abc")
    with pytest.raises(ValueError, match=r"config: lacks the required MedusaConfig fields \['vocab_size'\]"):
        MedusaConfig.from_dict({"hidden_size": 8, "feature_layer": 2})
    layer = {"vocab_size": 16, "hidden_size": 8, "num_attention_heads": 2}
    with pytest.raises(ValueError, match=r"config: lacks the required EagleConfig fields \['draft_vocab_size'\]"):
        EagleConfig.from_dict({"layer": layer, "feature_layers": [1]})
    with pytest.raises(TypeError, match="feature_layers\\[0\\]: must be an integer"):
        EagleConfig(layer=layer, feature_layers=["x"], draft_vocab_size=16)
