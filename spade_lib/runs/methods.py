"""How a run generates: one :class:`Generator` per method, and the timed generation of one prompt.

**Methods** (``RunConfig.method``), all counted the same way (``new_tokens`` = tokens emitted after
the prompt) and timed the same way (``spade_lib.runs.timing``: ``warmup`` untimed generations on the
first prompt, then each generation timed ``repeats`` times, median kept):

- ``"spade"``: :class:`spade_lib.decoding.decode.SpeculativeDecoder` with the drafter ``config.draft`` (a draft
  of the pair, or a registered drafter such as ``"ngram"`` for prompt lookup:
  :func:`spade_lib.decoding.drafters.make_drafter`), the draft-length policy ``config.policy`` with
  ``config.policy_options`` (:func:`spade_lib.decoding.policies.get_policy`) and the acceptance rule
  ``config.mode`` with ``config.mode_options`` (:mod:`spade_lib.rules`);
- ``"ar"``: SPADE's autoregressive loop on the same adapter (the baseline for ``"spade"``);
- ``"hf"``: plain ``model.generate``; ``"hf_assisted"``: HF assisted generation with the same draft
  and ``num_assistant_tokens = gamma`` (constant schedule), the baseline a reader asks about.

Baselines draft nothing, so their shards hold no rows; their summaries carry the timings.

**Instrumentation is not timed.** SPADE's token-level statistics (entropies, TV, KL over the
vocabulary at every drafted position) cost what a deployed decoder would not spend. The timed SPADE
decoder computes them in the step (``record=True``) and times them on their own
(``GenerationResult.timing["records"]``, synchronised on an accelerator); a generation's timed wall
time is its clock minus that (:attr:`Generation.untimed`), and its step timings already exclude it.
The trace therefore describes the very generation that was timed (its tokens, decisions and ``t_*``
step timings), and no second pass is run. The records (a dict per drafted token) are built after the
clock stopped (:func:`timed_generation`). Repeated timed passes must agree token for token.
(Measured on SmolLM2, 2 cores, T = 1, gamma 4, 6 paired rounds of 64 tokens: a recorded generation
timed this way against a ``record="light"`` one, 1.01x / 1.02x / 0.96x for the null draft / the
distilled draft / prompt lookup, within this host's noise; the statistics took 0.09-0.38 s of a
2.7-4.6 s generation.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spade_lib.runs import timing
from spade_lib.runs.config import RunConfig, check_draft


@dataclass
class Generation:
    """What one generation produced, whatever the method. ``records`` stay empty until
    :func:`timed_generation` builds them from ``result`` (after the clock)."""

    output_ids: list[int]
    text: str
    records: list[dict]        # trace records (DEVELOPERS.md columns minus prompt_id/category/sample)
    accept_lengths: list[int]  # n + 1 per verification step (1s for "ar"; [] for HF, which hides its steps)
    stop_reason: str           # "eos", "max_new_tokens" or "context_limit"
    step_times: list[tuple[float, float, float]] = dataclasses.field(default_factory=list)  # (draft, verify, rest)
    untimed: float = 0.0       # seconds of instrumentation inside the clock, subtracted from its reading
    result: Any = None         # SPADE: the decoder's GenerationResult, its records not yet built


@dataclass
class Generator:
    """How a run generates: ``timed(ids, max_new_tokens, seed)`` is what the clock measures (minus the
    generation's ``untimed`` seconds); ``token_records``: its generations carry token-level records
    (SPADE), built after the clock by :func:`timed_generation`."""

    timed: Callable[[list[int], int, int], Generation]
    token_records: bool = False


def _from_result(r) -> Generation:
    steps = getattr(r, "steps", [])
    return Generation(list(r.tokens), r.text or "", [], list(r.accept_lengths) if steps else [], r.stop_reason,
                      [(s.t_draft, s.t_verify, s.t_overhead) for s in steps if s.gamma > 0],
                      float(getattr(r, "timing", {}).get("records", 0.0)), r)


def make_generator(pair, config: RunConfig) -> Generator:
    """The :class:`Generator` of ``config.method`` on ``pair``."""
    from spade_lib.decoding import baselines, decode

    sampling = config.sampling()
    check_draft(pair, config)
    if config.method == "spade":
        dec = decode.SpeculativeDecoder(
            pair.target, config.make_drafter(pair), policy=config.make_policy(), sampling=sampling,
            tokenizer=pair.tokenizer, mode=None if config.mode == "auto" else config.mode, record=True,
            record_topk=config.record_topk, **config.mode_options)
        return Generator(lambda ids, n, seed: _from_result(dec.generate(ids, n, seed=seed)), token_records=True)
    if config.method == "ar":
        ar = decode.AutoregressiveDecoder(pair.target, sampling=sampling, tokenizer=pair.tokenizer)
        return Generator(lambda ids, n, seed: _from_result(ar.generate(ids, n, seed=seed)))
    assistant = baselines.assistant_model(pair, config.draft) if config.method == "hf_assisted" else None
    return Generator(lambda ids, n, seed: _from_result(
        baselines.hf_generate(pair.target, ids, n, sampling=sampling, assistant=assistant, gamma=config.gamma,
                              seed=seed, tokenizer=pair.tokenizer)))


def timed_generation(generator: Generator, ids, config: RunConfig, seed: int, device, *, records: bool = True
                     ) -> tuple[Generation, timing.Timing]:
    """One generation timed ``config.repeats`` times (each reading minus its ``untimed`` seconds); the
    passes must agree token for token. With ``records`` (and a generator that has them) the last pass's
    token-level records are built, after the clock."""
    outputs: list[Generation] = []
    times: list[float] = []
    for _ in range(config.repeats):
        t0 = timing.clock(device)
        g = generator.timed(ids, config.max_new_tokens, seed)
        times.append(timing.clock(device) - t0 - g.untimed)
        outputs.append(g)
    last = outputs[-1]
    if any(o.output_ids != last.output_ids or o.accept_lengths != last.accept_lengths for o in outputs):
        raise RuntimeError(f"seed {seed}: repeated generations differ; decoding is not deterministic here")
    if records and generator.token_records:
        last.records = last.result.records()
    return last, timing.summarize_times(times)
