"""Spec-Bench answer files: SPADE runs exported and scored with speed.py's arithmetic; import of fixtures.

``speed_py`` below re-implements the arithmetic of Spec-Bench's ``evaluation/speed.py`` (read, not
copied): per answer, the method's ``sum(new_tokens) / sum(wall_time)`` and the baseline's re-tokenised
token count ``sum(len(tokenizer(turn).input_ids) - 1)`` over ``sum(wall_time)``, both over
``choices[0]``; the speedup is the ratio of the two means, tau the mean of all ``accept_lengths``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from spade_lib.bench import MT_BENCH_CATEGORIES, Suite
from spade_lib.runs import metrics, runner, specbench
from spade_lib.runs.config import RunConfig
from spade_lib.runs.specbench import read_specbench_answers, write_specbench_answers
from spade_lib.runs.store import read_summary

N_NEW = 16
CATEGORIES = ["writing", "coding", "translation"]


def speed_py(jsonl_file, jsonl_file_base, tokenizer, task):
    """speed.py's numbers for one task: (tau, method tok/s, baseline tok/s, speedup)."""

    def select(path):
        rows = [json.loads(line) for line in open(path, encoding="utf-8")]
        if task == "overall":
            return rows
        if task == "mt_bench":
            return [r for r in rows if r["category"] in MT_BENCH_CATEGORIES]
        return [r for r in rows if r["category"] == task]

    speeds, lengths = [], []
    for r in select(jsonl_file):
        c = r["choices"][0]
        speeds.append(sum(c["new_tokens"]) / sum(c["wall_time"]))
        lengths.extend(c["accept_lengths"])
    speeds0 = []
    for r in select(jsonl_file_base):
        c = r["choices"][0]
        tokens = sum(len(tokenizer(t).input_ids) - 1 for t in c["turns"])
        speeds0.append(tokens / sum(c["wall_time"]))
    return (float(np.mean(lengths)), float(np.mean(speeds)), float(np.mean(speeds0)),
            float(np.mean(speeds) / np.mean(speeds0)))


def mini_suite() -> Suite:
    texts = ["Write a short note about", "def add(a, b):\n    return", "Translate: the cat sleeps on the"]
    rows = [{"question_id": i, "category": CATEGORIES[i % 3], "turns": [f"{texts[i % 3]} {i}"]} for i in range(6)]
    return Suite("mini", rows, {})


@pytest.fixture(scope="module")
def pair():
    from spade_lib.zoo.pairs import load_pair

    before = torch.get_num_threads()
    yield load_pair("tiny")
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def bos_tokenizer(pair):
    """The pair's tokenizer as speed.py loads one (AutoTokenizer), with the BOS its Llama tokenizers add."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(pair.path / "target", add_bos_token=True)
    assert tok("").input_ids == [tok.bos_token_id]
    return tok


@pytest.fixture(scope="module")
def runs(pair, tmp_path_factory):
    """Spade and AR runs of the same suite, greedy and sampled (2 samples), exported."""
    root = tmp_path_factory.mktemp("specbench")
    suite = mini_suite()
    out = {}
    for name, kw in {"greedy": dict(temperature=0.0), "sampled": dict(temperature=1.0, n_samples=2)}.items():
        for method in ("spade", "ar"):
            c = RunConfig(method=method, gamma=3, max_new_tokens=N_NEW, device="cpu", threads=1,
                          warmup=0, **kw)
            d = runner.run_suite(pair, suite, c, root / f"{name}-{method}", progress=False)
            out[name, method] = SimpleNamespace(dir=d, summary=read_summary(d),
                                                file=write_specbench_answers(d, root / f"{name}-{method}.jsonl"))
    return out


def tasks(summary: pd.DataFrame):
    """speed.py's tasks present in a summary, with their row masks."""
    for cat in CATEGORIES:
        yield cat, summary["category"] == cat
    yield "mt_bench", summary["category"].isin(MT_BENCH_CATEGORIES)
    yield "overall", summary["category"].notna()


