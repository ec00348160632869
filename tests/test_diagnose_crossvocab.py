"""Cross-vocabulary diagnostics (spade_lib.diagnose.crossvocab): boundaries on hand-checked tokenizers,
the tables against plain-Python references, and a real decode of two tokenizers end to end."""
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from spade_lib.diagnose.crossvocab import (alignment_table, boundary_acceptance, greedy_divergences, run_crossvocab,
                                          step_costs, token_acceptance, token_offsets)
from tests.test_crossvocab import DRAFT_TOK, TARGET_TOK, GreedyTokenizer, _pair, tokenizers  # noqa: F401 (fixture)


def ids_of(tok, *strings):
    return [tok.ids[s] for s in strings]


def test_alignment_kinds_by_hand():
    # text "ab" + "cdab": the draft (longest match over a, b, c, d, cd, bc) segments it a | bc | da? no "da"
    # in the draft: a | bc | d | a | b -> boundaries {0, 1, 3, 4, 5, 6}
    prompt = ids_of(TARGET_TOK, "a")
    out = ids_of(TARGET_TOK, "b", "c", "d", "ab")
    assert DRAFT_TOK.encode("abcdab") == ids_of(DRAFT_TOK, "a", "bc", "d", "a", "b")
    t = alignment_table(prompt, out, TARGET_TOK, DRAFT_TOK)
    assert t["char_start"].tolist() == [1, 2, 3, 4] and t["char_end"].tolist() == [2, 3, 4, 6]
    # "b" starts at a draft boundary and ends inside "bc"; "c" starts inside it; "d" is a draft token;
    # "ab" is the draft's "a" + "b" (a merge)
    assert t["kind"].astype(str).tolist() == ["split", "split", "same", "merge"]
    assert t["start_aligned"].tolist() == [True, False, True, True]
    assert t["draft_inside"].tolist() == [0, 0, 0, 1]


def test_token_offsets_mark_a_boundary_inside_a_character():
    class Bytes:  # one token per UTF-8 byte, decoded as a byte-level BPE decodes (U+FFFD for a partial char)
        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids).decode("utf-8", errors="replace")

    ids = list("a\u00e9".encode())  # a, 0xc3, 0xa9
    assert token_offsets(ids, Bytes()).tolist() == [0, 1, -1, 2]


def _hand_trace():
    """One generation of four tokens (kinds split, split, same, merge as above): step 0 drafts two at
    index 0 (accepted, then rejected), step 1 two at index 2 (both accepted)."""
    trace = pd.DataFrame({"prompt_id": "q", "sample": 0, "step": [0, 0, 1, 1], "pos": [0, 1, 0, 1],
                          "abs_pos": [0, 1, 2, 3], "gamma": 2, "n_accepted": [1, 1, 2, 2],
                          "reached": [True, True, True, True], "accepted": [True, False, True, True]})
    align = alignment_table(ids_of(TARGET_TOK, "a"), ids_of(TARGET_TOK, "b", "c", "d", "ab"), TARGET_TOK,
                            DRAFT_TOK).assign(prompt_id="q", sample=0)
    return trace, align


def test_boundary_acceptance_counts():
    trace, align = _hand_trace()
    t = boundary_acceptance(trace, align).set_index("kind")
    assert t.loc["split", ["reached", "accepted", "first_rejections", "committed"]].tolist() == [2, 1, 1, 2]
    assert t.loc["same", ["reached", "accepted", "first_rejections", "committed"]].tolist() == [1, 1, 0, 1]
    assert t.loc["merge", ["reached", "accepted", "committed"]].tolist() == [1, 1, 1]
    assert t.loc["special", "committed"] == 0 and np.isnan(t.loc["special", "alpha"])
    assert t.loc["split", "alpha"] == 0.5 and t.loc["split", "rejection_share"] == 1.0
    assert t["committed_share"].sum() == pytest.approx(1.0)
    s = boundary_acceptance(trace, align, on="start_aligned").set_index("start_aligned")
    assert s.loc[False, ["reached", "accepted", "first_rejections"]].tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="^on: "):
        boundary_acceptance(trace, align, on="pos")
    with pytest.raises(ValueError, match="^alignment: missing"):
        boundary_acceptance(trace, align.drop(columns="kind"))


def _draft_accepted_reference(steps, align):
    """Draft boundaries in (s_a, e_{a+n-1}] counted from the offsets, step by step."""
    text_ids = ids_of(TARGET_TOK, "a", "b", "c", "d", "ab")
    text = TARGET_TOK.decode(text_ids)
    bq = set(token_offsets(DRAFT_TOK.encode(text), DRAFT_TOK, text).tolist())
    out = 0
    for _, s in steps.iterrows():
        if s["n_accepted"] == 0:
            continue
        a, n = int(s["abs_pos"]), int(s["n_accepted"])
        lo, hi = align["char_start"][a], align["char_end"][a + n - 1]
        out += sum(lo < b <= hi for b in bq)
    return out


