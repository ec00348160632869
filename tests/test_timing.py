"""Timing: warm-up and repeat counts, summaries, thread fixing, fingerprint, device parsing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from spade_lib import devices
from spade_lib.runs import timing


def test_measure_runs_warmup_then_repeats():
    calls = []
    result, t = timing.measure(lambda: calls.append(1) or len(calls), warmup=2, repeats=3)
    assert len(calls) == 5 and result == 5
    assert len(t.times) == 3 and t.min <= t.median <= t.max
    with pytest.raises(ValueError, match="repeats"):
        timing.measure(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        timing.measure(lambda: None, warmup=-1)


def test_summarize_times():
    t = timing.summarize_times([3.0, 1.0, 2.0, 10.0])
    assert t.median == 2.5 and t.min == 1.0 and t.max == 10.0
    assert (t.q25, t.q75) == (1.75, 4.75)
    assert t.rel_spread == pytest.approx(3.0 / 2.5)
    assert json.loads(json.dumps(t.as_dict()))["times"] == [3.0, 1.0, 2.0, 10.0]
    with pytest.raises(ValueError, match="times"):
        timing.summarize_times([])


def test_fix_threads_is_recorded():
    before = torch.get_num_threads()
    try:
        assert timing.fix_threads(1) == 1
        assert timing.environment_fingerprint()["torch_threads"] == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="threads"):
        timing.fix_threads(0)


def test_fingerprint_is_json_and_complete():
    fp = timing.environment_fingerprint("cpu")
    json.dumps(fp)
    for key in ("cpu_model", "torch", "transformers", "torch_threads", "git_commit", "git_dirty"):
        assert key in fp
    assert fp["torch"] == torch.__version__ and fp["device"] == "cpu"


def test_resolve_device_and_dtype():
    assert devices.resolve_device("cpu") == torch.device("cpu")
    assert devices.resolve_device("auto").type in ("cpu", "cuda")
    with pytest.raises(ValueError, match="device"):
        devices.resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            devices.resolve_device("cuda")
    assert devices.resolve_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        devices.resolve_dtype("float8")
    assert devices.resolve_dtype(torch.float16) is torch.float16 and devices.resolve_dtype("fp32") is torch.float32
    want = r"^dtype: must be one of \['float32', 'bfloat16', 'float16'\], got 'int8'$"
    for bad in ("int8", torch.int8):  # refused here, not by transformers naming the target
        with pytest.raises(ValueError, match=want):
            devices.resolve_dtype(bad)
    for bad in (torch.float64, torch.int64, 8, None):
        with pytest.raises(ValueError, match=r"^dtype: must be one of"):
            devices.resolve_dtype(bad)


def test_streaming_vs_copy_pairs_each_round():
    """streaming_vs_copy calls the step (rounds + 1 warm-up round) x steps times, and its figures are consistent:
    rate = weight bytes / step seconds, ratio within its quartiles, copy a positive bandwidth."""
    from spade_lib.runs import timing

    calls = []
    out = timing.streaming_vs_copy(lambda: calls.append(1), 1000, rounds=5, steps=3, nbytes=1 << 16)
    assert len(calls) == (5 + 1) * 3
    assert set(out) == {"rate", "copy", "ratio", "ratio_q1", "ratio_q3", "step_s"}
    assert out["copy"] > 0 and out["step_s"] > 0
    assert out["ratio_q1"] <= out["ratio"] <= out["ratio_q3"]


def test_stall_rule_flags_a_reading_far_above_the_configurations_others():
    import numpy as np

    rule = timing.StallRule()
    # twelve prompts at ~17-22 ms per token (0.17-0.22 s for 10 tokens); one of them stalled to 198 ms per token
    u = np.array([0.017, 0.019, 0.022, 0.018, 0.020, 0.021, 0.198, 0.019, 0.018, 0.022, 0.017, 0.020])
    assert timing.find_stalls(u, rule).tolist() == [i == 6 for i in range(12)]
    med = float(np.median(u))
    assert rule.threshold(u) >= 1.5 * med  # never below 1.5x the median ...
    clean = np.delete(u, 6)
    assert not timing.find_stalls(clean * np.linspace(1, 1.4, 11), rule, reference=u).any()  # ... nor normal spread
    # a wide but honest spread (prompt lookup: some prompts copy, some do not) raises the threshold with the MAD
    wide = np.array([0.006, 0.009, 0.015, 0.02, 0.011, 0.008, 0.03, 0.012])
    assert not timing.find_stalls(wide, rule).any()
    assert timing.find_stalls(np.append(wide, 0.2), rule)[-1]
    # too few readings: nothing is judged
    assert not timing.find_stalls([0.01, 0.01, 1.0], rule).any()
    assert timing.find_stalls([0.01, 0.01, 1.0], timing.StallRule(min_reference=3)).tolist() == [False, False, True]
    for bad in (dict(k=-1.0), dict(min_excess=float("nan")), dict(min_reference=1), dict(max_retimes=-1),
                dict(max_retimes=True)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            timing.StallRule(**bad)


def test_pause_rule_judges_rounds_against_the_session_spread_and_the_clock_for_gaps():
    rule = timing.PauseRule()
    assert rule.round_limit([]) == pytest.approx(np.log(1.5))  # too few deviations: the floor alone
    noisy = np.tile([-0.3, 0.3], 8)  # a noisy host: rounds spread by +-35 %, MAD 0.3
    assert rule.round_limit(noisy) == pytest.approx(5 * 1.4826 * 0.3)
    # one round 30 s beyond its siblings of ~0.1 s: caught; a prompt slow in every round: not
    limit = rule.round_limit([])
    assert timing.paused_rounds([0.1, 30.1, 0.102], limit, rule.gap).tolist() == [False, True, False]
    assert timing.paused_rounds([0.1, 30.1], limit, rule.gap).tolist() == [False, True]  # two rounds suffice
    assert not timing.paused_rounds([2.0, 2.1, 1.95], limit, rule.gap).any()
    # a scheduler quantum doubling a 20 ms reading is no host pause: below gap seconds
    assert not timing.paused_rounds([0.02, 0.045, 0.021], limit, rule.gap).any()
    assert timing.paused_rounds([0.02, 0.045, 0.021], limit).tolist() == [False, True, False]
    assert not timing.paused_rounds([0.1], 0.0).any()  # one round: nothing to compare with
    # each round against the median of the others
    assert timing.round_deviations([1.0, 2.0, 4.0]).tolist() == pytest.approx([np.log(1 / 3), np.log(2 / 2.5), np.log(4 / 1.5)])
    assert timing.clock_gaps([(0.0, 0.1), (0.1, 0.2), (30.2, 30.3)], 0.5) == [(2, pytest.approx(30.0))]
    assert timing.impossible_prefill(0.298, 0.119) and not timing.impossible_prefill(0.01, 0.119)
    assert not timing.impossible_prefill(float("nan"), 0.1)  # hidden (HF): not judged
    for bad in (dict(gap=-1.0), dict(k=float("nan")), dict(min_reference=1), dict(max_retimes=-1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            timing.PauseRule(**bad)
