"""Cross-vocabulary runs: acceptance per target and per draft token, rejections against the two
tokenizers' token boundaries, and what the drafter's text sync costs per step.

Drafters: :mod:`spade_lib.decoding.drafts.crossvocab`'s ``TextDrafter`` (the draft's text re-encoded) and ``TLIDrafter`` (the
vocabulary intersection). Per step ``gamma`` target tokens are drafted, ``n`` accepted (Leviathan et al. 2023).

**Boundaries.** A generation's text ``T`` (``skip_special_tokens``) is cut by the target's committed ids and by the
draft tokenizer's ``encode(T)``; a *boundary* is a character offset where a token ends, ``B_q`` the draft's
(:func:`token_offsets`; none inside a character). Target token ``j`` spans ``[s_j, e_j)`` (:func:`alignment_table`):
``start_aligned`` iff ``s_j in B_q``; ``kind`` is ``"same"`` (``s_j, e_j in B_q``, no draft boundary between),
``"merge"`` (both in, boundaries between), ``"split"`` (otherwise) or ``"special"`` (no text, EOS).

**Rejections by boundary** (:func:`boundary_acceptance`): drafted position ``i`` is judged against the committed
target token at ``abs_pos`` (the drafted token if accepted, else the target's own, starting where it did); per ``kind``
(or ``start_aligned``): ``reached``, ``accepted``, ``alpha = accepted / reached`` (Wilson bounds), ``first_rejections``
(each rejecting step's rejected position) and the base rate ``committed`` (continuation tokens of that kind).

**Per token** (:func:`token_acceptance`): ``alpha_target = sum n / sum gamma``
(:func:`spade_lib.runs.metrics.acceptance_rate`); ``alpha_draft = sum a_q / sum d`` with ``d`` the tokens the draft
drew (``DraftStepCosts.draft_tokens``; a text drafter draws past its proposal) and ``a_q = |B_q ∩ (s_a, e_{a+n-1}]|``
for a step starting at ``a``; ``target_per_draft = sum gamma / sum d``. **Costs** (:func:`step_costs`, from
``StepInfo.draft_costs``): ``t_forward`` (draft forwards), ``t_text`` (decode, re-encode, align), tokenizer calls;
with ``t_target`` one AR target step, ``c_forward = sum t_forward / (sum gamma t_target)``, ``c_text`` alike, ``c =
c_forward + c_text`` (the cost model's ``c``). :func:`run_crossvocab` decodes a few prompts per configuration and the
AR baseline with the decoder itself (step costs live on ``StepInfo``, not in traces) and returns the tables' inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from spade_lib.diagnose.frame import By, as_trace, group_keys, step_rows
from spade_lib.rates import add_rate

KINDS = ("same", "merge", "split", "special")  # a target token's kind against the draft's boundaries
COST_FIELDS = ("draft_tokens", "forwards", "fed", "t_forward", "t_text", "encode_calls", "decode_calls")
GENERATION_KEYS = ["prompt_id", "sample"]


def token_offsets(ids: Sequence[int], tokenizer, text: str | None = None) -> np.ndarray:
    """Character offsets ``[len(ids) + 1]`` where each prefix ``ids[:k]`` of ``ids`` ends in the decoded
    text (``decode(ids)``, or ``text``); ``-1`` where a prefix's text is no prefix of it (a token ends
    inside a character). ``tokenizer``: ``decode(ids, skip_special_tokens=True)``."""
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=True) if text is None else text
    out = np.full(len(ids) + 1, -1, dtype=np.int64)
    for k in range(len(ids) + 1):
        prefix = tokenizer.decode(ids[:k], skip_special_tokens=True)
        if text.startswith(prefix):
            out[k] = len(prefix)
    return out


def alignment_table(prompt_ids: Sequence[int], output_ids: Sequence[int], target_tokenizer,
                    draft_tokenizer) -> pd.DataFrame:
    """One row per continuation token ``j`` (``index``, its id ``token``): ``char_start``, ``char_end``
    (``-1``: inside a character), ``start_aligned``, ``end_aligned``, ``draft_inside`` (draft boundaries
    strictly between) and ``kind`` (module docstring), against the draft tokenizer's segmentation of
    the whole text."""
    ids = [int(i) for i in prompt_ids] + [int(i) for i in output_ids]
    text = target_tokenizer.decode(ids, skip_special_tokens=True)
    off = token_offsets(ids, target_tokenizer, text)
    d_off = token_offsets(draft_tokenizer.encode(text, add_special_tokens=False), draft_tokenizer, text)
    bq = np.unique(d_off[d_off >= 0])
    L = len(prompt_ids)
    s, e = off[L:-1], off[L + 1:]
    known = (s >= 0) & (e >= 0)
    start_aligned = np.isin(s, bq) & (s >= 0)
    end_aligned = np.isin(e, bq) & (e >= 0)
    inside = np.where(known, np.searchsorted(bq, e, side="left") - np.searchsorted(bq, s, side="right"), -1)
    kind = np.where(known & (s == e), "special",
                    np.where(start_aligned & end_aligned, np.where(inside == 0, "same", "merge"), "split"))
    return pd.DataFrame({"index": np.arange(len(output_ids), dtype=np.int64),
                         "token": np.asarray([int(i) for i in output_ids], dtype=np.int64),
                         "char_start": s, "char_end": e, "start_aligned": start_aligned,
                         "end_aligned": end_aligned, "draft_inside": inside,
                         "kind": pd.Categorical(kind, categories=KINDS)})


def _keys(by: By, frame: pd.DataFrame) -> list[str]:
    return group_keys(by, frame) + [k for k in GENERATION_KEYS if k not in group_keys(by, frame)]


def _at_position(trace: pd.DataFrame, alignment: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``trace`` with the alignment of the target token committed at each row's ``abs_pos`` (rows past
    the continuation, cut by EOS or the budget, dropped)."""
    a = alignment.rename(columns={"index": "abs_pos"})[keys + ["abs_pos", "kind", "start_aligned"]]
    t = trace.assign(abs_pos=trace["abs_pos"].astype(np.int64))
    return t.merge(a, on=keys + ["abs_pos"], how="inner", validate="many_to_one")


