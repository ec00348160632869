"""Head-data benchmark: the target's greedy answers per minute, one sequence at a time vs batched.

Not a test: it prints ratios measured in one run on one machine. The heads' recipes (``zoo/head_data.py``)
generate the target's own answers; this times the three ways SPADE can, on the same prompts (``--prompts
recipe``: the pair's long recipe's own, the corpus prompts in the target's chat template, those of at most its
``max_prompt_tokens``; ``humaneval``: HumanEval's, rendered the same way), in turns per chunk of ``--batch``
prompts: **single** (``AutoregressiveDecoder.generate`` per prompt: SPADE's fastest one-sequence loop, the lean
forward), **batch-lean** (``generate_batch`` on the lean weights, :mod:`spade_lib.decoding.model.lean_batch`, what
the recipes run) and **batch-hf** (``generate_batch`` through the Hugging Face forward,
:class:`spade_lib.decoding.batch.BatchLM`: the former path). Tokens per minute count new tokens only; each
method's greedy answers are compared with single's (rows equal, or differing after a near tie). The last line
is exactly::

    head_data_lean_x=<batch-lean / single> head_data_hf_x=<batch-hf / single> rows_equal=<n>/<m>

Usage: ``python benchmarks/bench_head_data.py [--pair smollm2] [--prompts recipe|humaneval] [--n-prompts 32]
[--batch 32] [--gen-tokens 128] [--threads 0]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spade_lib import devices  # noqa: E402
from spade_lib.validate import check_options  # noqa: E402


def _needs_bos(pair: str) -> bool:
    """Whether ``pair``'s prompts need the tokenizer's BOS prepended (a registered real pair's ``bos``)."""
    from spade_lib.zoo.registry import real_pair, real_pairs

    return pair in real_pairs() and real_pair(pair).bos


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="smollm2", help="a zoo pair (smollm2, gemma3, default)")
    ap.add_argument("--prompts", default="recipe", choices=("recipe", "humaneval"),
                    help="the long head recipe's own prompts, or HumanEval's")
    ap.add_argument("--n-prompts", type=int, default=32, help="prompts answered")
    ap.add_argument("--batch", type=int, default=32, help="prompts decoded together")
    ap.add_argument("--gen-tokens", type=int, default=128, help="new tokens per answer (the long recipe's 128)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: the machine's default)")
    args = ap.parse_args(argv)
    check_options(ap, args, {"n_prompts": 1, "batch": 1, "gen_tokens": 1})
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    from spade_lib.bench.build import humaneval_suite
    from spade_lib.decoding.decode import AutoregressiveDecoder
    from spade_lib.decoding.model.adapter import CausalLMAdapter
    from spade_lib.runs import timing
    from spade_lib.sampling import SamplingConfig
    from spade_lib.zoo.head_data import _encode_prompt
    from spade_lib.zoo.pairs import load_pair

    if args.threads:
        timing.fix_threads(args.threads)
    pair = load_pair(args.pair)
    tok = pair.tokenizer
    if args.prompts == "recipe":
        from spade_lib.zoo.head_data import corpus_texts
        from spade_lib.zoo.heads import head_config

        data = head_config("eagle3", "long", pair=args.pair).data
        encoded = [_encode_prompt(tok, t, data.bos) for t in corpus_texts(data)[0]]
        prompts = [e for e in encoded if 0 < len(e) <= data.max_prompt_tokens][: args.n_prompts]
    else:
        rows = humaneval_suite(n_per_category=args.n_prompts).rows[: args.n_prompts]
        prompts = [_encode_prompt(tok, r["turns"][0], bos=_needs_bos(args.pair)) for r in rows]
    greedy = SamplingConfig(temperature=0)
    lean = AutoregressiveDecoder(CausalLMAdapter(pair.target), sampling=greedy)
    if lean.target.lean is None:
        raise SystemExit(f"pair {args.pair!r}: its target has no lean forward here; nothing to compare")
    print(f"{args.pair}: {len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
          f"{args.gen_tokens} new tokens each, batch {args.batch}, {torch.get_num_threads()} threads")
    lean.generate_batch(prompts[:2], 4)  # warm-up of every path
    lean.generate_batch(prompts[:2], 4, lean=False)
    lean.generate(prompts[0], 4)
    seconds = {"single": 0.0, "batch-lean": 0.0, "batch-hf": 0.0}
    tokens = dict.fromkeys(seconds, 0)
    answers: dict[str, list[list[int]]] = {k: [] for k in seconds}
    for i in range(0, len(prompts), args.batch):
        chunk = prompts[i: i + args.batch]
        for name in seconds:
            t0 = devices.clock()
            if name == "single":
                got = [lean.generate(p, args.gen_tokens).tokens for p in chunk]
            else:
                got = [r.tokens for r in lean.generate_batch(chunk, args.gen_tokens, lean=name == "batch-lean")]
            seconds[name] += devices.clock() - t0
            tokens[name] += sum(len(g) for g in got)
            answers[name] += got
    rate = {k: 60.0 * tokens[k] / seconds[k] for k in seconds}
    for k in seconds:
        print(f"{k:>10}: {tokens[k]} tokens in {seconds[k]:.1f} s = {rate[k]:,.0f} tokens/min "
              f"({rate[k] / rate['single']:.2f}x single)")
    equal = sum(a == b for a, b in zip(answers["batch-lean"], answers["single"]))
    print(f"head_data_lean_x={rate['batch-lean'] / rate['single']:.2f} "
          f"head_data_hf_x={rate['batch-hf'] / rate['single']:.2f} rows_equal={equal}/{len(prompts)}")


if __name__ == "__main__":
    main()
