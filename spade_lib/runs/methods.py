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
vocabulary at every drafted position) are computed in a separate, untimed pass with the same seed;
the timed passes record step-level facts only and must reproduce its tokens exactly (see
:class:`Generator`, :func:`timed_generation`). The trace's ``t_*`` columns are the last timed pass's
step timings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from spade_lib.runs import timing
from spade_lib.runs.config import RunConfig, check_draft


@dataclass
class Generation:
    """What one generation produced, whatever the method."""

    output_ids: list[int]
    text: str
    records: list[dict]        # trace records (DEVELOPERS.md columns minus prompt_id/category/sample)
    accept_lengths: list[int]  # n + 1 per verification step (1s for "ar"; [] for HF, which hides its steps)
    stop_reason: str           # "eos", "max_new_tokens" or "context_limit"
    step_times: list[tuple[float, float, float]] = dataclasses.field(default_factory=list)  # (draft, verify, rest)


@dataclass
class Generator:
    """How a run generates: ``timed(ids, max_new_tokens, seed)`` is what the clock measures;
    ``recorded`` (SPADE only) is the same decoder with token-level recording, run once untimed.

    SPADE's token-level records cost per-position statistics over the vocabulary (entropies, TV,
    KL, top-k) that a deployed decoder would not compute, so they are kept out of the timing: the
    timed decoder records step-level facts only (``record="light"``), and the two must produce the
    same tokens (same seed, same decisions), which :func:`timed_generation` checks.
    """

    timed: Callable[[list[int], int, int], Generation]
    recorded: Callable[[list[int], int, int], Generation] | None = None


def _from_result(r, records: bool) -> Generation:
    steps = getattr(r, "steps", [])
    return Generation(list(r.tokens), r.text or "", r.records() if records else [],
                      list(r.accept_lengths) if steps else [], r.stop_reason,
                      [(s.t_draft, s.t_verify, s.t_overhead) for s in steps if s.gamma > 0])


def make_generator(pair, config: RunConfig) -> Generator:
    """The :class:`Generator` of ``config.method`` on ``pair``."""
    from spade_lib.decoding import baselines, decode

    sampling = config.sampling()
    check_draft(pair, config)
    if config.method == "spade":
        def decoder(record):
            return decode.SpeculativeDecoder(
                pair.target, config.make_drafter(pair), policy=config.make_policy(), sampling=sampling,
                tokenizer=pair.tokenizer, mode=None if config.mode == "auto" else config.mode, record=record,
                record_topk=config.record_topk if record is True else 0, **config.mode_options)

        light, full = decoder("light"), decoder(True)
        return Generator(lambda ids, n, seed: _from_result(light.generate(ids, n, seed=seed), records=False),
                         lambda ids, n, seed: _from_result(full.generate(ids, n, seed=seed), records=True))
    if config.method == "ar":
        ar = decode.AutoregressiveDecoder(pair.target, sampling=sampling, tokenizer=pair.tokenizer)
        return Generator(lambda ids, n, seed: _from_result(ar.generate(ids, n, seed=seed), records=False))
    assistant = baselines.assistant_model(pair, config.draft) if config.method == "hf_assisted" else None
    return Generator(lambda ids, n, seed: _from_result(
        baselines.hf_generate(pair.target, ids, n, sampling=sampling, assistant=assistant, gamma=config.gamma,
                              seed=seed, tokenizer=pair.tokenizer), records=False))


def timed_generation(generator: Generator, ids, config: RunConfig, seed: int, device
                     ) -> tuple[Generation, timing.Timing]:
    """One generation: the recorded pass (if any) once, untimed; then ``config.repeats`` timed passes,
    which must agree with it token for token. The records keep the last timed pass's step timings."""
    rec = generator.recorded(ids, config.max_new_tokens, seed) if generator.recorded is not None else None
    outputs: list[Generation] = []

    def once() -> Generation:
        g = generator.timed(ids, config.max_new_tokens, seed)
        outputs.append(g)
        return g

    gen, t = timing.measure(once, warmup=0, repeats=config.repeats, device=device)
    ref = rec if rec is not None else gen
    if any(o.output_ids != ref.output_ids or o.accept_lengths != ref.accept_lengths for o in outputs):
        raise RuntimeError(f"seed {seed}: repeated generations differ (or differ from the recorded one); "
                           "decoding is not deterministic here")
    if rec is None:
        return gen, t
    by_step: dict[int, tuple[float, float, float]] = {}
    steps_with_rows = sorted({r["step"] for r in rec.records})
    if len(steps_with_rows) != len(gen.step_times):
        raise RuntimeError(f"seed {seed}: recorded and timed passes drafted in different steps")
    by_step = dict(zip(steps_with_rows, gen.step_times))
    for r in rec.records:
        r["t_draft"], r["t_verify"], r["t_overhead"] = by_step[r["step"]]
    return rec, t
