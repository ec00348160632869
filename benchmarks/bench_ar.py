"""SPADE's autoregressive loop against Hugging Face ``generate``: the baseline every speedup divides by.

Not a test: it prints figures measured in one run on one machine. For each of ``--n`` HumanEval prompts
(``--suite embedded`` for the embedded pair) and each of ``--rounds`` rounds it runs, back to back, SPADE's
:class:`~spade_lib.decoding.decode.AutoregressiveDecoder` (on the lean forward where it covers the model)
and HF greedy ``generate`` (:func:`~spade_lib.decoding.baselines.hf_generate`), both for exactly
``--max-new-tokens`` tokens (no EOS), wall clock with the prefill, and checks that the greedy tokens are
equal. It prints both rates and the median of the paired ratios ``t_hf / t_spade`` with their range.

    .venv/bin/python benchmarks/bench_ar.py --pair gemma3 [--n 5 --max-new-tokens 48 --rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from spade_lib import devices  # noqa: E402
from spade_lib.validate import check_options  # noqa: E402
from spade_lib.bench import default_suite, humaneval_suite  # noqa: E402
from spade_lib.decoding.baselines import hf_generate  # noqa: E402
from spade_lib.decoding.decode import AutoregressiveDecoder  # noqa: E402
from spade_lib.sampling import SamplingConfig  # noqa: E402
from spade_lib.zoo.pairs import load_pair  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="gemma3", help="pair name for spade_lib.zoo.pairs.load_pair")
    ap.add_argument("--suite", choices=("humaneval", "embedded"), default="humaneval")
    ap.add_argument("--n", type=int, default=5, help="prompts")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: the machine's default)")
    args = ap.parse_args(argv)
    check_options(ap, args, {"n": 1, "max_new_tokens": 1, "rounds": 1})
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair(args.pair)
    tok = pair.tokenizer
    suite = (humaneval_suite(n_per_category=args.n, seed=0) if args.suite == "humaneval"
             else default_suite(tokenizer=args.pair, n_per_category=args.n, seed=0))
    prompts = [tok(r["turns"][0])["input_ids"] for r in suite.rows[:args.n]]
    greedy = SamplingConfig(temperature=0)
    ar = AutoregressiveDecoder(pair.target, sampling=greedy, tokenizer=tok, eos_token_id=[])
    n = args.max_new_tokens
    print(f"pair={pair.name} suite={args.suite} ({len(prompts)} prompts) max_new_tokens={n} rounds={args.rounds} "
          f"threads={torch.get_num_threads()} cpu={devices.cpu().label()!r} SPADE backend={ar.target.backend}")
    ar.generate(prompts[0], 8)  # warm-up
    hf_generate(pair.target, prompts[0], 8, sampling=greedy, eos_token_id=[])
    ratios, spade, hf = [], [], []
    for _ in range(args.rounds):
        for p in prompts:
            t0 = devices.clock()
            a = ar.generate(p, n)
            t1 = devices.clock()
            h = hf_generate(pair.target, p, n, sampling=greedy, eos_token_id=[])
            t2 = devices.clock()
            if a.tokens != h.tokens:
                raise SystemExit("bench_ar: greedy SPADE AR differs from HF generate; its timing would mean nothing")
            spade.append(n / (t1 - t0))
            hf.append(n / (t2 - t1))
            ratios.append((t2 - t1) / (t1 - t0))
    out = {"spade_tok_s": statistics.median(spade), "hf_tok_s": statistics.median(hf),
           "spade_vs_hf": statistics.median(ratios), "range": (min(ratios), max(ratios))}
    print(f"SPADE AR {out['spade_tok_s']:.1f} tok/s, HF generate {out['hf_tok_s']:.1f} tok/s; SPADE / HF "
          f"{out['spade_vs_hf']:.2f}x [{out['range'][0]:.2f}, {out['range'][1]:.2f}] over {len(ratios)} paired runs "
          "(wall clock, prefill included); greedy tokens equal on every run")
    return out


if __name__ == "__main__":
    main()
