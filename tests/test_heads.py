"""Building draft heads offline: the losses against their definitions, and a smoke build of every kind
on a tiny random Llama target (seconds): cached, hashed, reproducible, loadable, with its manifest."""

import dataclasses
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib import paths
from spade_lib.decoding.drafts.eagle import EagleHead
from spade_lib.decoding.drafts.medusa import MedusaHead
from spade_lib.zoo.cache import read_manifest, sha256_file
from spade_lib.zoo.configs import TokenizerConfig
from spade_lib.zoo.head_data import HeadDataConfig, Sequences, extract
from spade_lib.zoo.head_train import (HeadTrainConfig, _eagle_batch, draft_index, eagle_loss, soft_ce, soft_labels)
from spade_lib.zoo.heads import PROFILES, build_head, head_config, head_entry, load_head
from spade_lib.zoo.tokenizer import train_tokenizer

TEXTS = ["def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n    return a + b\n",
         "class Box:\n    def __init__(self, size):\n        self.size = size\n",
         "Explain this: a cache keeps what was computed so that it is not computed again.",
         "for i in range(10):\n    print(i * i)\n", "import os\npath = os.path.join('a', 'b')\n",
         "def mean(xs):\n    return sum(xs) / len(xs)\n"]
DOCS = [t * 12 for t in TEXTS]
SMOKE_DATA = HeadDataConfig(n_prompts=6, gen_tokens=10, gen_batch=3, n_windows=6, window=40, max_prompt_tokens=400,
                            heldout_every=3)
SMOKE_TRAIN = HeadTrainConfig(steps=8, batch_size=2, seq_len=24, rows=64, warmup=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama target (8 layers, so EAGLE-3's default layers 2/4/5 exist) and a tokenizer, saved."""
    folder = tmp_path_factory.mktemp("target")
    tok = train_tokenizer(TEXTS * 4, TokenizerConfig(vocab_size=320, min_frequency=1))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    target = LlamaForCausalLM(cfg).eval()
    target.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, target, tok


def smoke(kind, **changes):
    return head_config(kind, "make", data=SMOKE_DATA, train=SMOKE_TRAIN, draft_vocab_size=120, budget_s=120,
                       threads=1, eval_depth=3, **changes)


def test_profiles_fit_the_brief():
    for kind, cfg in PROFILES["make"].items():
        assert cfg.budget_s <= 480 and cfg.kind == kind
    assert PROFILES["make"]["eagle3"].train.ttt_steps >= 3
    assert all(cfg.budget_s > 480 for cfg in PROFILES["long"].values())
    with pytest.raises(ValueError, match="kind"):
        head_config("eagle2")
    with pytest.raises(ValueError, match="profile"):
        head_config("eagle3", "huge")


def test_soft_labels_are_the_targets_exact_probabilities():
    logits = torch.randn(5, 50)
    topv, topi = logits.topk(8, dim=-1)
    index = torch.full((50,), -1, dtype=torch.long)
    index[:30] = torch.arange(30)
    rows, p = soft_labels(topv.half(), topi.int(), logits.logsumexp(-1), index)
    expect = torch.softmax(logits, -1).gather(-1, topi)
    expect = torch.where(topi < 30, expect, torch.zeros_like(expect))
    torch.testing.assert_close(p, expect, rtol=2e-3, atol=1e-4)  # fp16 logits
    q_logits = torch.randn(5, 30)
    ce = soft_ce(q_logits, rows, p)
    ref = -(expect * torch.log_softmax(q_logits, -1)[torch.arange(5)[:, None], rows]).sum(-1)
    torch.testing.assert_close(ce, ref, rtol=2e-3, atol=1e-4)


def test_eagle_loss_is_the_0_8_weighted_sum_of_the_unrolled_steps(tiny):
    _, target, _ = tiny
    torch.manual_seed(0)
    head = EagleHead.from_target(target)
    seqs = Sequences([torch.randint(0, target.config.vocab_size, (n,)) for n in (20, 13)], [0, 0], ["window"] * 2)
    data = extract(target, seqs, head.config.feature_layers, top_k=8, feature_dtype=torch.float32)
    cfg = HeadTrainConfig(seq_len=16, ttt_steps=3)
    batch = _eagle_batch(data, [0, 1], cfg, torch.Generator().manual_seed(0), draft_index(head), False)
    loss = eagle_loss(head, batch, cfg)
    logits, _ = head.unrolled(batch["feats"], batch["tokens"], steps=3)
    parts = [soft_ce(logits[i], batch["rows"][i], batch["p"][i])[batch["mask"][i]].mean() for i in range(3)]
    torch.testing.assert_close(loss, parts[0] + 0.8 * parts[1] + 0.64 * parts[2])
    # the label of step i at t is the target's p at position a + 1 + i + t: check one against extract
    assert batch["mask"][2].sum() < batch["mask"][0].sum()  # deeper steps run out of labels first


@pytest.mark.parametrize("kind", ["eagle3", "eagle1", "medusa"])
def test_smoke_build_is_cached_reproducible_and_loads(tiny, tmp_path, monkeypatch, kind):
    folder, target, _ = tiny
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path / "cache")
    cfg = smoke(kind)
    entry = head_entry(folder, "tiny", cfg, prompts=TEXTS, documents=DOCS)
    m = read_manifest(entry)
    assert m["kind"] == f"head-{kind}" and m["steps_done"] == SMOKE_TRAIN.steps and m["budget_hit"] is False
    assert m["data"]["generations"] > 0 and m["data"]["windows"] > 0 and m["draft_vocab_size"] == 120
    assert len(m["heldout"]["all"]["top1"]) == 3 and all(0 <= a <= 1 for a in m["heldout"]["all"]["alpha_lb"])
    assert m["costs"]["c"] > 0 and m["seconds"]["total"] < cfg.budget_s
    head = load_head(entry / "head", target)
    assert isinstance(head, MedusaHead if kind == "medusa" else EagleHead)
    if kind == "eagle3":  # stored in vLLM's format
        assert json.loads((entry / "head" / "config.json").read_text())["speculators_model_type"] == "eagle3"
    # cached: a second call finds the entry; rebuilt: the same bytes (seeded, one thread)
    assert head_entry(folder, "tiny", cfg, prompts=TEXTS, documents=DOCS) == entry
    weights = sha256_file(entry / "head" / "model.safetensors")
    again = head_entry(folder, "tiny", cfg, prompts=TEXTS, documents=DOCS, rebuild=True)
    assert sha256_file(again / "head" / "model.safetensors") == weights


def test_the_budget_guard_stops_training_and_says_so(tiny):
    _, target, tok = tiny
    cfg = dataclasses.replace(smoke("eagle3"), budget_s=1e-6)
    seqs = Sequences([torch.randint(0, target.config.vocab_size, (30,)) for _ in range(6)], [0] * 6, ["window"] * 6)
    head, facts = build_head(target, tok, cfg, sequences=seqs, cost_reps=1)
    assert facts["budget_hit"] is True and facts["steps_done"] == 0
