"""benchmarks/bench_decode.py end to end on the tiny pair: it runs, greedy SPADE reproduces AR, and the
last line carries the figures in the agreed format (physical controls included). (No timing thresholds: speed is not tested.)"""

import re

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_decode")


def test_runs_on_the_tiny_pair_and_prints_the_figures(bench, capsys):
    # a physics violation (possible on a model this small, whose forwards are all overhead) exits with
    # status 2 after naming it; either way the last line is printed
    try:
        bench.main(["--pair", "tiny", "--n-per-category", "1", "--max-new-tokens", "8", "--repeats", "1",
                    "--max-gamma", "4"])
        violated = False
    except SystemExit as e:
        assert e.code == 2
        violated = True
    out = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"spade_vs_ar=\d+\.\d{3} spade_vs_hf_assisted=\d+\.\d{3} fraction_of_prediction=\d+\.\d{3} "
                        r"fraction_of_r_aware=\d+\.\d{3} tau=\d+\.\d{3} r_min=\d+\.\d{3} null_vs_ar=\d+\.\d{3}",
                        out[-1]), out[-1]
    assert violated == any(line.startswith("PHYSICS VIOLATION: physical control") for line in out)
    assert any(line.startswith("AR loop: ") and "copy bandwidth" in line for line in out)
    equal = next(line for line in out if "Outputs equal to AR" in line)
    n = int(re.search(r"(\d+) prompts x", equal).group(1))
    assert f"spade {n}," in equal and f"null {n}," in equal  # greedy: SPADE and the null draft reproduce AR
    assert any(line.startswith("costs (") for line in out) and any("load average before" in line for line in out)
    assert any(line.startswith("loop overhead o = ") and "E/(gamma c + r + o)" in line for line in out)


def test_a_draft_that_is_no_model_of_the_targets_vocabulary_is_refused(bench):
    with pytest.raises(SystemExit, match="^--draft: .ngram. is not a draft model of pair .tiny."):
        bench.main(["--pair", "tiny", "--draft", "ngram", "--n-per-category", "1", "--max-new-tokens", "4"])


def test_tree_flag_times_the_tree_beside_the_chain(bench, capsys):
    """--tree adds spade_tree (greedy: equal to AR), prints its tau, nodes, r(N) and paired speedups, and
    leaves the last line as it was."""
    try:
        bench.main(["--pair", "tiny", "--n-per-category", "1", "--max-new-tokens", "8", "--repeats", "1",
                    "--max-gamma", "4", "--tree", "eagle2:nodes=6,depth=3,topk=2"])
    except SystemExit as e:
        assert e.code == 2  # a physics violation, named above the last line
    out = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"spade_vs_ar=\d+\.\d{3} spade_vs_hf_assisted=\d+\.\d{3} fraction_of_prediction=\d+\.\d{3} "
                        r"fraction_of_r_aware=\d+\.\d{3} tau=\d+\.\d{3} r_min=\d+\.\d{3} null_vs_ar=\d+\.\d{3}",
                        out[-1]), out[-1]
    equal = next(line for line in out if "Outputs equal to AR" in line)
    n = int(re.search(r"(\d+) prompts x", equal).group(1))
    assert f"spade_tree {n}," in equal
    assert any(line.startswith("spade_tree ") for line in out)  # its row of the speedup table
    tree = next(line for line in out if line.startswith("tree eagle2:nodes=6,depth=3,topk=2"))
    assert re.search(r"tau=\d+\.\d{3} nodes=\d+\.\d per drafted step \(max (\d+)\) r\(\1\)=\d+\.\d{3}", tree), tree
    assert re.search(r"speedup vs ar \d+\.\d{3} \[\d+\.\d{3}, \d+\.\d{3}\], vs the chain", tree), tree
    for bad in ("oak", "trie", "chain", "eagle2:nodes=x"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--tree", bad])


def test_adaptive_policy_from_measured_costs(bench):
    costs = {"c": 0.1, "r": {g: 1.0 + 0.1 * g for g in range(1, 5)}}
    pol = bench.adaptive_policy(costs, 4, overhead=0.5)
    assert pol.max_gamma == 4 and pol.verify_cost == pytest.approx((1.6, 1.7, 1.8, 1.9))
    assert bench.base_of("spade_g3") == "ar" and bench.base_of("hf_heuristic") == "hf"
