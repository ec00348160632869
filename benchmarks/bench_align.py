"""Teacher-forced scoring vs generating a trace of the same tokens (target: scoring >= 20x faster).

Not a test: it prints ratios measured in one run on one machine. For ``--prompts`` prompts of the
embedded suite it first *generates* ``--max-new-tokens`` tokens per prompt with SPADE's speculative
decoder (``gamma``, full token-level records: what a trace costs), then *scores* the very same
sequences (prompt + continuation) with :func:`spade_lib.whatif.align.score_sequences` (one batched forward of
target and draft per ``--batch-size`` sequences, every per-position measure). Both are timed
``--repeats`` times (median kept) after one untimed warm-up. The last line is exactly::

    scored_tokens=<N> generate_s=<s> score_s=<s> score_vs_generate=<ratio>

Usage: ``.venv/bin/python benchmarks/bench_align.py [--pair tiny] [--prompts 16] [--max-new-tokens 128]
[--gamma 4] [--temperature 1] [--batch-size 16] [--repeats 3] [--threads 2] [--device cpu]``. Timings on a shared
machine vary run to run: quote the load (``uptime``) next to them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from spade_lib import devices  # noqa: E402
from spade_lib.bench import default_suite  # noqa: E402
from spade_lib.decoding.decode import SpeculativeDecoder  # noqa: E402
from spade_lib.runs import timing  # noqa: E402
from spade_lib.runs.config import RunConfig, prompt_ids  # noqa: E402
from spade_lib.sampling import SamplingConfig  # noqa: E402
from spade_lib.whatif import align  # noqa: E402
from spade_lib.zoo.pairs import load_for_timing  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="tiny", help="embedded pair name")
    ap.add_argument("--draft", default=None, help="draft model of the pair (default: the pair's default draft)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts taken from the embedded suite")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=16, help="sequences per scoring forward")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help='"cpu", "cuda" or "auto"')
    return ap.parse_args(argv)


def _median_time(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = devices.clock()
        out = fn()
        times.append(devices.clock() - t0)
    return statistics.median(times), out


def main(argv=None) -> None:
    args = parse_args(argv)
    timing.fix_threads(args.threads)
    device = devices.resolve_device(args.device)
    try:  # the target and this draft model prepared (their kernel plans)
        pair, args.draft = load_for_timing(args.pair, args.draft, device=device)
    except ValueError as e:
        raise SystemExit(f"--{e}") from None
    draft = pair.drafts[args.draft]
    suite = default_suite(tokenizer=args.pair, n_per_category=max(1, -(-args.prompts // 4)))
    config = RunConfig(max_new_tokens=args.max_new_tokens)
    prompts = [prompt_ids(pair.tokenizer, r["turns"][0], config) for r in suite.rows[:args.prompts]]
    limit = getattr(pair.target.config, "max_position_embeddings", None)
    if limit:
        prompts = [ids[-max(1, limit - args.max_new_tokens):] for ids in prompts]
    sampling = SamplingConfig(temperature=args.temperature)
    decoder = SpeculativeDecoder(pair.target, draft, gamma=args.gamma, sampling=sampling, eos_token_id=[])

    def generate():
        return [decoder.generate(ids, args.max_new_tokens, seed=k) for k, ids in enumerate(prompts)]

    t_gen, results = _median_time(lambda: [(r, r.records()) for r in generate()], args.repeats)
    sequences = [ids + r.tokens for ids, (r, _) in zip(prompts, results)]
    lengths = [len(ids) for ids in prompts]
    n_tokens = sum(len(r.tokens) for r, _ in results)
    cfg = align.AlignConfig(batch_size=args.batch_size)
    t_score, scores = _median_time(lambda: align.score_sequences(pair.target, draft, sequences, lengths, sampling, cfg),
                                   args.repeats)
    assert len(scores) == n_tokens
    steps = sum(r.n_steps for r, _ in results)
    print(f"pair {args.pair!r} draft {args.draft!r}, {len(prompts)} prompts x {args.max_new_tokens} new tokens, "
          f"gamma {args.gamma}, T {args.temperature:g}, {device}, {torch.get_num_threads()} threads")
    print(f"generate (trace, {steps} steps): {t_gen:.3f} s  = {n_tokens / t_gen:.0f} tok/s")
    print(f"score (teacher-forced, batch {args.batch_size}): {t_score:.3f} s  = {n_tokens / t_score:.0f} tok/s")
    print(f"scored_tokens={n_tokens} generate_s={t_gen:.4f} score_s={t_score:.4f} score_vs_generate={t_gen / t_score:.1f}")


if __name__ == "__main__":
    main()
