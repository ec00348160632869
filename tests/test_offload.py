"""Big targets: load_pair(..., device_map=, max_memory=, offload_folder=) through accelerate.

On CPU a ``max_memory`` of 300 kB leaves room for the tiny target's embeddings (128 kB, tied to its
output layer) plus accelerate's reserve for one layer, so its decoder layers go to disk offload. The
offloaded target must compute the same logits bit for bit, and greedy speculative decoding on it must
reproduce greedy autoregressive decoding of the ordinary target token for token.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from spade_lib.bench import Suite
from spade_lib.runs import runner, trace
from spade_lib.runs.config import RunConfig
from spade_lib.runs.store import read_summary
from spade_lib.zoo.loading import first_device

pytest.importorskip("accelerate")

CPU_BUDGET = 300_000  # bytes: embeddings + accelerate's one-layer reserve, not the layers themselves


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    from spade_lib.zoo.pairs import load_pair

    offload = tmp_path_factory.mktemp("offload")
    big = load_pair("tiny", device_map="auto", max_memory={"cpu": CPU_BUDGET}, offload_folder=offload)
    return big, load_pair("tiny")


def test_part_of_the_target_is_offloaded_to_disk(pairs):
    big, _ = pairs
    placed = big.target.hf_device_map
    assert "disk" in placed.values() and "cpu" in placed.values(), placed
    assert first_device(big.target) == torch.device("cpu")
    assert {next(d.parameters()).device for d in big.drafts.values()} == {torch.device("cpu")}


def test_offloaded_logits_are_identical(pairs):
    big, plain = pairs
    ids = torch.arange(3, 40)[None]
    with torch.inference_mode():
        assert torch.equal(big.target(ids).logits, plain.target(ids).logits)


SUITE = Suite("offload", [{"question_id": i, "category": "c", "turns": [t]} for i, t in
                          enumerate(["def add(a, b):\n    return", "The module provides functions for"])], {})


def cfg(**kw) -> RunConfig:
    return RunConfig(**{"max_new_tokens": 24, "device": "cpu", "threads": 1, "warmup": 0,
                        "chat_template": False, **kw})


def test_greedy_on_the_offloaded_target_equals_autoregressive(pairs, tmp_path):
    big, plain = pairs
    spade = read_summary(runner.run_suite(big, SUITE, cfg(), tmp_path / "big", progress=False))
    ar = read_summary(runner.run_suite(plain, SUITE, cfg(method="ar"), tmp_path / "ar", progress=False))
    assert spade["output_ids"].tolist() == ar["output_ids"].tolist()
    assert (spade["n_steps"] > 0).all() and len(trace.read_trace(tmp_path / "big")) > 0  # drafts were verified


def test_sampled_trace_on_the_offloaded_target_is_identical(pairs, tmp_path):
    """The tiny target's greedy continuation is degenerate (one token repeated); at T = 1 every drafted
    token, uniform and accept/reject decision must match the ordinary target's exactly, and every
    statistic (p_x, TV, KL, ...) to fp32 summation order: the offloaded target runs the Hugging Face
    forward, the ordinary one SPADE's lean forward on the native kernels, which sum in another order."""
    big, plain = pairs
    runs = [runner.run_suite(pair, SUITE, cfg(temperature=1.0), tmp_path / name, progress=False)
            for name, pair in (("big", big), ("plain", plain))]
    a, b = (trace.read_trace(d).drop(columns=trace.TIMING_COLUMNS) for d in runs)
    assert len(a) > 0 and a["accepted"].any()
    floats = [c for c in a.columns if pd.api.types.is_float_dtype(a[c])]
    pd.testing.assert_frame_equal(a.drop(columns=floats), b.drop(columns=floats))
    pd.testing.assert_frame_equal(a[floats], b[floats], check_exact=False, rtol=1e-4, atol=1e-5)


def test_first_device_of_a_device_map():
    class Placed(torch.nn.Linear):
        def __init__(self, device_map):
            super().__init__(1, 1)
            self.hf_device_map = device_map

    assert first_device(Placed({"embed": 1, "layers": "cpu", "head": "disk"})) == torch.device("cuda:1")
    assert first_device(Placed({"embed": "cpu", "layers": "disk"})) == torch.device("cpu")
    assert first_device(Placed({"": "mps"})) == torch.device("mps")
    assert first_device(torch.nn.Linear(1, 1)) == torch.device("cpu")


def test_bad_placement_arguments(tmp_path):
    from spade_lib.zoo.pairs import load_pair

    with pytest.raises(ValueError, match="max_memory: only used with device_map"):
        load_pair("tiny", max_memory={"cpu": "1GiB"})
    with pytest.raises(ValueError, match="offload_folder: only used with device_map"):
        load_pair("tiny", offload_folder=tmp_path)
    with pytest.raises(ValueError, match="device: give device= or device_map=, not both"):
        load_pair("tiny", device="cpu", device_map="auto")
    with pytest.raises(ValueError, match="device_map: expected"):
        load_pair("tiny", device_map=3)
    with pytest.raises(ValueError, match="max_memory: the target's first weights"):  # everything on disk
        load_pair("tiny", device_map="auto", max_memory={"cpu": 1000}, offload_folder=tmp_path)