def test_export_has_specbench_shape(runs):
    for (name, method), r in runs.items():
        lines = [json.loads(x) for x in r.file.read_text(encoding="utf-8").splitlines()]
        n_samples = 2 if name == "sampled" else 1
        assert [x["question_id"] for x in lines] == list(range(6))
        for line in lines:
            assert sorted(line) == sorted(specbench.ANSWER_KEYS)
            assert line["category"] == CATEGORIES[line["question_id"] % 3]
            assert len(line["answer_id"]) == 22 and isinstance(line["tstamp"], float)
            assert line["model_id"] == f"tiny-{'spade-distilled-g3' if method == 'spade' else 'ar'}-" \
                                       f"T{0 if name == 'greedy' else 1}-float32"
            assert [c["index"] for c in line["choices"]] == list(range(n_samples))
            for c in line["choices"]:
                assert sorted(c) == sorted(specbench.CHOICE_KEYS)
                assert all(len(c[k]) == 1 for k in ("turns", "decoding_steps", "new_tokens", "wall_time"))
                assert isinstance(c["turns"][0], str) and c["wall_time"][0] > 0
                assert c["decoding_steps"] == [len(c["accept_lengths"])]
                assert sum(c["accept_lengths"]) >= c["new_tokens"][0] == N_NEW  # the last block may be cut
                if method == "ar":
                    assert c["accept_lengths"] == [1] * N_NEW
    # deterministic: the same run exports the same bytes; a folder gets <model_id>.jsonl
    r = runs["greedy", "spade"]
    (r.file.parent / "again").mkdir()
    again = write_specbench_answers(r.dir, r.file.parent / "again")
    assert again.name == "tiny-spade-distilled-g3-T0-float32.jsonl" and again.read_bytes() == r.file.read_bytes()


def test_export_errors(tmp_path, runs):
    with pytest.raises(FileNotFoundError, match="run_dir"):
        write_specbench_answers(tmp_path, tmp_path / "x.jsonl")
    with pytest.raises(ValueError, match="path"):
        write_specbench_answers(runs["greedy", "ar"].dir, tmp_path / "x.txt")
    with pytest.raises(ValueError, match="model_id"):
        write_specbench_answers(runs["greedy", "ar"].dir, tmp_path / "x.jsonl", model_id="")


def test_speed_py_equals_spade_metrics_greedy(runs, bos_tokenizer):
    """Greedy runs: speed.py on the exported files gives exactly SPADE's tau and throughputs where the
    baseline's text re-tokenises to its token count (speed.py counts the baseline's tokens by
    re-tokenising its text); where it does not, speed.py's baseline rate is that re-tokenised count."""
    m, b = runs["greedy", "spade"], runs["greedy", "ar"]
    retok = np.array([len(bos_tokenizer(t).input_ids) - 1 for t in b.summary["text"]])
    roundtrip = retok == b.summary["new_tokens"].to_numpy()
    with_tok = read_specbench_answers(m.file, baseline=b.file, tokenizer=bos_tokenizer).summary.set_index("category")
    for task, mask in tasks(m.summary):
        tau, tps, tps0, speedup = speed_py(m.file, b.file, bos_tokenizer, task)
        ms, bs = m.summary[mask], b.summary[mask]
        b_mask = np.asarray(mask)
        assert tau == pytest.approx(metrics.mean_accepted_length(ms), rel=1e-12)
        assert tps == pytest.approx(metrics.tokens_per_second(ms, per_generation=True).mean(), rel=1e-12)
        assert tps0 == pytest.approx(np.mean(retok[b_mask] / bs["wall_time"].to_numpy()), rel=1e-12)
        assert speedup == pytest.approx(tps / tps0, rel=1e-12)
        # the import, given the tokenizer, reproduces speed.py exactly
        assert (with_tok.loc[task, "tau"], with_tok.loc[task, "tokens_per_s"], with_tok.loc[task, "baseline_tokens_per_s"],
                with_tok.loc[task, "speedup"]) == pytest.approx((tau, tps, tps0, speedup), rel=1e-12)
        if not roundtrip[b_mask].all():
            continue
        # where the text round-trips, speed.py's numbers are SPADE's, and so are the import's without it
        assert tps0 == pytest.approx(metrics.tokens_per_second(bs, per_generation=True).mean(), rel=1e-12)
        row = read_specbench_answers(m.file, baseline=b.file).summary.set_index("category").loc[task]
        assert (row["tau"], row["tokens_per_s"], row["baseline_tokens_per_s"], row["speedup"]) == \
            pytest.approx((tau, tps, tps0, speedup), rel=1e-12)
        assert row["speedup_ratio_of_totals"] == pytest.approx(metrics.speedup_ratio_of_totals(ms, bs), rel=1e-12)
        assert row["speedup_mean_of_ratios"] == pytest.approx(metrics.speedup_mean_of_ratios(ms, bs), rel=1e-12)


