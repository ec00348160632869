"""How a run generates: one :class:`Generator` per method, and the timed generation of one prompt.

**Methods** (``RunConfig.method``; :func:`make_generator`), all counted alike (``new_tokens`` = tokens emitted after the
prompt) and timed alike (:func:`timed_generation`, ``spade_lib.runs.timing``: ``warmup`` untimed generations on the
first prompt, then each generation timed ``repeats`` times, median kept):

- ``"spade"``: :class:`spade_lib.decoding.decode.SpeculativeDecoder` with the drafter ``config.draft`` (a draft of the
  pair or a registered drafter such as ``"ngram"``: :func:`spade_lib.decoding.drafts.drafters.make_drafter`), the policy
  ``config.policy`` / ``policy_options`` (:func:`spade_lib.decoding.drafts.policies.get_policy`) and the acceptance rule
  ``config.mode`` / ``mode_options`` (:mod:`spade_lib.rules`);
- ``"ar"``: SPADE's autoregressive loop on the same adapter (the baseline for ``"spade"``);
- ``"hf"``: plain ``model.generate``; ``"hf_assisted"``: HF assisted generation with the same draft and
  ``num_assistant_tokens = gamma`` (constant schedule); with a cross-vocabulary draft (``pair.draft_tokenizers``), HF's
  generators for different tokenizers (UAG when greedy, USD with its exact unpruned translator when sampling:
  :mod:`spade_lib.decoding.baselines`). Baselines draft nothing: no shard rows, timings in their summaries.

**Instrumentation is not timed.** SPADE's token-level statistics (entropies, TV, KL over the vocabulary per drafted
position) cost what a deployed decoder would not spend; ``records`` (:data:`RECORDS`) keeps them off the clock:

- ``"separate"`` (default): timed passes record step facts only (``record="light"``); one more untimed pass with the
  same seed (``record=True``, must reproduce the timed tokens) gives the statistics; trace ``t_*``: last timed pass;
- ``"timed"``: the timed pass records (``record=True``), timing its statistics apart (``timing["records"]``); its wall
  time is the clock minus that (:attr:`Generation.untimed`), step timings exclude it, no second pass. The statistics
  still touch memory, so this is unbiased only where the weights stream from DRAM anyway: the real pair's notebooks
  time this way, the embedded pair's (largely cache-resident) do not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spade_lib import devices
from spade_lib.runs import timing
from spade_lib.runs.config import RunConfig


RECORDS = ("separate", "timed")  # how a SPADE run's token-level records stay off the clock (module docstring)


@dataclass
class Generation:
    """What one generation produced, whatever the method. With ``records="timed"`` the ``records``
    stay empty until :func:`timed_generation` builds them from ``result`` (after the clock)."""

    output_ids: list[int]
    text: str
    records: list[dict]        # trace records (DEVELOPERS.md columns minus prompt_id/category/sample)
    accept_lengths: list[int]  # n + 1 per verification step (1s for "ar"; [] for HF, which hides its steps)
    stop_reason: str           # "eos", "max_new_tokens" or "context_limit"
    step_times: list[tuple[float, float, float]] = dataclasses.field(default_factory=list)  # (draft, verify, rest)
    untimed: float = 0.0       # seconds of instrumentation inside the clock, subtracted from its reading
    result: Any = None         # records="timed": the decoder's GenerationResult, its records not yet built
    prefill: float = float("nan")  # seconds of the prompt's prefill by the decoder's clock (NaN: HF hides it)


@dataclass
class Generator:
    """How a run generates: ``timed(ids, max_new_tokens, seed)`` is what the clock measures (minus the
    generation's ``untimed`` seconds). Token-level records (SPADE only) come from ``recorded``, the same
    decoder with ``record=True``, run once untimed (``records="separate"``), or from the timed generation
    itself (``token_records``, ``records="timed"``)."""

    timed: Callable[[list[int], int, int], Generation]
    recorded: Callable[[list[int], int, int], Generation] | None = None
    token_records: bool = False


def _from_result(r, records: bool = False) -> Generation:
    steps = getattr(r, "steps", [])
    return Generation(list(r.tokens), r.text or "", r.records() if records else [],
                      list(r.accept_lengths) if steps else [], r.stop_reason,
                      [(s.t_draft, s.t_verify, s.t_overhead) for s in steps if s.gamma > 0],
                      float(getattr(r, "timing", {}).get("records", 0.0)),
                      prefill=float(getattr(r, "timing", {}).get("prefill", float("nan"))))


def make_generator(pair, config: RunConfig, records: str = "separate") -> Generator:
    """The :class:`Generator` of ``config.method`` on ``pair``; ``records``: one of :data:`RECORDS`."""
    from spade_lib.decoding import baselines, decode

    if records not in RECORDS:
        raise ValueError(f"records: must be one of {RECORDS}, got {records!r}")
    sampling = config.sampling()
    if config.method == "spade":
        def decoder(record):
            return decode.SpeculativeDecoder(
                pair.target, config.make_drafter(pair), policy=config.make_policy(), sampling=sampling,
                tokenizer=pair.tokenizer, mode=None if config.mode == "auto" else config.mode, record=record,
                record_topk=config.record_topk if record is True else 0, **config.mode_options)

        if records == "timed":
            full = decoder(True)

            def timed(ids, n, seed):
                g = _from_result(r := full.generate(ids, n, seed=seed))
                g.result = r
                return g

            return Generator(timed, token_records=True)
        light, full = decoder("light"), decoder(True)
        return Generator(lambda ids, n, seed: _from_result(light.generate(ids, n, seed=seed)),
                         lambda ids, n, seed: _from_result(full.generate(ids, n, seed=seed), records=True))
    if config.method == "ar":
        ar = decode.AutoregressiveDecoder(pair.target, sampling=sampling, tokenizer=pair.tokenizer)
        return Generator(lambda ids, n, seed: _from_result(ar.generate(ids, n, seed=seed)))
    assistant = baselines.assistant_model(pair, config.draft) if config.method == "hf_assisted" else None
    cross = {}
    if assistant is not None and config.draft in (getattr(pair, "draft_tokenizers", {}) or {}):
        # a cross-vocabulary draft: HF's UAG when greedy, USD when sampling, with its unpruned translator
        # (exact; the pruned one generate uses by default is not, see decoding.baselines)
        cross = dict(target_tokenizer=pair.tokenizer, assistant_tokenizer=pair.draft_tokenizers[config.draft],
                     prune_lm_head=False)
    return Generator(lambda ids, n, seed: _from_result(
        baselines.hf_generate(pair.target, ids, n, sampling=sampling, assistant=assistant, gamma=config.gamma,
                              seed=seed, tokenizer=pair.tokenizer, **cross)))


def timed_generation(generator: Generator, ids, config: RunConfig, seed: int, device, *, records: bool = True
                     ) -> tuple[Generation, timing.Timing]:
    """One generation timed ``config.repeats`` times (each reading minus its ``untimed`` seconds); the
    passes must agree token for token. With ``records``: the recorded pass (if any) once, untimed, which
    must agree with them too, its records keeping the last timed pass's step timings; or, for a generator
    whose timed generations record, the last one's records, built after its clock."""
    rec = generator.recorded(ids, config.max_new_tokens, seed) if records and generator.recorded else None
    outputs: list[Generation] = []
    readings = devices.time_in_turns({"gen": lambda: outputs.append(generator.timed(ids, config.max_new_tokens, seed))},
                                     reps=config.repeats, warmup=0, device=device)["gen"]
    gen, t = outputs[-1], timing.summarize_times([r - o.untimed for r, o in zip(readings, outputs)])
    ref = rec if rec is not None else gen
    if any(o.output_ids != ref.output_ids or o.accept_lengths != ref.accept_lengths for o in outputs):
        raise RuntimeError(f"seed {seed}: repeated generations differ (or differ from the recorded one); "
                           "decoding is not deterministic here")
    if records and generator.token_records:
        gen.records = gen.result.records()
    gen.result = None
    if rec is None:
        return gen, t
    steps_with_rows = sorted({r["step"] for r in rec.records})
    if len(steps_with_rows) != len(gen.step_times):
        raise RuntimeError(f"seed {seed}: recorded and timed passes drafted in different steps")
    by_step = dict(zip(steps_with_rows, gen.step_times))
    for r in rec.records:
        r["t_draft"], r["t_verify"], r["t_overhead"] = by_step[r["step"]]
    return rec, t
