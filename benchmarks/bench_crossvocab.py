"""Drafts across vocabularies, timed: a pair's cross-vocabulary draft beside Hugging Face's generators.

Not a test: it prints figures measured in one run on one machine. For a pair with a cross-vocabulary draft
(``load_pair("smollm2").drafts["embedded"]``: the embedded pair's 4,096-token draft; ``load_pair("gemma3")
.drafts["smollm2"]``: SmolLM2-135M-Instruct) it runs notebook 03's protocol (one interleaved session per
temperature, AR as the baseline, bootstrap intervals over prompts, the physical controls):

- T = 0: SPADE with the draft through the text (``rule="text"``, SLEM-style) and through the vocabulary
  intersection (``rule="tli"``), HF assisted generation with the same draft (UAG,
  ``AssistedCandidateGeneratorDifferentTokenizers``), prompt lookup and the null draft (the control);
- T = 1: SPADE TLI and text drafting, HF assisted generation (USD with its exact, unpruned translator),
  the null draft.

Greedy outputs are checked equal to AR's token for token (the runs store their tokens). The costs are measured
once per pair and draft, before the sessions, and cached as notebook 03's are (:func:`spade_lib.runs.costs.pair_costs`, in turns: the draft's forward over the
target's, ``c``; the target's ``g + 1``-row forward over its one-row forward, ``r(g)``; the loop's own per-step cost
``o``). Prints per run: alpha, tau and the speedup over AR with 95 % intervals, the cost-model prediction
``tau / (gamma c + r(gamma) + o)`` beside it (a cross-vocabulary draft's step also re-encodes text, which ``c``
leaves out: the two-sided control then says by how much the model under-prices it), and the controls'
warnings::

    python benchmarks/bench_crossvocab.py --pair smollm2 [--n-per-category 5] [--max-new-tokens 48]
    python benchmarks/bench_crossvocab.py --pair gemma3 --draft smollm2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spade_lib import devices  # noqa: E402
from spade_lib import experiment, paths  # noqa: E402
from spade_lib.decoding.drafts.drafters import CROSS_VOCAB_RULES  # noqa: E402
from spade_lib.decoding.studies.costs import verify_cost_fn  # noqa: E402
from spade_lib.runs import costs as run_costs  # noqa: E402
from spade_lib.runs import protocol  # noqa: E402
from spade_lib.runs.config import RunConfig  # noqa: E402
from spade_lib.runs.store import read_summary  # noqa: E402

from spade_lib.zoo.registry import real_pair, real_pairs  # noqa: E402
COLUMNS = ["alpha", "alpha_low", "alpha_high", "tau", "tau_low", "tau_high", "speedup", "speedup_low",
           "speedup_high"]


def configs_for(draft: str, temperature: float, gamma: int, common: dict,
                rules: tuple[str, ...] = ("text", "tli")) -> list[RunConfig]:
    """The runs of one session at ``temperature`` (AR is the baseline, run separately)."""
    spade = [RunConfig(method="spade", draft=draft, gamma=gamma, temperature=temperature,
                       draft_options={"rule": rule}, **common) for rule in rules]
    hf = [RunConfig(method="hf_assisted", draft=draft, gamma=gamma, temperature=temperature, **common)]
    extra = [RunConfig(method="spade", draft="ngram", gamma=gamma, temperature=temperature, **common)] \
        if temperature == 0 else []
    null = [RunConfig(method="spade", draft="null", gamma=gamma, temperature=temperature, **common)]
    return spade + hf + extra + null


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2", choices=[p for p in real_pairs() if real_pair(p).cross_draft])
    ap.add_argument("--draft", default=None, help="the pair's cross-vocabulary draft (default: its one)")
    ap.add_argument("--suite", default="humaneval")
    ap.add_argument("--n-per-category", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: the machine's default)")
    ap.add_argument("--rules", nargs="+", default=["text", "tli"], choices=list(CROSS_VOCAB_RULES),
                    help="cross-vocabulary rules to time (slrs: where its paths stay within its limit)")
    args = ap.parse_args(argv)
    draft = args.draft or real_pair(args.pair).cross_draft

    E = experiment.load_experiment(args.pair, suite=args.suite, n_per_category=args.n_per_category,
                                   threads=args.threads)
    if draft not in E.pair.draft_tokenizers:
        ap.error(f"--draft: {draft!r} is not a cross-vocabulary draft of pair {args.pair!r} "
                 f"(those: {sorted(E.pair.draft_tokenizers)})")
    print(E.describe())
    print(f"cross-vocabulary draft {draft!r}: {len(E.pair.draft_tokenizers[draft])} tokens, target "
          f"{len(E.pair.tokenizer)}; {len(E.suite.rows)} prompts x {args.max_new_tokens} tokens, gamma {args.gamma}")
    proto = protocol.Protocol()
    common = dict(max_new_tokens=args.max_new_tokens, device=str(E.device), threads=E.threads)
    t0 = devices.clock()  # measured once per pair and draft, cached under runs/costs/ as notebook 03's are
    costs = run_costs.pair_costs(E.pair, [draft, "ngram", "null"], args.gamma)
    cd = costs[draft]
    with tempfile.TemporaryDirectory(prefix="spade-crossvocab-") as tmp:
        paths.RUNS_DIR = Path(tmp)
        r = verify_cost_fn(cd)
        print(f"costs ({devices.clock() - t0:.0f} s, in turns, cached): c({draft}) = {cd['c']:.3f}, r(g) = "
              + " ".join(f"{g}:{r(g):.3f}" for g in range(1, args.gamma + 1))
              + f", loop overhead o = {cd.get('overhead', float('nan')):.3f}")
        for temperature in args.temperatures:
            ar = RunConfig(method="ar", temperature=temperature, **common)
            configs = configs_for(draft, temperature, args.gamma, common, tuple(args.rules))
            t0 = devices.clock()
            dirs = protocol.run_interleaved(E.pair, E.suite, configs, ar, protocol=proto, progress=False)
            table = protocol.speedup_table(dirs, ar, protocol=proto, costs=costs).set_index("label")
            print(f"\nT = {temperature:g}: one interleaved session, {devices.clock() - t0:.0f} s")
            if temperature == 0:  # greedy: every run must emit AR's tokens
                ref = read_summary(dirs[proto.config(ar)]).set_index("question_id")["output_ids"]
                for cfg, d in dirs.items():
                    out = read_summary(d).set_index("question_id")["output_ids"]
                    same = sum(list(out[q]) == list(ref[q]) for q in ref.index)
                    print(f"  {cfg.label:<44} greedy tokens equal to AR on {same}/{len(ref)} prompts")
            print(f"  {'run':<44} {'alpha':>20} {'tau':>20} {'speedup':>22} {'predicted':>9}")
            for label, row in table.iterrows():
                if row["method"] == "ar":
                    continue
                cells = [f"{row[k]:.2f} [{row[k + '_low']:.2f}, {row[k + '_high']:.2f}]" if k in row and
                         row[k] == row[k] else "-" for k in ("alpha", "tau")]
                sp = f"{row['speedup']:.2f}x [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]"
                pred = row.get("predicted", float("nan"))
                pred = f"{pred:.2f}x" if pred == pred else "-"
                print(f"  {label:<44} {cells[0]:>20} {cells[1]:>20} {sp:>22} {pred:>9}")
                for control in ("physical_control", "model_control"):  # physics before ratios, then the model
                    if row.get(control):
                        print(f"    {control}: {row[control]}")


if __name__ == "__main__":
    main()