def test_speed_py_on_sampled_runs(runs, bos_tokenizer):
    """Sampled runs, 2 samples: speed.py reads choices[0] (= sample 0). Its tau and method tok/s equal
    SPADE's; its baseline count re-tokenises text, which the import reproduces given the tokenizer, and
    which without it uses new_tokens (SPADE's count)."""
    m, b = runs["sampled", "spade"], runs["sampled", "ar"]
    m0, b0 = (r.summary[r.summary["sample"] == 0].reset_index(drop=True) for r in (m, b))
    with_tok = read_specbench_answers(m.file, baseline=b.file, tokenizer=bos_tokenizer).summary.set_index("category")
    plain = read_specbench_answers(m.file, baseline=b.file).summary.set_index("category")
    for task, mask in tasks(m0):
        tau, tps, tps0, speedup = speed_py(m.file, b.file, bos_tokenizer, task)
        assert tau == pytest.approx(metrics.mean_accepted_length(m0[mask]), rel=1e-12)
        assert tps == pytest.approx(metrics.tokens_per_second(m0[mask], per_generation=True).mean(), rel=1e-12)
        assert (with_tok.loc[task, "baseline_tokens_per_s"], with_tok.loc[task, "speedup"]) == \
            pytest.approx((tps0, speedup), rel=1e-12)
        assert plain.loc[task, "baseline_tokens_per_s"] == \
            pytest.approx(metrics.tokens_per_second(b0[mask], per_generation=True).mean(), rel=1e-12)
        assert plain.loc[task, "speedup_ratio_of_totals"] == \
            pytest.approx(metrics.speedup_ratio_of_totals(m0[mask], b0[mask]), rel=1e-12)
    # every choice: all samples, paired by (question_id, sample)
    every = read_specbench_answers(m.file, baseline=b.file, choice=None).summary.set_index("category")
    assert every.loc["overall", "generations"] == 12
    assert every.loc["overall", "tau"] == pytest.approx(metrics.mean_accepted_length(m.summary), rel=1e-12)
    assert every.loc["overall", "speedup_mean_of_ratios"] == \
        pytest.approx(metrics.speedup_mean_of_ratios(m.summary, b.summary), rel=1e-12)


# ---------------------------------------------------------------- import of fixture files


def answer(qid, category, model_id, turns, new_tokens, wall_time, accept_lengths):
    """One answer line in Spec-Bench's documented shape (evaluation/eval.py)."""
    return {"question_id": qid, "category": category, "answer_id": f"id{qid}", "model_id": model_id,
            "choices": [{"index": 0, "turns": turns, "decoding_steps": [len(accept_lengths)],
                         "new_tokens": new_tokens, "wall_time": wall_time, "accept_lengths": accept_lengths}],
            "tstamp": 1.7e9}