def test_token_acceptance_per_target_and_per_draft_token():
    _, align = _hand_trace()
    steps = pd.DataFrame({"prompt_id": "q", "sample": 0, "step": [0, 1, 2], "gamma": [2, 2, 0],
                          "n_accepted": [1, 2, 0], "abs_pos": [0, 2, 4], "draft_tokens": [3, 2, 0]})
    t = token_acceptance(steps, align).iloc[0]
    assert (t["drafted"], t["accepted"], t["draft_tokens"]) == (4, 3, 5)
    # step 0 accepts "b" (its end, offset 2, is inside the draft's "bc": no draft token completed);
    # step 1 accepts "d", "ab": the draft's d, a, b
    assert t["draft_accepted"] == _draft_accepted_reference(steps, align) == 3
    assert t["alpha_target"] == 0.75 and t["alpha_draft"] == 0.6 and t["target_per_draft"] == 0.8


def test_step_costs_in_target_steps():
    steps = pd.DataFrame({"rule": ["text", "text", "tli"], "gamma": [2, 4, 3], "draft_tokens": [3, 5, 3],
                          "forwards": [3, 5, 3], "t_forward": [0.02, 0.04, 0.03], "t_text": [0.01, 0.01, 0.0],
                          "encode_calls": [3, 5, 1], "decode_calls": [5, 7, 3]})
    t = step_costs(steps, 0.1, by="rule").set_index("rule")
    assert t.loc["text", "c_forward"] == pytest.approx(0.06 / 0.6) and t.loc["text", "c_text"] == pytest.approx(0.02 / 0.6)
    assert t.loc["text", "c"] == pytest.approx(0.08 / 0.6) and t.loc["text", "text_share"] == pytest.approx(0.25)
    assert t.loc["text", "ms_text"] == pytest.approx(10.0) and t.loc["tli", "tokenizer_calls"] == 4
    with pytest.raises(ValueError, match="^t_target: "):
        step_costs(steps, 0.0)


def test_run_crossvocab_on_two_tokenizers(tokenizers):
    """A real decode of two toy models with their own tokenizers: greedy equals AR for both rules, the
    tables hold every reached position and every committed token, the drafter's costs are there."""
    from spade_lib.diagnose import position_acceptance
    from spade_lib.runs import metrics
    from spade_lib.runs.config import RunConfig

    ttok, dtok = tokenizers
    target, draft = _pair(tokenizers, 0.3)
    pair = SimpleNamespace(name="toy", target=target, tokenizer=ttok, drafts={"own": draft},
                           draft_tokenizers={"own": dtok}, heads={})
    rows = [{"question_id": i, "category": "code", "turns": [t]} for i, t in enumerate(["def f(x", "import os\n"])]
    common = dict(max_new_tokens=24, temperature=0.0, chat_template=False)
    configs = {rule: RunConfig(method="spade", draft="own", gamma=3, draft_options={"rule": rule}, **common)
               for rule in ("text", "tli")}
    runs = run_crossvocab(pair, rows, configs, RunConfig(method="ar", **common))
    for rule in configs:
        assert runs.outputs[rule] == runs.reference
    div = greedy_divergences(runs, target)
    assert len(div) == 4 and set(div["classification"]) == {"identical"} and (div["first_difference"] == -1).all()
    t = boundary_acceptance(runs.trace, runs.alignment, by="rule")
    pos = position_acceptance(runs.trace, by="rule")
    for rule in configs:
        mine, ref = t[t.rule == rule], pos[pos.rule == rule]
        assert mine["reached"].sum() == ref["reached"].sum() and mine["accepted"].sum() == ref["accepted"].sum()
        assert mine["committed"].sum() == sum(map(len, runs.outputs[rule].values()))
    tok = token_acceptance(runs.steps, runs.alignment, by="rule").set_index("rule")
    assert (tok["draft_accepted"] <= tok["draft_tokens"]).all() and (tok["draft_tokens"] > 0).all()
    assert tok.loc["tli", "target_per_draft"] == 1.0  # one draft token per proposed target token
    for rule in configs:  # the step table and the trace count the same drafted and accepted target tokens
        assert tok.loc[rule, "alpha_target"] == pytest.approx(
            metrics.acceptance_rate(runs.trace[runs.trace.rule == rule], over="drafted"))
    costs = step_costs(runs.steps, runs.t_target, by="rule").set_index("rule")
    assert (costs["forwards"] >= 1).all() and (costs["c"] > 0).all() and (costs["tokenizer_calls"] > 0).all()
    with pytest.raises(ValueError, match="^configs: 'x' must be a spade run of a cross-vocabulary draft"):
        run_crossvocab(pair, rows, {"x": RunConfig(method="ar", **common)}, RunConfig(method="ar", **common))
