"""benchmarks/bench_llamacpp.py without building llama.cpp: its arguments, the two programs' reports read into
figures (the lines as llama.cpp prints them), and a failed build or run named. (Building and running llama.cpp is
the benchmark's own work, minutes long: not a test.)"""

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_llamacpp")


AR_LOG = """def add(a, b):
    return a + b
0.01.490.280 I common_perf_print:    sampling time =       2.10 ms
0.01.490.289 I common_perf_print: prompt eval time =     812.40 ms /   131 tokens (    6.20 ms per token,   161.25 tokens per second)
0.01.490.317 I common_perf_print:        eval time =    1504.70 ms /    47 runs   (   32.01 ms per token,    31.24 tokens per second)
0.01.490.320 I common_perf_print:       total time =    2330.12 ms /   178 tokens
"""

SPEC_LOG = """0.02.548.261 I encoded  131 tokens in    1.102 seconds, speed:  118.874 t/s
0.02.548.270 I decoded   48 tokens in    1.250 seconds, speed:   38.400 t/s
0.02.548.279 I n_draft   = 4
0.02.548.283 I n_predict = 48
0.02.548.287 I n_drafted = 52
0.02.548.291 I n_accept  = 35
0.02.548.295 I accept    = 67.308%
"""


def test_the_reports_are_read_into_figures(bench):
    assert bench.read_ar(AR_LOG) == pytest.approx({"prompt_s": 0.8124, "gen_s": 1.5047, "tokens": 48})
    assert bench.read_spec(SPEC_LOG) == {"prompt_s": 1.102, "gen_s": 1.25, "tokens": 48, "drafted": 52,
                                         "accepted": 35}


def test_a_report_without_its_figures_is_refused_by_name(bench):
    with pytest.raises(RuntimeError, match="llama-completion: no .*prompt eval time"):
        bench.read_ar("0.01.490.317 I common_perf_print:        eval time =  1.0 ms /  3 runs")
    with pytest.raises(RuntimeError, match="llama-completion: no .*eval time"):  # "prompt eval" is not "eval"
        bench.read_ar(AR_LOG.splitlines()[3])
    with pytest.raises(RuntimeError, match="llama-speculative-simple: no .*n_drafted"):
        bench.read_spec(SPEC_LOG.replace("n_drafted", "drafted"))


def test_costs_are_read_from_llama_benchs_json(bench, tmp_path, monkeypatch):
    """c = a draft token's seconds over a target token's, r(gamma) = one gamma + 1-token batch's over a target
    token's: llama-bench reports tokens per second, a generation's per token and a prompt's per batch."""
    import json
    import subprocess

    ggufs = {"target": tmp_path / "t.gguf", "draft": tmp_path / "d.gguf"}
    rows = [{"model_filename": str(ggufs["target"]), "n_prompt": 0, "n_gen": 16, "avg_ts": 16.0},
            {"model_filename": str(ggufs["target"]), "n_prompt": 5, "n_gen": 0, "avg_ts": 50.0},
            {"model_filename": str(ggufs["draft"]), "n_prompt": 0, "n_gen": 16, "avg_ts": 40.0},
            {"model_filename": str(ggufs["draft"]), "n_prompt": 5, "n_gen": 0, "avg_ts": 100.0}]
    seen = []

    def run(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, json.dumps(rows), "")

    monkeypatch.setattr(bench.subprocess, "run", run)
    cost = bench.costs(tmp_path, ggufs, 4, "2")
    assert cost == pytest.approx({"t_target": 1 / 16, "t_draft": 1 / 40, "t_verify": 5 / 50, "c": 0.4, "r": 1.6})
    assert seen[0][seen[0].index("-p") + 1] == "5" and seen[0][seen[0].index("-t") + 1] == "2"
    monkeypatch.setattr(bench.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "boom"))
    with pytest.raises(RuntimeError, match="llama-bench exited 1:\nboom"):
        bench.costs(tmp_path, ggufs, 4, "2")


def test_a_missing_cmake_is_named_before_anything_is_downloaded(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: pytest.fail("nothing may run without cmake"))
    with pytest.raises(RuntimeError, match="cmake: not found"):
        bench.build(tmp_path / "llamacpp")
    bin_dir = tmp_path / "built" / "build" / "bin"  # built before: found, nothing built
    bin_dir.mkdir(parents=True)
    for program in bench.PROGRAMS:
        (bin_dir / program).write_text("")
    assert bench.build(tmp_path / "built") == bin_dir


def test_bad_arguments_are_refused_by_name(bench, capsys):
    for argv, message in ((["--prompts", "0"], "--prompts: must be >= 1, got 0"),
                          (["--gamma", "0"], "--gamma: must be >= 1, got 0"),
                          (["--tokens", "-3"], "--tokens: must be >= 1, got -3"),
                          (["--threads", "-1"], "--threads: must be >= 0, got -1")):
        with pytest.raises(SystemExit):
            bench.parse(argv)
        assert message in capsys.readouterr().err


def test_end_to_end_rates_are_for_the_same_number_of_tokens(bench):
    """The speculative loop's extra tokens (it overshoots -n) speed up its generation rate but do not spread its
    prompt's cost: end to end, both programs are priced for the AR run's token count."""
    ar = {"prompt_s": 1.0, "gen_s": 3.0, "tokens": 30}
    spec = {"prompt_s": 1.0, "gen_s": 4.0, "tokens": 40}  # the same rate, 10 tokens more
    assert bench.end_to_end(ar, 30) == pytest.approx({"end_to_end": 30 / 4.0, "generation": 10.0})
    assert bench.end_to_end(spec, 30) == pytest.approx(bench.end_to_end(ar, 30))  # not 40 / 5 = 8 tok/s