def boundary_acceptance(trace, alignment: pd.DataFrame, by: By = None, *, on: str = "kind",
                        level: float = 0.95) -> pd.DataFrame:
    """Per ``by`` group and value of ``on`` (``"kind"`` or ``"start_aligned"``) of the target token at
    each drafted position: ``drafted``, ``reached``, ``accepted``, ``alpha`` (``accepted / reached``,
    with ``alpha_low`` / ``alpha_high``), ``first_rejections`` and their ``rejection_share``, and the
    base rate ``committed`` / ``committed_share`` over the continuation tokens (module docstring).
    ``alignment``: :func:`alignment_table` rows of every generation, keyed like the trace (``by``,
    ``prompt_id``, ``sample``)."""
    if on not in ("kind", "start_aligned"):
        raise ValueError(f"on: must be 'kind' or 'start_aligned', got {on!r}")
    df = as_trace(trace, ("pos", "abs_pos", "reached", "accepted"))
    keys = _keys(by, df)
    groups = group_keys(by, df)
    missing = [k for k in keys + ["index", on] if k not in alignment.columns]
    if missing:
        raise ValueError(f"alignment: missing column(s) {missing} (alignment_table rows with the trace's keys)")
    t = _at_position(df, alignment, keys)
    first = t["reached"] & ~t["accepted"]
    t = t.assign(drafted=1, first_rejections=first)
    out = t.groupby(groups + [on], observed=False, sort=True)[["drafted", "reached", "accepted", "first_rejections"]] \
        .sum().reset_index()
    base = alignment.assign(committed=1).groupby(groups + [on], observed=False, sort=True)["committed"].sum()
    out = out.merge(base.reset_index(), on=groups + [on], how="outer").fillna(
        {"drafted": 0, "reached": 0, "accepted": 0, "first_rejections": 0, "committed": 0})
    for c in ("drafted", "reached", "accepted", "first_rejections", "committed"):
        out[c] = out[c].astype(np.int64)
    add_rate(out, "accepted", "reached", "alpha", level)
    total = (lambda c: out.groupby(groups, observed=False)[c].transform("sum")) if groups else \
        (lambda c: out[c].sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        out["rejection_share"] = out["first_rejections"] / total("first_rejections")
        out["committed_share"] = out["committed"] / total("committed")
    return out


def steps_frame(results: Mapping[tuple, object], by: Sequence[str] = ()) -> pd.DataFrame:
    """One row per verification step of each ``GenerationResult`` in ``results`` (keyed by the values of
    ``by`` then ``prompt_id``, ``sample``): ``step``, ``gamma``, ``n_accepted``, ``abs_pos``, the decoder's
    ``t_draft`` / ``t_verify`` / ``t_overhead`` and the drafter's :data:`COST_FIELDS` (NaN for a drafter
    that keeps none)."""
    names = list(by) + GENERATION_KEYS
    rows = []
    for key, result in results.items():
        key = key if isinstance(key, tuple) else (key,)
        if len(key) != len(names):
            raise ValueError(f"results: keys must be ({', '.join(names)}), got {key!r}")
        for i, s in enumerate(result.steps):
            costs = s.draft_costs or {}
            rows.append({**dict(zip(names, key)), "step": i, "gamma": s.gamma, "n_accepted": s.n_accepted,
                         "abs_pos": s.abs_pos, "t_draft": s.t_draft, "t_verify": s.t_verify,
                         "t_overhead": s.t_overhead, **{f: costs.get(f, np.nan) for f in COST_FIELDS}})
    return pd.DataFrame(rows, columns=names + ["step", "gamma", "n_accepted", "abs_pos", "t_draft", "t_verify",
                                               "t_overhead", *COST_FIELDS])


def token_acceptance(steps: pd.DataFrame, alignment: pd.DataFrame, by: By = None, *,
                     level: float = 0.95) -> pd.DataFrame:
    """Per ``by`` group: target tokens ``drafted`` and ``accepted`` with ``alpha_target``; draft tokens
    ``draft_tokens`` and ``draft_accepted`` with ``alpha_draft``; ``target_per_draft`` (module docstring).
    ``steps``: :func:`steps_frame` rows; ``alignment``: :func:`alignment_table` rows (``char_end`` of the
    accepted text and the draft's boundaries, recomputed here from ``start_aligned`` / ``draft_inside``)."""
    keys = _keys(by, steps)
    groups = group_keys(by, steps)
    s = steps[steps["gamma"] > 0]
    a = alignment.sort_values(keys + ["index"])
    # draft boundaries completed by the accepted text of a step starting at a with n accepted:
    # the draft boundaries in (s_a, e_{a+n-1}] = sum over j in [a, a+n) of (draft_inside_j + end_aligned_j)
    a = a.assign(ends=np.where(a["draft_inside"] >= 0, a["draft_inside"], 0) + a["end_aligned"].astype(np.int64))
    a = a.assign(cum=a.groupby(keys, observed=True)["ends"].cumsum() - a["ends"])  # boundaries before j
    lookup = a.set_index(keys + ["index"])["cum"]
    last = a.groupby(keys, observed=True)[["index", "cum", "ends"]].last()

    def cum_at(frame: pd.DataFrame, col: str) -> np.ndarray:
        idx = pd.MultiIndex.from_frame(frame[keys].assign(index=frame[col].astype(np.int64)))
        got = lookup.reindex(idx).to_numpy(dtype=np.float64)
        tail = last.reindex(pd.MultiIndex.from_frame(frame[keys]))
        past = (tail["cum"] + tail["ends"]).to_numpy(dtype=np.float64)  # past the continuation's last token
        return np.where(np.isnan(got), past, got)

    acc_q = cum_at(s.assign(end=s["abs_pos"] + s["n_accepted"]), "end") - cum_at(s, "abs_pos")
    t = s.assign(draft_accepted=acc_q)
    out = (t.groupby(groups, observed=True, sort=True) if groups else t.assign(_all=0).groupby("_all")).agg(
        drafted=("gamma", "sum"), accepted=("n_accepted", "sum"), draft_tokens=("draft_tokens", "sum"),
        draft_accepted=("draft_accepted", "sum"), steps=("gamma", "size")).reset_index(drop=not groups)
    for c in ("drafted", "accepted", "draft_tokens", "draft_accepted", "steps"):
        out[c] = out[c].astype(np.int64)
    add_rate(out, "accepted", "drafted", "alpha_target", level)
    out["draft_accepted"] = np.minimum(out["draft_accepted"], out["draft_tokens"])  # a held-back token's text
    add_rate(out, "draft_accepted", "draft_tokens", "alpha_draft", level)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["target_per_draft"] = out["drafted"] / out["draft_tokens"]
    return out


def step_costs(steps: pd.DataFrame, t_target: float, by: By = None) -> pd.DataFrame:
    """Per ``by`` group, over the steps that drafted: ``steps``, mean ``gamma``, ``draft_tokens``,
    ``forwards`` and ``tokenizer_calls`` per step, milliseconds of ``t_forward`` and ``t_text`` per step
    (``ms_forward``, ``ms_text``), ``text_share = sum t_text / sum (t_forward + t_text)``, and
    ``c_forward``, ``c_text``, ``c`` per drafted target token over ``t_target`` seconds (module docstring)."""
    if not t_target > 0:
        raise ValueError(f"t_target: must be > 0 seconds, got {t_target!r}")
    groups = group_keys(by, steps)
    s = steps[steps["gamma"] > 0].assign(tokenizer_calls=lambda f: f["encode_calls"] + f["decode_calls"])
    g = s.groupby(groups, observed=True, sort=True) if groups else s.assign(_all=0).groupby("_all")
    out = g.agg(steps=("gamma", "size"), gamma=("gamma", "mean"), draft_tokens=("draft_tokens", "mean"),
                forwards=("forwards", "mean"), tokenizer_calls=("tokenizer_calls", "mean"),
                ms_forward=("t_forward", "mean"), ms_text=("t_text", "mean"), sum_gamma=("gamma", "sum"),
                sum_forward=("t_forward", "sum"), sum_text=("t_text", "sum")).reset_index(drop=not groups)
    out["ms_forward"] *= 1e3
    out["ms_text"] *= 1e3
    out["text_share"] = out["sum_text"] / (out["sum_forward"] + out["sum_text"])
    out["c_forward"] = out["sum_forward"] / (out["sum_gamma"] * t_target)
    out["c_text"] = out["sum_text"] / (out["sum_gamma"] * t_target)
    out["c"] = out["c_forward"] + out["c_text"]
    return out.drop(columns=["sum_gamma", "sum_forward", "sum_text"])


@dataclass
class CrossVocabRuns:
    """What :func:`run_crossvocab` decoded: the inputs of this module's tables."""

    trace: pd.DataFrame       # one row per drafted token: the trace's columns and the run's label
    steps: pd.DataFrame       # steps_frame: one row per step, the drafter's costs
    alignment: pd.DataFrame   # alignment_table of every generation, with its keys
    outputs: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # label -> prompt_id -> tokens
    reference: dict[str, list[int]] = field(default_factory=dict)           # the AR run's tokens by prompt_id
    prompts: dict[str, list[int]] = field(default_factory=dict)             # the prompt's ids by prompt_id
    t_target: float = float("nan")  # seconds per autoregressive step (its decoding time over its tokens)
    label: str = "rule"       # the column naming the configuration


def run_crossvocab(pair, rows: Sequence[Mapping], configs: Mapping[str, object], ar_config, *,
                   label: str = "rule") -> CrossVocabRuns:
    """Decode the suite ``rows`` (``question_id``, ``category``, ``turns``) with each ``RunConfig`` of
    ``configs`` (``{label: config}``: method ``"spade"`` with a cross-vocabulary draft of ``pair``) and
    with ``ar_config`` (method ``"ar"``), one sample each at the run's generation seed, recording tokens;
    prompts as a run tokenises them (:func:`spade_lib.runs.config.prompt_ids`)."""
    from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
    from spade_lib.runs.config import generation_seed, prompt_ids
    from spade_lib.runs.trace import records_to_table

    cross = getattr(pair, "draft_tokenizers", {}) or {}
    for name, cfg in configs.items():
        if cfg.method != "spade" or cfg.draft not in cross:
            raise ValueError(f"configs: {name!r} must be a spade run of a cross-vocabulary draft of pair "
                             f"{getattr(pair, 'name', '?')!r} ({sorted(cross)}), got {cfg.method} / {cfg.draft!r}")
    if ar_config.method != "ar":
        raise ValueError(f"ar_config: must be an 'ar' run, got {ar_config.method!r}")
    ar = AutoregressiveDecoder(pair.target, sampling=ar_config.sampling(), tokenizer=pair.tokenizer)
    reference, t_ar, n_ar = {}, 0.0, 0
    prompts = {}
    for row in rows:
        qid = str(row["question_id"])
        prompts[qid] = (row, prompt_ids(pair.tokenizer, row["turns"][0], ar_config))
        r = ar.generate(prompts[qid][1], ar_config.max_new_tokens,
                        seed=generation_seed(ar_config.seed, row["question_id"], 0))
        reference[qid], t_ar, n_ar = r.tokens, t_ar + r.timing["verify"], n_ar + len(r.tokens)
    frames, results, aligned, outputs = [], {}, [], {}
    for name, cfg in configs.items():
        dec = SpeculativeDecoder(pair.target, cfg.make_drafter(pair), policy=cfg.make_policy(),
                                 sampling=cfg.sampling(), tokenizer=pair.tokenizer,
                                 mode=None if cfg.mode == "auto" else cfg.mode, record=True, **cfg.mode_options)
        outputs[name], records = {}, []
        for qid, (row, ids) in prompts.items():
            r = dec.generate(ids, cfg.max_new_tokens, seed=generation_seed(cfg.seed, row["question_id"], 0))
            outputs[name][qid] = r.tokens
            results[(name, qid, 0)] = r
            records += [{"prompt_id": qid, "category": str(row["category"]), "sample": 0, **x} for x in r.records()]
            aligned.append(alignment_table(ids, r.tokens, pair.tokenizer, cross[cfg.draft]).assign(
                **{label: name, "prompt_id": qid, "sample": 0}))
        frames.append(records_to_table(records).to_pandas().assign(**{label: name}))  # the schema, checked per run
    labels = list(configs)
    trace = pd.concat(frames, ignore_index=True)
    trace[label] = pd.Categorical(trace[label], categories=labels)
    alignment = pd.concat(aligned, ignore_index=True)
    alignment[label] = pd.Categorical(alignment[label], categories=labels)
    steps = steps_frame(results, by=[label])
    steps[label] = pd.Categorical(steps[label], categories=labels)
    return CrossVocabRuns(trace, steps, alignment, outputs, reference, {q: ids for q, (_, ids) in prompts.items()},
                          t_ar / max(n_ar, 1), label)


def greedy_divergences(runs: CrossVocabRuns, target) -> pd.DataFrame:
    """Per configuration and prompt of greedy ``runs``: how its tokens compare with the autoregressive
    run's (:func:`spade_lib.decoding.studies.divergence.compare_greedy`: ``"identical"``, ``"near_tie"`` where the
    target's top two logits at the first difference are closer than its dtype's rounding, else a bug),
    with ``first_difference`` (``-1``: none)."""
    from spade_lib.decoding.studies.divergence import compare_greedy

    rows = []
    for name, outs in runs.outputs.items():
        for qid, tokens in outs.items():
            d = compare_greedy(tokens, runs.reference[qid], target, runs.prompts[qid])
            rows.append({runs.label: name, "prompt_id": qid, "classification": d.classification,
                         "first_difference": -1 if d.first_index is None else int(d.first_index)})
    return pd.DataFrame(rows, columns=[runs.label, "prompt_id", "classification", "first_difference"])
