"""The speculators side of tests/test_speculators_format.py, run in a child process (speculators_pkg.py).

    python tests/speculators_ref.py write OUT          an Eagle3DraftModel saved by speculators itself into
                                                       OUT/model, with inputs and its logits in OUT/reference.safetensors
    python tests/speculators_ref.py forward DIR IO OUT  load the folder DIR with speculators and write its
                                                       logits on the inputs of IO into OUT

Logits are those of the model's ``forward`` (the training-time test, 3 steps, eager attention),
caught at ``lm_head``.
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig

V, VD, H, STEPS = 96, 40, 32, 3


def logits_of(model, hidden_states, input_ids):
    caught = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: caught.append(out.detach().clone()))
    with torch.no_grad():
        model.eval()(hidden_states=hidden_states, input_ids=input_ids,
                     document_ids=torch.zeros_like(input_ids), ttt_steps=STEPS)
    hook.remove()
    return {f"logits_{i}": x for i, x in enumerate(caught)}


def write(out: Path) -> None:
    torch.manual_seed(0)
    layer = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        rope_theta=5000.0, rms_norm_eps=1e-5)
    layer._attn_implementation = "eager"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=VD, eagle_aux_hidden_state_layer_ids=[1, 3, 5],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=STEPS)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"])))
    model = Eagle3DraftModel(config)
    ids = torch.randperm(V)[:VD].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    model.load_vocab_mappings(t2d, ids - torch.arange(VD))
    with torch.no_grad():  # norms away from 1, and the NaN-initialised embedding and head set
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
        model.embed_tokens.weight.normal_()
        model.lm_head.weight.normal_(std=0.2)
    model.save_pretrained(out / "model")
    hidden_states, input_ids = torch.randn(1, 11, 3 * H), torch.randint(0, V, (1, 11))
    save_file({"hidden_states": hidden_states, "input_ids": input_ids, **logits_of(model, hidden_states, input_ids)},
              str(out / "reference.safetensors"))


def forward(folder: Path, io: Path, out: Path) -> None:
    config = Eagle3SpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention needs a compiler
    model = Eagle3DraftModel.from_pretrained(folder, config=config)
    inputs = load_file(str(io))
    save_file(logits_of(model, inputs["hidden_states"], inputs["input_ids"]), str(out))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"write": write, "forward": forward}[command](*map(Path, args))
