"""spade_lib.decoding.kernels and the lean forward's use of it: every candidate computes x W^T + b, the
fastest whole forward is kept per row class and cached per machine, bad policies are refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib import paths
from spade_lib.decoding import kernels
from spade_lib.decoding.lean import LeanForward

PACKABLE = kernels.packing_available(torch.device("cpu"), torch.float32)


@pytest.fixture()
def fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(kernels, "_CHOSEN", {})
    return tmp_path


def llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        initializer_range=0.2)).eval()


@pytest.mark.parametrize("name", list(kernels.CANDIDATES))
def test_every_candidate_computes_the_same_product(name):
    if name != "mkl" and not PACKABLE:
        pytest.skip("oneDNN packing is not available in this torch build")
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(48, 32, generator=g), torch.randn(48, generator=g)
    k = kernels.Kernel(name, kernels.prepare(name, w), b)
    rows = (1,) if name == "onednn_pad2" else (1, 5)
    with torch.inference_mode():
        for n in rows:
            x = torch.randn(n, 32, generator=g)
            torch.testing.assert_close(k(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_choose_keeps_the_fastest_per_row_class_and_caches_it(fresh):
    fake = {("one", "mkl"): 3.0, ("one", "onednn"): 1.0, ("one", "onednn_pad2"): 2.0,
            ("many", "mkl"): 1.0, ("many", "onednn"): 5.0}
    calls = []

    def timer(rows, name):
        calls.append((rows, name))
        return fake[(rows, name)]

    hit = kernels.choose({"shapes": [1, 2]}, timer)
    assert (hit["one"], hit["many"]) == ("onednn", "mkl") and sorted(calls) == sorted(fake)
    assert hit["threads"] == torch.get_num_threads() and hit["seconds"]["one"]["mkl"] == 3.0
    assert kernels.choices()[0]["one"] == "onednn"
    kernels._CHOSEN.clear()  # another process on this machine reads the disk cache instead of timing again
    assert kernels.choose({"shapes": [1, 2]}, lambda *a: pytest.fail("timed again"))["many"] == "mkl"
    assert (fresh / "kernels" / "choices.json").is_file()


def test_lean_forward_installs_the_chosen_kernels_and_matches_every_policy(fresh):
    model = llama()
    ids = torch.randint(0, 96, (7,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = model(ids[None], use_cache=False).logits[0]
        for policy in ["auto", "legacy", "mkl"] + (["onednn", "onednn_pad2"] if PACKABLE else []):
            lean = LeanForward(model, 64, kernels=policy)
            got = torch.cat([lean.forward(ids[:4]), lean.forward(ids[4:5]), lean.forward(ids[5:])])
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
            names = lean.kernel_names
            assert set(names) == {"one", "many"}
            if policy == "legacy":
                assert names == {"one": "mkl", "many": "onednn" if PACKABLE else "mkl"}
            if policy == "auto" and PACKABLE:
                chosen = kernels.choices()[-1]
                assert names == {r: min(chosen["seconds"][r], key=chosen["seconds"][r].get) for r in ("one", "many")}
            assert not lean._prepared  # the copies not installed are freed


def test_bad_policy_is_refused(fresh):
    with pytest.raises(ValueError, match="kernels: must be one of"):
        LeanForward(llama(), 64, kernels="fastest")
    with pytest.raises(ValueError, match="policy: 'onednn' needs oneDNN"):
        kernels.fixed("onednn", packable=False)
    with pytest.raises(ValueError, match="policy: must be one of"):
        kernels.fixed("auto", packable=True)


def test_sessions_record_the_chosen_kernels_and_the_identity_does_not(fresh):
    from spade_lib.runs.timing import environment_fingerprint, kernel_plans

    LeanForward(llama(), 64, kernels="auto")
    assert "linear_kernels" not in environment_fingerprint("cpu")  # the run identity must not hang on history
    if PACKABLE:
        assert {"one", "many", "shapes", "threads"} <= set(kernel_plans()[-1])
