"""benchmarks/gpu_costs.py on CPU with toy shapes of the same architectures: it builds, times, writes
its CSV (c, r(gamma), predictions labelled as assumed-alpha) and runs the embedded pair end to end."""

import csv

import pytest
import torch


@pytest.fixture(scope="module")
def gpu_costs(load_benchmark):
    return load_benchmark("gpu_costs")


def test_real_shapes_are_the_published_sizes(gpu_costs):
    with torch.device("meta"):
        sizes = {name: sum(p.numel() for p in gpu_costs.build(name, gpu_costs.SHAPES, "meta", torch.bfloat16)
                           .parameters()) / 1e9 for name in gpu_costs.SHAPES}
    assert sizes["qwen2.5-0.5b"] == pytest.approx(0.49, abs=0.02)
    assert sizes["qwen2.5-7b"] == pytest.approx(7.62, abs=0.05)
    assert sizes["llama-3.2-1b"] == pytest.approx(1.24, abs=0.02)
    assert sizes["llama-3.1-8b"] == pytest.approx(8.03, abs=0.05)


def test_tiny_run_writes_the_csv(gpu_costs, tmp_path):
    out = tmp_path / "costs.csv"
    gpu_costs.main(["--device", "cpu", "--shapes", "tiny", "--context", "32", "--max-gamma", "3", "--reps", "2",
                    "--pair", "tiny", "--e2e-prompts", "1", "--e2e-tokens", "8", "--out", str(out)])
    rows = list(csv.DictReader(out.open()))
    assert set(rows[0]) == set(gpu_costs.FIELDS)
    costs = [r for r in rows if r["section"] == "costs"]
    assert {r["pair"] for r in costs} == set(gpu_costs.PAIRS)
    assert all(float(r["value"]) > 0 for r in costs) and sum(r["quantity"] == "r" for r in costs) == 6
    preds = [r for r in rows if r["section"] == "prediction"]
    assert len(preds) == 6 and {r["alpha_source"] for r in preds} == {"assumed"}
    assert all(r["dtype"] == "bfloat16" and r["context"] == "32" for r in rows if r["section"] != "e2e")
    e2e = {r["quantity"]: float(r["value"]) for r in rows if r["section"] == "e2e"}
    assert e2e["greedy_equal_to_ar"] == 1.0 and e2e["speedup"] > 0
