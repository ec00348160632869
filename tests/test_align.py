"""Teacher-forced scoring against references: prefix-by-prefix forwards, the closed forms of
``spade_lib.theory``, a Monte Carlo of the renewal process, and (slow) the tiny pair's own decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spade_lib import measures, rates, theory
from spade_lib.sampling import SamplingConfig, adjust
from spade_lib.whatif import align

V = 48


def _model(layers: int, hidden: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def models():
    return _model(2, 32, seed=0), _model(1, 16, seed=1)


@pytest.fixture(scope="module")
def sequences():
    g = torch.Generator().manual_seed(2)
    lengths = [9, 17, 5, 12]
    return [torch.randint(1, V, (n,), generator=g).tolist() for n in lengths], [3, 6, 2, 1]


@pytest.fixture(scope="module")
def prefix_logits(models, sequences):
    """Reference logits: one forward per prefix, no padding, no mask. ``{(k, t): (lp, lq)}``."""
    target, draft = models
    seqs, _ = sequences
    out = {}
    with torch.no_grad():
        for k, seq in enumerate(seqs):
            for t in range(1, len(seq)):
                ids = torch.tensor([seq[:t]])
                out[k, t] = target(ids).logits[0, -1].double(), draft(ids).logits[0, -1].double()
    return out


def _reference(prefix_logits, k, seq, start, sampling):
    """Row per predicted token ``seq[t]``, from the prefix-by-prefix logits."""
    rows = []
    for t in range(start, len(seq)):
        lp, lq = prefix_logits[k, t]
        p, q = adjust(lp, sampling, torch.float64), adjust(lq, sampling, torch.float64)
        rows.append([float(measures.alpha(p, q)), float(measures.kl(p, q)), float(measures.kl(q, p)),
                     float(measures.entropy(p)), float(measures.entropy(q)), float(p[seq[t]]), float(q[seq[t]]),
                     bool(lp.argmax() == lq.argmax())])
    return np.array(rows, dtype=np.float64)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.7, top_k=20, top_p=0.9)])
def test_scores_match_prefix_by_prefix_forwards(models, sequences, prefix_logits, side, sampling):
    target, draft = models
    seqs, prompts = sequences
    scores = align.score_sequences(target, draft, seqs, prompts, sampling,
                                   align.AlignConfig(batch_size=3, padding_side=side))
    assert list(scores.columns) == list(align.SCORE_COLUMNS)
    for k, (seq, m) in enumerate(zip(seqs, prompts)):
        got = scores[scores["seq"] == k]
        assert got["i"].tolist() == list(range(len(seq) - m))
        assert got["token"].tolist() == seq[m:]
        ref = _reference(prefix_logits, k, seq, m, sampling)
        cols = ["alpha", "kl_pq", "kl_qp", "h_p", "h_q", "p_x", "q_x", "top1_agree"]
        np.testing.assert_allclose(got[cols].to_numpy(np.float64), ref, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(got["tv"], 1 - got["alpha"], atol=1e-12)


def test_score_prompt_scores_from_the_second_token(models, sequences):
    target, draft = models
    seqs, prompts = sequences
    scores = align.score_sequences(target, draft, seqs, prompts, config=align.AlignConfig(score_prompt=True))
    for k, (seq, m) in enumerate(zip(seqs, prompts)):
        assert scores.loc[scores["seq"] == k, "i"].tolist() == list(range(1 - m, len(seq) - m))
    summary = align.summarize(scores)
    assert summary["n_positions"] == sum(len(s) - m for s, m in zip(seqs, prompts))


def test_bad_inputs_are_value_errors(models, sequences):
    target, draft = models
    seqs, _ = sequences
    with pytest.raises(ValueError, match="prompt_lengths"):
        align.score_sequences(target, draft, seqs, [1, 2])
    with pytest.raises(ValueError, match=r"prompt_lengths\[0\]"):
        align.score_sequences(target, draft, seqs, [0, 1, 1, 1])
    with pytest.raises(ValueError, match="sequences"):
        align.score_sequences(target, draft, [])
    with pytest.raises(ValueError, match="padding_side"):
        align.AlignConfig(padding_side="middle")
    for bad in (-1, 2.0, True, "0"):  # a padded slot is embedded: a bad id was a bare IndexError
        with pytest.raises(ValueError, match=r"^pad_id: must be an integer"):
            align.AlignConfig(pad_id=bad)
    with pytest.raises(ValueError, match=rf"^pad_id: must be an integer in \[0, {V}\).*got {V}"):
        align.score_sequences(target, draft, seqs, config=align.AlignConfig(pad_id=V))
    ragged = align.score_sequences(target, draft, seqs, config=align.AlignConfig(batch_size=4, pad_id=V - 1))
    np.testing.assert_allclose(ragged["alpha"], align.score_sequences(target, draft, seqs,
                               config=align.AlignConfig(batch_size=4))["alpha"], atol=1e-6)
    with pytest.raises(ValueError, match="methods"):
        align.predict_tau([np.ones(3)], [2], methods=["magic"])
    with pytest.raises(ValueError, match="outside"):
        align.predict_tau([np.array([0.5, 1.5])], [2])


# -- predictions -----------------------------------------------------------------------------------

def test_constant_alpha_predictions_are_leviathans_closed_form():
    alphas = [np.full(40, 0.6), np.full(25, 0.6)]
    pred = align.predict_tau(alphas, [1, 3, 7])
    for _, row in pred.iterrows():
        assert row["tau"] == pytest.approx(theory.expected_tokens(0.6, row["gamma"]), rel=1e-12)


def test_block_prediction_is_the_position_wise_closed_form():
    a = np.array([0.9, 0.2, 0.8, 0.5, 0.7])
    got = align.block_tokens(a, 2)
    fill = a.mean()
    ext = np.concatenate([a, [fill, fill]])
    for t in range(5):
        assert got[t] == pytest.approx(1 + ext[t] + ext[t] * ext[t + 1])


def test_renewal_prediction_matches_a_monte_carlo_of_decoding_blocks():
    """Simulate blocks on a text with varying alpha: start at 0, accept each draft w.p. alpha_t,
    next block where this one ended; tau = tokens / steps over many runs."""
    rng = np.random.default_rng(0)
    alpha = np.clip(0.65 + 0.3 * np.sin(np.arange(60) / 4.0) + 0.05 * rng.standard_normal(60), 0, 1)
    gamma, runs = 4, 3000
    tokens = steps = 0
    ext = np.concatenate([alpha, np.full(gamma + 1, alpha.mean())])
    for _ in range(runs):
        t = 0
        while t < len(alpha):
            k = 0
            while k < gamma and rng.random() < ext[t + k]:
                k += 1
            tokens, steps, t = tokens + k + 1, steps + 1, t + k + 1
    mc = tokens / steps
    pred = align.predict_tau([alpha], [gamma]).set_index("method")["tau"]
    assert pred["renewal"] == pytest.approx(mc, abs=0.02)   # se of mc ~ 0.005
    iid = theory.expected_tokens(alpha.mean(), gamma)
    assert pred["iid"] == pytest.approx(iid)
    # here renewal < iid: blocks pile up where alpha is low (short blocks, more of them), which
    # outweighs Jensen's gain from runs of high alpha; the iid formula cannot see either effect
    assert pred["renewal"] != pytest.approx(iid, abs=0.05)


def test_predict_adds_cost_and_speedup(models, sequences):
    target, draft = models
    seqs, prompts = sequences
    scores = align.score_sequences(target, draft, seqs, prompts)
    out = align.predict(scores, [1, 2, 4], c=0.1, verify_cost=lambda g: 1 + 0.1 * g)
    row = out[(out["gamma"] == 4) & (out["method"] == "iid")].iloc[0]
    a = scores["alpha"].mean()
    assert row["tau"] == pytest.approx(theory.expected_tokens(a, 4))
    assert row["speedup"] == pytest.approx(theory.speedup(a, 4, 0.1, 1.4))


# -- the tiny pair: scoring what decoding emitted ---------------------------------------------------

@pytest.mark.slow
def test_on_decoded_text_alpha_is_the_traces_and_predicted_tau_matches_measured():
    from spade_lib.decoding.decode import SpeculativeDecoder
    from spade_lib.zoo.pairs import load_pair

    pair = load_pair("tiny")
    tok = pair.tokenizer
    texts = ["def main(", "import os\n", "class Foo:\n    def", "for i in range(", "# Return the",
             "if __name__ ==", "    return self.", "The following", "x = [", "with open("]
    gamma, sampling = 4, SamplingConfig()
    dec = SpeculativeDecoder(pair.target, pair.draft, gamma=gamma, sampling=sampling, eos_token_id=[])
    seqs, prompts, n_acc, trace_rows = [], [], [], []
    for k, text in enumerate(texts):
        ids = tok(text)["input_ids"]
        res = dec.generate(ids, max_new_tokens=64, seed=k)
        seqs.append(ids + res.tokens)
        prompts.append(len(ids))
        n_acc += [s.n_accepted for s in res.steps if s.gamma == gamma]
        trace_rows += [dict(r, seq=k) for r in res.records()]
    scores = align.score_sequences(pair.target, pair.draft, seqs, prompts, sampling)

    # 1. at every reached draft position the context is the decoded text: alpha_t == 1 - tv of the trace
    import pandas as pd
    tr = pd.DataFrame(trace_rows)
    tf = scores[["seq", "i", "alpha", "token"]].rename(columns={"i": "abs_pos"})
    reached = tr[tr["reached"]].merge(tf, on=["seq", "abs_pos"])
    assert len(reached) == tr["reached"].sum()
    accepted = reached[reached["accepted"]]
    assert (accepted["draft_token"] == accepted["token"]).all()  # an accepted draft is the decoded token
    np.testing.assert_allclose(reached["alpha"], 1 - reached["tv"], atol=2e-4)

    # 2. predicted tau vs decoding-measured tau (fixed-gamma steps), within 4 standard errors + 0.1
    measured = 1 + np.mean(n_acc)
    se = np.std(np.array(n_acc) + 1.0, ddof=1) / np.sqrt(len(n_acc))
    pred = align.predict_tau(align.alphas_by_sequence(scores), [gamma]).set_index("method")["tau"]
    assert abs(pred["renewal"] - measured) < 4 * se + 0.1, (pred.to_dict(), measured, se)


@pytest.mark.slow
def test_run_sequences_rebuild_the_emitted_text_of_a_run(tmp_path):
    from spade_lib.bench import default_suite
    from spade_lib.runs import metrics
    from spade_lib.runs.config import RunConfig
    from spade_lib.runs.runner import run_suite
    from spade_lib.runs.trace import read_trace
    from spade_lib.zoo.pairs import load_pair

    pair = load_pair("tiny")
    suite = default_suite(tokenizer="tiny", n_per_category=1)
    threads = torch.get_num_threads()
    try:
        config = RunConfig(gamma=3, temperature=1.0, max_new_tokens=24, warmup=0, max_prompt_tokens=64, threads=1)
        run = run_suite(pair, suite, config, tmp_path / "run", progress=False)
    finally:
        torch.set_num_threads(threads)
    seqs, prompts, keys = align.run_sequences(run, pair.tokenizer, suite)
    # notebook 03's early-exit texts as it built them inline before it called run_sequences (the reference)
    from spade_lib.runs.config import prompt_ids
    from spade_lib.runs.store import read_summary

    summ = read_summary(run)
    rows_by_qid = {r["question_id"]: r for r in suite.rows}
    assert seqs == [prompt_ids(pair.tokenizer, rows_by_qid[q]["turns"][0], config) + list(out)
                    for q, out in zip(summ["question_id"], summ["output_ids"])]
    tr = read_trace(run)
    assert len(seqs) == len(suite.rows) and (keys["new_tokens"] == [len(s) - m for s, m in zip(seqs, prompts)]).all()
    emitted = {(k.prompt_id, k.sample): seqs[k.seq][prompts[k.seq]:] for k in keys.itertuples()}
    for row in tr[tr["accepted"]].itertuples():
        out = emitted[(row.prompt_id, row.sample)]
        if row.abs_pos < len(out):
            assert out[row.abs_pos] == row.draft_token
    assert align.measured_tau(tr)[0] == pytest.approx(metrics.mean_accepted_length(tr))
    with pytest.raises(ValueError, match="gamma = 9"):
        align.measured_tau(tr, 9)


def test_greedy_walk_alternating_agreement_gives_the_high_low_position_pattern():
    """The reported greedy anomaly (conditional acceptance 0.90 / 0.21 / 0.71 at slots 0 / 1 / 2, alpha 0.89
    at gamma 1 but 0.59 at gamma 2 on the same prompts) is what a text whose agreement alternates gives."""
    agree = np.tile([True, False], 50)
    g1, g2 = align.greedy_walk(agree, 1), align.greedy_walk(agree, 2)
    assert g1.loc[0, "alpha_cond"] == 1.0  # gamma 1 visits only the agreeing tokens
    assert g2.loc[0, "alpha_cond"] == 1.0 and g2.loc[1, "alpha_cond"] == 0.0
    alpha = lambda w: rates.alpha(w["accepted"].sum(), w["reached"].sum())  # noqa: E731
    assert alpha(g1) == 1.0 and alpha(g2) == pytest.approx(0.5, abs=0.01)
    # the counts nest (drafted >= reached >= accepted) and alpha_uncond is accepted / drafted
    assert (g2["drafted"] >= g2["reached"]).all() and (g2["reached"] >= g2["accepted"]).all()
    assert g2["alpha_uncond"].tolist() == pytest.approx((g2["accepted"] / g2["drafted"]).tolist())
    with pytest.raises(ValueError, match="gamma"):
        align.greedy_walk(agree, 0)


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_greedy_trace_positions_are_the_walk_over_its_own_text(gamma):
    """Greedy decoding's per-slot counts equal greedy_walk of the teacher-forced top-1 agreement of the
    emitted text, token for token: any per-position pattern of a greedy trace is the text's, and a draft
    cache or position bug (proposals that differ from the draft's argmax on the text) would break this."""
    import pandas as pd

    from spade_lib.decoding.decode import SpeculativeDecoder
    from spade_lib.diagnose import position_acceptance
    from spade_lib.zoo.pairs import load_pair

    pair = load_pair("tiny")
    tok = pair.tokenizer
    greedy = SamplingConfig(temperature=0)
    dec = SpeculativeDecoder(pair.target, pair.draft, gamma=gamma, sampling=greedy, eos_token_id=[])
    walk, rows = None, []
    for k, text in enumerate(["def main(", "import os\n", "class Foo:\n    def", "x = ["]):
        ids = tok(text)["input_ids"]
        res = dec.generate(ids, max_new_tokens=40)
        rows += res.records()
        sc = align.score_sequences(pair.target, pair.draft, [ids + res.tokens], [len(ids)], greedy)
        w = align.greedy_walk(sc["top1_agree"].to_numpy(bool), gamma)
        walk = w if walk is None else walk + w
    measured = position_acceptance(pd.DataFrame(rows))
    assert measured["reached"].tolist() == walk["reached"].tolist()[:len(measured)]
    assert measured["accepted"].tolist() == walk["accepted"].tolist()[:len(measured)]


def test_the_reached_gap_tolerance_is_float_rounding_unless_the_draft_prefilled_in_bf16():
    """``reached_tolerance``: 1e-3 for a draft that decodes as it is scored (fp32 prefill, the default), 2e-2 for one
    whose prefill ran in bf16 (``SPADE_DRAFT_PREFILL=auto``); both far below a position defect's gap."""
    from spade_lib.decoding.model.lean import PREFILL_ATTR

    draft = torch.nn.Linear(2, 2)
    assert align.reached_tolerance(draft) == 1e-3
    setattr(draft, PREFILL_ATTR, "fp32")
    assert align.reached_tolerance(draft) == 1e-3
    setattr(draft, PREFILL_ATTR, "bf16")
    assert align.reached_tolerance(draft) == 2e-2
