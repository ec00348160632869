"""The command line of the draft heads: ``python -m spade_lib.zoo.head_cli build --pair default|smollm2|gemma3
--kind eagle3|eagle1|medusa [--profile make|long]`` (gemma3's recipes: ``eagle3`` / ``medusa``) builds a head
(cached, :mod:`spade_lib.zoo.heads`) and prints the build facts of its manifest (seconds, data tokens, steps, ``budget_hit``, ``c``); ``... eval
...`` also prints the held-out teacher-forced top-1 and alpha by depth (:mod:`spade_lib.zoo.head_eval`).
"""

from __future__ import annotations

from pathlib import Path

from spade_lib.io import write_json
from spade_lib.zoo import head_eval
from spade_lib.zoo.cache import read_manifest
from spade_lib.zoo.heads import head_kinds, load_head, load_target, with_threads
from spade_lib.zoo.pairs import head_entry as pair_head_entry, target_dir

__all__ = ["build_facts", "main"]


def build_facts(manifest: dict) -> dict:
    """What a head entry's manifest says about its build: seconds, data tokens, steps, the budget guard,
    the cost ratio, and the build's own held-out top-1 (teacher-forced on true tokens)."""
    data = manifest.get("data", {})
    return {"kind": manifest.get("head_kind"), "build_seconds": manifest.get("seconds", {}).get("total"),
            "data_tokens": data.get("tokens"), "feature_tokens": data.get("feature_tokens"),
            "generated_tokens": data.get("generated_tokens"), "steps_done": manifest.get("steps_done"),
            "steps": manifest.get("recipe", {}).get("head", {}).get("train", {}).get("steps"),
            "budget_s": manifest.get("budget_s"), "budget_hit": manifest.get("budget_hit"),
            "c": manifest.get("costs", {}).get("c"), "heldout_top1": manifest.get("heldout", {}).get("all", {}).get("top1")}


def _parser():
    import argparse

    p = argparse.ArgumentParser(prog="python -m spade_lib.zoo.head_cli",
                                description="Build (cached) and evaluate the draft heads of a pair.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("build", "build the head if it is not cached, print its build facts"),
                       ("eval", "build if needed, then the held-out teacher-forced top-1 by depth")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--pair", required=True, help="an embedded pair ('default') or a registered real pair with head recipes ('smollm2', 'gemma3')")
        s.add_argument("--kind", required=True, choices=head_kinds())
        s.add_argument("--profile", default="make", choices=("make", "long"))
        s.add_argument("--rebuild", action="store_true", help="rebuild the head entry even if cached")
        if name == "eval":
            s.add_argument("--depth", type=int, default=5, help="draft depths 1 .. D (Medusa: at most its heads)")
            s.add_argument("--scope", default="generated", choices=("generated", "all"),
                           help="positions on the target's own continuations, or every held-out position")
            s.add_argument("--threads", type=int, default=2, help="torch threads of the evaluation")
            s.add_argument("--json", default=None, help="also write the tables and facts to this JSON file")
    return p


def main(argv: list[str] | None = None) -> dict:
    """The command line (``python -m spade_lib.zoo.head_cli build|eval --pair P --kind K [--profile make|long]``);
    returns what it printed, as a dict (tests)."""
    args = _parser().parse_args(argv)
    entry = pair_head_entry(args.pair, args.kind, args.profile, rebuild=args.rebuild)
    facts = build_facts(read_manifest(entry))
    print(f"{args.pair} {args.kind} ({args.profile}): {entry}")
    print("build: " + ", ".join(f"{k} = {_fmt(v)}" for k, v in facts.items()))
    out = {"entry": str(entry), "build": facts}
    if args.command == "eval":
        def body():
            tdir = target_dir(args.pair)
            held = head_eval.heldout_entry(tdir, args.pair, head_eval.heldout_config(args.pair))
            target, _ = load_target(tdir)
            head = load_head(entry / "head", target)
            return held, head_eval.evaluate_head(target, head, head_eval.heldout_sequences(held), args.depth)

        held, result = with_threads(args.threads, body)
        print(f"held-out: {held} ({result['sequences']} sequences, {result['tokens']} tokens; corpus held-out files "
              "and the target's greedy continuations)")
        print(head_eval.format_table(result, args.scope))
        out.update(heldout=str(held), depth=result["depth"], mean_accepted=result["mean_accepted"],
                   **{scope: result[scope].to_dict(orient="records") for scope in head_eval.SCOPES})
        if args.json:
            write_json(Path(args.json), out)
    return out


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


if __name__ == "__main__":  # run the importable module's main, not a second copy of this one
    from spade_lib.zoo.head_cli import main as _main

    _main()