def write_lines(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.fixture
def fixture_files(tmp_path):
    method = write_lines(tmp_path / "vicuna-7b-v1.3-eagle-float16.jsonl", [
        answer(1, "writing", "eagle", ["t1", "t2"], [10, 6], [1.0, 1.0], [3, 3, 2, 4, 1, 3]),
        answer(2, "roleplay", "eagle", ["t"], [8], [0.5], [5, 3]),
        answer(3, "translation", "eagle", ["t"], [6], [2.0], [1, 2, 3]),
    ])
    baseline = write_lines(tmp_path / "vicuna-7b-v1.3-vanilla-float16-temp-0.0.jsonl", [
        answer(1, "writing", "vanilla", ["a b c d e f g h i j", "k l m n o p"], [10, 6], [4.0, 4.0], [1] * 16),
        answer(2, "roleplay", "vanilla", ["one two three four five six seven eight"], [8], [1.0], [1] * 8),
        answer(3, "translation", "vanilla", ["x y z w"], [6], [3.0], [1] * 6),  # text re-tokenises to 4
    ])
    return method, baseline


def word_tokenizer(text):
    """A stand-in tokenizer: a BOS, then one token per word."""
    return SimpleNamespace(input_ids=[1] + list(range(len(text.split()))))


def test_import_fixture_tables(fixture_files):
    method, baseline = fixture_files
    res = read_specbench_answers(method, baseline=baseline)
    s = res.summary.set_index("category")
    assert list(s.index) == ["writing", "roleplay", "translation", "mt_bench", "overall"]
    assert res.model_id == "eagle" and res.baseline_model_id == "vanilla" and "no token-level trace" in res.note
    # per-answer throughputs: method 16/2, 8/0.5, 6/2; baseline 16/8, 8/1, 6/3
    assert s.loc["writing", ["tau", "tokens_per_s", "baseline_tokens_per_s", "speedup"]].tolist() == \
        pytest.approx([16 / 6, 8, 2, 4])
    assert s.loc["mt_bench", ["generations", "steps", "tau", "speedup", "speedup_ratio_of_totals",
                              "speedup_mean_of_ratios"]].tolist() == pytest.approx([2, 8, 3, 12 / 5, 3.6, 3])
    assert s.loc["overall", ["steps", "tau", "tokens_per_s", "baseline_tokens_per_s", "speedup"]].tolist() == \
        pytest.approx([11, 30 / 11, 9, 4, 9 / 4])
    # speed.py's way of counting the baseline (re-tokenised turns): question 3 has 4 tokens, not 6
    for task, want in [("overall", 9 / ((2 + 8 + 4 / 3) / 3)), ("translation", 3 / (4 / 3))]:
        assert speed_py(method, baseline, word_tokenizer, task)[3] == pytest.approx(want)
    retok = read_specbench_answers(method, baseline=baseline, tokenizer=word_tokenizer).summary.set_index("category")
    for task in ("writing", "mt_bench", "translation", "overall"):
        assert retok.loc[task, "speedup"] == pytest.approx(speed_py(method, baseline, word_tokenizer, task)[3])
        assert retok.loc[task, "tau"] == pytest.approx(speed_py(method, baseline, word_tokenizer, task)[0])
    # accepted-length distribution, overall: L = 1, 1, 2, 2, 3 x5, 4, 5
    h = res.accept_length[res.accept_length["category"] == "overall"]
    assert h["accept_length"].tolist() == [1, 2, 3, 4, 5] and h["n_accepted"].tolist() == [0, 1, 2, 3, 4]
    assert h["steps"].tolist() == [2, 2, 5, 1, 1]
    assert h["survival"].tolist() == pytest.approx([1, 9 / 11, 7 / 11, 2 / 11, 1 / 11])
    w = res.accept_length[res.accept_length["category"] == "translation"]
    assert w["steps"].tolist() == [1, 1, 1, 0, 0] and w["fraction"].sum() == pytest.approx(1)
    # without a baseline: tau and throughput only
    alone = read_specbench_answers(method).summary
    assert "speedup" not in alone.columns and alone["tau"].iloc[-1] == pytest.approx(30 / 11)
    # a method that hides its steps (HF generate): no accepted lengths, so no tau
    hidden = write_lines(method.parent / "hf.jsonl", [answer(1, "qa", "hf", ["t"], [5], [1.0], [])])
    s = read_specbench_answers(hidden).summary
    assert s["steps"].tolist() == [0, 0] and s["tau"].isna().all() and s["tokens_per_s"].tolist() == [5, 5]


def test_import_errors(fixture_files, tmp_path):
    method, baseline = fixture_files
    bad = tmp_path / "bad.jsonl"
    bad.write_text(method.read_text().splitlines()[0] + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_specbench_answers(bad)
    line = json.loads(method.read_text().splitlines()[0])
    del line["choices"][0]["wall_time"]
    with pytest.raises(ValueError, match=r":1: choices\[0\] lacks key\(s\) \['wall_time'\]"):
        read_specbench_answers(write_lines(tmp_path / "nowall.jsonl", [line]))
    line = json.loads(method.read_text().splitlines()[0])
    line["choices"][0]["new_tokens"] = [16]
    with pytest.raises(ValueError, match="one entry per turn"):
        read_specbench_answers(write_lines(tmp_path / "turns.jsonl", [line]))
    short = write_lines(tmp_path / "short.jsonl", [json.loads(x) for x in baseline.read_text().splitlines()[:2]])
    with pytest.raises(ValueError, match="only in path"):
        read_specbench_answers(method, baseline=short)
    with pytest.raises(FileNotFoundError, match="path"):
        read_specbench_answers(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="choice"):
        read_specbench_answers(method, choice=3)


def test_figure(fixture_files, tmp_path):
    from spade_lib.plots import save_figure

    fig = specbench.plot_specbench(read_specbench_answers(*fixture_files))
    assert len(fig.axes) == 3 and fig.axes[1].get_ylabel().startswith("speedup")
    saved = save_figure(fig, "m3_specbench_import", directory=tmp_path, close=True)
    assert all(p.stat().st_size > 0 for p in saved.values())
    fig = specbench.plot_specbench(read_specbench_answers(fixture_files[0]))
    assert len(fig.axes) == 2
    with pytest.raises(TypeError, match="answers"):
        specbench.plot_specbench("x")
