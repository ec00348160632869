"""Decode-speed benchmark: SPADE vs autoregressive, HF assisted vs plain HF, and vs the cost model.

Not a test: it prints ratios measured in one run on one machine. On a pair (``--pair default`` the
embedded pair, ``smollm2`` where built) it decodes the same prompts with

- ``ar``: SPADE's autoregressive loop;        ``spade``: SPADE's speculative decoder (draft, gamma);
- ``hf``: plain ``model.generate``;            ``hf_assisted``: HF assisted generation, same draft and
  gamma (constant schedule, threshold 0);

and with ``--compare`` also ``spade_adaptive`` (:class:`spade_lib.decoding.drafts.adaptive.AdaptiveGamma` fed the costs
measured below, plus the loop's per-step overhead measured on the first prompt), SPADE at each fixed
gamma of ``--gammas``, and HF's own schedules: ``hf_heuristic``
(``num_assistant_tokens_schedule="heuristic"`` from ``gamma``) and ``hf_confidence`` (HF's defaults:
20 tokens, ``assistant_confidence_threshold=0.4``).

With ``--tree SPEC`` (a :class:`spade_lib.decoding.drafts.tree_drafting.TreeConfig` spec of a model shape, e.g.
``eagle2:nodes=16,depth=4,topk=4``, ``static:choices=medusa63``, ``sampled:widths=4-1-1-1``) it also runs
``spade_tree``: the same draft model proposing that tree (gamma: the tree's depth), verified in one
tree-masked target forward per step. It prints the tree's ``tau`` (tokens per step), its node count per
drafted step, ``r(N)`` (the target's ``N + 1``-row forward with the tree mask over its 1-token forward,
measured like ``r(g)``, :func:`spade_lib.decoding.studies.costs.measure_tree_cost`, on the largest tree drafted)
and its speedup over AR and over the chain, paired per round like every other ratio.

**Robust timing on a shared machine.** Every (prompt, repeat) is a *round* that runs all methods
back to back, in an order rotated from round to round. A speedup is the **median over rounds of the
paired ratio** of per-token times (``t / new_tokens``) measured in the same round, so a burst of load
hits both sides of a ratio alike and a burst that hits one round moves the median little. With one
torch thread on the CPU (the default) the clock is this process's **CPU time** (``time.process_time``),
which another busy process barely changes (the cores are time-shared, not our instruction count);
the wall-clock ratios are printed next to it. With more threads the clock is wall time (OpenMP threads
spin, so CPU time would count their waiting). The 1-minute load average before and after, and the
CPU-seconds per second that *other* processes used during the run (``/proc/stat`` minus our own),
are printed, with a warning when the machine was busy.

**Costs and predictions.** ``c`` (draft forward / target forward, one token each) and
``r(g)`` (``g+1``-token / 1-token target forward, ``g = 1 .. max``) are measured with the same clock in
interleaved micro-benchmarks of the adapters used for decoding (a ``--context``-token KV cache);
``alpha`` is SPADE's acceptance rate over its own trace (one recorded, untimed pass per prompt). Then
``prediction = E[tokens](alpha, gamma) / (gamma c + 1)`` (Leviathan et al. 2023, Thm 3.8) and the
r-aware ``E[tokens] / (gamma c + r(gamma))`` (:func:`spade_lib.theory.speedup`); a line after them adds the
loop's per-step cost ``o`` (:func:`spade_lib.decoding.studies.costs.measure_loop_overhead`, ``o = null step / AR step
- r(1)``), ``E[tokens] / (gamma c + r(gamma) + o)``, and the two-sided cost-model control
(:func:`spade_lib.runs.controls.prediction_warnings`, SPADE and the null draft, against their IQRs: printed
with ``!!!``, not an exit status). The last line is exactly::

    spade_vs_ar=<x> spade_vs_hf_assisted=<x> fraction_of_prediction=<x> fraction_of_r_aware=<x> tau=<x> r_min=<x> null_vs_ar=<x>

(``spade_vs_hf_assisted`` = SPADE's speedup over AR / HF assisted's over plain HF, paired per round;
``r_min`` the smallest ``r(g)`` for ``g = 1 .. 8``; ``null_vs_ar`` the null-draft control's speedup).

**Physics before ratios.** Every step of speculative decoding costs at least one target forward, so a
speedup above ``tau``, a verify cost ``r(g) < 1`` or a null draft (``null``: every draft rejected,
``spade_lib.decoding.drafts.drafters.NullDrafter``) faster than autoregressive decoding is a defect of the
baseline, not a result: the benchmark prints each violation and **exits with status 2**
(:mod:`spade_lib.runs.controls`). It also prints the AR loop's weight-streaming rate (parameter bytes
read per generated token / time per token) beside the machine's copy bandwidth
(:func:`spade_lib.runs.timing.copy_bandwidth`): on a CPU an AR step is bound by streaming the weights,
so that ratio says how close the baseline is to the machine's limit. It runs at the machine's default
thread count (what the notebooks use) unless ``--threads`` says otherwise.

Usage: ``python benchmarks/bench_decode.py [--pair default] [--temperature 0] [--gamma 4]
[--n-per-category 2] [--max-new-tokens 128] [--repeats 3] [--threads 0] [--compare] [--backend auto]
[--profile] [--tree SPEC]``.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from spade_lib import devices  # noqa: E402
from spade_lib.decoding import baselines  # noqa: E402
from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder, _eos_set  # noqa: E402
from spade_lib.decoding.drafts.adaptive import AdaptiveGamma  # noqa: E402
from spade_lib.decoding.drafts.drafters import ModelDrafter, NullDrafter  # noqa: E402
from spade_lib.decoding.drafts.tree_drafting import MODEL_SHAPES, TreeConfig  # noqa: E402
from spade_lib.decoding.model.adapter import CausalLMAdapter  # noqa: E402
from spade_lib.decoding.studies.costs import measure_costs, measure_loop_overhead, measure_tree_cost  # noqa: E402
from spade_lib.runs import metrics, timing  # noqa: E402
from spade_lib.runs import controls  # noqa: E402
from spade_lib.runs.config import RunConfig, generation_seed, prompt_ids  # noqa: E402
from spade_lib.sampling import SamplingConfig  # noqa: E402
from spade_lib.theory import expected_tokens, speedup as theory_speedup  # noqa: E402

CORE = ("ar", "spade", "hf", "hf_assisted")
# baseline of each method: ar vs hf compares our AR loop with plain generate; spade* -> ar, hf* -> hf
BASE = {"ar": "hf", "spade": "ar", "null": "ar", "hf_assisted": "hf"}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="default", help="pair name for spade_lib.zoo.pairs.load_pair")
    ap.add_argument("--draft", default=None, help="draft of the pair (default: the pair's default draft)")
    ap.add_argument("--suite", default="", help="'embedded', 'humaneval' or a suite .jsonl (default: embedded; "
                                                 "humaneval for the real pair smollm2)")
    ap.add_argument("--n-per-category", type=int, default=2, help="prompts per suite category")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per prompt (each runs every method once)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads (0: the machine's default, as the notebooks run; recorded)")
    ap.add_argument("--clock", choices=("auto", "cpu", "wall"), default="auto",
                    help="auto: process CPU time with 1 thread on CPU, else wall time")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--backend", choices=("auto", "hf"), default="auto",
                    help="SPADE's forward: auto (lean where covered) or hf (the model's own forward)")
    ap.add_argument("--compare", action="store_true",
                    help="also adaptive gamma, fixed --gammas, and HF's heuristic / confidence schedules")
    ap.add_argument("--gammas", default="1,2,3,4,6,8", help="fixed gammas for --compare")
    ap.add_argument("--max-gamma", type=int, default=8, help="adaptive gamma's longest block; r measured up to it")
    ap.add_argument("--context", type=int, default=128, help="KV-cache tokens in the cost micro-benchmarks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="also cProfile SPADE's decode loop")
    ap.add_argument("--tree", default="", metavar="SPEC",
                    help="also time the draft's tree against its chain (method spade_tree), e.g. "
                         "eagle2:nodes=16,depth=4,topk=4 (spade_lib.decoding.drafts.tree_drafting.TreeConfig.parse)")
    args = ap.parse_args(argv)
    try:
        args.tree = TreeConfig.parse(args.tree) if args.tree else None
    except ValueError as e:
        ap.error(f"--tree: {e}")
    if args.tree is not None and args.tree.shape not in MODEL_SHAPES:
        ap.error(f"--tree: the draft model grows one of {MODEL_SHAPES}, not {args.tree.shape!r}")
    if args.threads < 0:
        ap.error("--threads must be >= 0 (0: the machine's default)")
    for name in ("n_per_category", "max_new_tokens", "gamma", "repeats", "max_gamma", "context"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


# ------------------------------------------------------------------------------------------
# clocks and load


def make_clock(kind: str) -> Callable[[], float]:
    return time.process_time if kind == "cpu" else devices.clock


def _busy_jiffies() -> tuple[float, float] | None:
    """(busy CPU-seconds of the whole machine, wall seconds) from /proc/stat, or None."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    v = [float(x) for x in fields]
    idle = v[3] + (v[4] if len(v) > 4 else 0.0)
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return (sum(v[:8]) - idle) / hz, devices.clock()


class LoadMonitor:
    """Load average before/after and the CPU-seconds per second used by *other* processes."""

    def __init__(self):
        self.load_before = self._loadavg()
        self.stat0, self.own0 = _busy_jiffies(), time.process_time()

    @staticmethod
    def _loadavg() -> list[float]:
        try:
            return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
        except OSError:
            return [float("nan")] * 3

    def finish(self) -> dict:
        stat1, own1 = _busy_jiffies(), time.process_time()
        others = float("nan")
        if self.stat0 is not None and stat1 is not None and stat1[1] > self.stat0[1]:
            others = max(0.0, ((stat1[0] - self.stat0[0]) - (own1 - self.own0)) / (stat1[1] - self.stat0[1]))
        return {"load_before": self.load_before, "load_after": self._loadavg(), "others_cores": others}


# ------------------------------------------------------------------------------------------
# methods


def hf_assisted_variant(target, assistant, ids, n, sampling, seed, *, num_tokens, schedule, threshold):
    """HF assisted generation with its own schedule options (the assistant's generation config is
    restored afterwards, so every call starts from ``num_tokens``). Returns the new token ids."""
    device = next(target.parameters()).device
    prompt = torch.tensor([ids], dtype=torch.long, device=device)
    eos = sorted(_eos_set(target, None))
    saved = copy.deepcopy(assistant.generation_config)
    g = assistant.generation_config
    g.num_assistant_tokens, g.num_assistant_tokens_schedule, g.assistant_confidence_threshold = \
        num_tokens, schedule, threshold
    try:
        torch.manual_seed(seed)
        out = target.generate(prompt, **baselines.hf_sampling_kwargs(sampling), max_new_tokens=n,
                              attention_mask=torch.ones_like(prompt), eos_token_id=eos,
                              pad_token_id=eos[0] if eos else 0, assistant_model=assistant)
    finally:
        assistant.generation_config = saved
    return out[0, prompt.shape[1]:].tolist()


def spade_method(pair, draft_name: str, args, sampling: SamplingConfig, policy_kw: dict, tree=None):
    """SPADE with its own adapters (``--backend``), step-level records only; fn(ids, n, seed). ``tree``:
    the draft proposes that :class:`TreeConfig` instead of a chain."""
    dec = SpeculativeDecoder(CausalLMAdapter(pair.target, backend=args.backend),
                             ModelDrafter(CausalLMAdapter(pair.drafts[draft_name], backend=args.backend), tree=tree),
                             sampling=sampling, record="light", **policy_kw)
    return lambda ids, n, seed: (lambda o: (o.tokens, o.accept_lengths, o.gammas))(dec.generate(ids, n, seed=seed))


class _ARMethod:
    """SPADE's AR loop as a method; ``decode`` keeps each call's (decode-step seconds, decode steps): the
    steps after the prefill, each one 1-token forward (the streaming rate is a property of those)."""

    def __init__(self, dec: AutoregressiveDecoder):
        self.dec, self.decode = dec, []

    def __call__(self, ids, n, seed):
        out = self.dec.generate(ids, n, seed=seed)
        if len(out.tokens) > 1:  # the first token comes from the prefill's logits
            self.decode.append((out.timing["verify"], len(out.tokens) - 1))
        return out.tokens, None, None


def build_methods(pair, draft_name: str, args, sampling: SamplingConfig, costs: dict | None) -> dict:
    """name -> fn(ids, n, seed) -> (new token ids, accept lengths or None)."""
    draft_model = pair.drafts[draft_name]

    def spade(policy_kw):
        return spade_method(pair, draft_name, args, sampling, policy_kw)

    ar_dec = AutoregressiveDecoder(CausalLMAdapter(pair.target, backend=args.backend), sampling=sampling)
    methods = {
        "ar": _ARMethod(ar_dec),
        "spade": spade({"gamma": args.gamma}),
        "null": (lambda dec: lambda ids, n, seed: (lambda o: (o.tokens, o.accept_lengths, o.gammas))(
            dec.generate(ids, n, seed=seed)))(SpeculativeDecoder(
                CausalLMAdapter(pair.target, backend=args.backend), NullDrafter(), gamma=args.gamma,
                sampling=sampling, record="light")),
        "hf": lambda ids, n, seed: (baselines.hf_generate(pair.target, ids, n, sampling=sampling,
                                                          seed=seed).tokens, None, None),
        "hf_assisted": lambda ids, n, seed: (baselines.hf_generate(pair.target, ids, n, sampling=sampling,
                                                                   assistant=draft_model, gamma=args.gamma,
                                                                   seed=seed).tokens, None, None),
    }
    if args.tree is not None:
        methods["spade_tree"] = spade_method(pair, draft_name, args, sampling, {"gamma": args.tree.max_depth},
                                             tree=args.tree)
    if args.compare:
        for g in sorted({int(x) for x in args.gammas.split(",") if x.strip()} - {args.gamma}):
            methods[f"spade_g{g}"] = spade({"gamma": g})
        methods["hf_heuristic"] = lambda ids, n, seed: (hf_assisted_variant(
            pair.target, draft_model, ids, n, sampling, seed, num_tokens=args.gamma, schedule="heuristic",
            threshold=0.0), None, None)
        methods["hf_confidence"] = lambda ids, n, seed: (hf_assisted_variant(
            pair.target, draft_model, ids, n, sampling, seed, num_tokens=20, schedule="constant",
            threshold=0.4), None, None)
    return methods


def adaptive_policy(costs: dict, max_gamma: int, overhead: float = 0.0) -> AdaptiveGamma:
    """:class:`AdaptiveGamma` with the measured ``c`` and ``r(g) + overhead`` (the loop's per-step cost
    beyond the forwards, in target-forward units, measured before the timed rounds)."""
    return AdaptiveGamma(c=costs["c"], max_gamma=max_gamma,
                         verify_cost=tuple(costs["r"][g] + overhead for g in range(1, max_gamma + 1)))


def step_overhead(methods: dict, ids, n: int, gamma: int, costs: dict, clock, reps: int = 3) -> float:
    """Per-step loop cost beyond ``gamma c + r(gamma)``, in AR-token units: SPADE's time per step over
    AR's time per token, minus the cost model's forwards (median of ``reps`` paired generations)."""
    vals = []
    for _ in range(reps):
        t0 = clock()
        toks, acc, _ = methods["spade"](ids, n, 0)
        t1 = clock()
        ar_toks, _, _ = methods["ar"](ids, n, 0)
        t2 = clock()
        per_step = (t1 - t0) / max(1, len(acc))
        per_tok = (t2 - t1) / max(1, len(ar_toks))
        vals.append(per_step / per_tok - (gamma * costs["c"] + costs["r"][gamma]))
    return max(0.0, float(np.median(vals)))


def base_of(m: str) -> str:
    return BASE.get(m, "ar" if m.startswith("spade") else "hf")


# ------------------------------------------------------------------------------------------
# the run


def main(argv=None) -> None:
    args = parse_args(argv)
    from spade_lib.bench import default_suite, humaneval_suite, load_suite
    from spade_lib.zoo.pairs import default_suite_name, load_for_timing
    from spade_lib.zoo.registry import real_pair, real_pairs

    threads = timing.fix_threads(args.threads) if args.threads else torch.get_num_threads()
    device = devices.resolve_device(args.device)
    clock_kind = args.clock if args.clock != "auto" else ("cpu" if threads == 1 and device.type == "cpu" else "wall")
    clock = make_clock(clock_kind)
    t0 = devices.clock()
    try:  # c and HF assisted generation need a draft model that reads the target's tokens
        pair, draft_name = load_for_timing(args.pair, args.draft, device=device)
    except ValueError as e:
        raise SystemExit(f"--{e}") from None
    sampling = SamplingConfig(temperature=args.temperature)
    suite_name = args.suite or default_suite_name(args.pair)
    if suite_name == "embedded":
        suite = default_suite(tokenizer=args.pair, n_per_category=args.n_per_category, seed=args.seed)
    elif suite_name == "humaneval":
        suite = humaneval_suite(n_per_category=args.n_per_category, seed=args.seed)
    else:
        suite = load_suite(suite_name).filter(n_per_category=args.n_per_category)
    chat = real_pair(args.pair).chat_template if args.pair in real_pairs() else "auto"
    cfg = RunConfig(method="ar", temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                    seed=args.seed, device=str(device), chat_template=chat)
    prompts = [(r, prompt_ids(pair.tokenizer, r["turns"][0], cfg)) for r in suite.rows]
    print(f"pair={pair.name} draft={draft_name} suite={suite.name} ({len(prompts)} prompts, "
          f"{len(suite.categories)} categories) max_new_tokens={args.max_new_tokens} gamma={args.gamma} "
          f"T={args.temperature:g} repeats={args.repeats} threads={threads} clock={clock_kind} device={device} "
          f"backend={args.backend} (setup {devices.clock() - t0:.1f} s)")
    fp = timing.environment_fingerprint(device)
    print(f"cpu={fp['cpu_model']!r} cpus={os.cpu_count()} gpu={fp['gpu']!r} torch={fp['torch']} "
          f"transformers={fp['transformers']} git={str(fp['git_commit'])[:10]}{'+dirty' if fp['git_dirty'] else ''}")
    monitor = LoadMonitor()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in monitor.load_before)}")

    tgt_ad = CausalLMAdapter(pair.target, backend=args.backend)
    dr_ad = CausalLMAdapter(pair.drafts[draft_name], backend=args.backend)
    costs = measure_costs(tgt_ad, dr_ad, args.max_gamma, args.context, clock, device=device)
    print(f"costs ({clock_kind} clock, {costs['context']}-token cache, backend target={tgt_ad.backend} "
          f"draft={dr_ad.backend}): target 1-token forward {costs['t_target'] * 1e3:.2f} ms, draft "
          f"{costs['t_draft'] * 1e3:.3f} ms -> c = {costs['c']:.4f}; r(g) = "
          + " ".join(f"{g}:{v:.3f}" for g, v in costs["r"].items()))

    methods = build_methods(pair, draft_name, args, sampling, costs)
    for m in list(methods):  # warm-up: every method once on the first prompt
        methods[m](prompts[0][1], args.max_new_tokens, 0)
    if args.compare:
        g_ref = min(args.gamma, args.max_gamma)
        overhead = step_overhead(methods, prompts[0][1], args.max_new_tokens, g_ref, costs, clock)
        pol = adaptive_policy(costs, args.max_gamma, overhead)
        print(f"adaptive gamma: c = {pol.c:.4f}, per-step loop overhead {overhead:.3f} target forwards (added to r); "
              "optimal gamma at alpha 0.5/0.7/0.9: " + "/".join(str(pol.gamma_at(a)) for a in (0.5, 0.7, 0.9)))
        methods["spade_adaptive"] = spade_method(pair, draft_name, args, sampling, {"policy": pol})
        methods["spade_adaptive"](prompts[0][1], args.max_new_tokens, 0)
    names = list(methods)
    methods["ar"].decode.clear()  # the streaming rate counts the timed rounds only

    rows = []
    rnd = 0
    t_bench = devices.clock()
    for i, (row, ids) in enumerate(prompts):
        seed = generation_seed(args.seed, row["question_id"], 0)
        for rep in range(args.repeats):
            k = rnd % len(names)
            for m in names[k:] + names[:k]:  # rotate so no method always runs first
                w0, c0 = devices.clock(), clock()
                toks, acc, gammas = methods[m](ids, args.max_new_tokens, seed)
                devices.synchronize(device)
                c1, w1 = clock(), devices.clock()
                rows.append({"round": rnd, "prompt": i, "method": m, "new_tokens": len(toks), "cpu": c1 - c0,
                             "wall": w1 - w0, "tokens": toks, "accept_lengths": acc, "gammas": gammas})
            rnd += 1
    elapsed = devices.clock() - t_bench
    load = monitor.finish()
    df = pd.DataFrame(rows)
    df["sec_per_tok"] = df["cpu" if clock_kind == "cpu" else "wall"] / df["new_tokens"].clip(lower=1)
    df["wall_per_tok"] = df["wall"] / df["new_tokens"].clip(lower=1)

    # exactness: greedy SPADE (any gamma / policy) must reproduce AR token for token
    first = df[df["round"].isin(df.groupby("prompt")["round"].min())]
    out = first.pivot(index="prompt", columns="method", values="tokens")
    same = {m: int(sum(a == b for a, b in zip(out[m], out["ar"]))) for m in names
            if m.startswith("spade") or m == "null"}
    hf_same = int(sum(a == b for a, b in zip(out["hf"], out["ar"])))
    print(f"\n{len(prompts)} prompts x {args.repeats} rounds x {len(names)} methods in {elapsed:.0f} s. "
          f"Outputs equal to AR on {len(prompts)} prompts: "
          + ", ".join(f"{m} {v}" for m, v in same.items()) + f", hf {hf_same}"
          + (" (greedy: SPADE must be all)" if sampling.greedy else " (sampling: differ by design)"))

    # paired per-round ratios
    per = df.pivot(index="round", columns="method", values="sec_per_tok")
    per_wall = df.pivot(index="round", columns="method", values="wall_per_tok")
    print(f"\n{'method':<15} {'tok/s':>8} {'wall tok/s':>10} {'vs':>4} {'speedup':>8} {'IQR':>15} "
          f"{'wall speedup':>12} {'ratio of totals':>15}")
    sp, iqr = {}, {}
    for m in names:
        b = base_of(m)
        ratios = per[b] / per[m]
        q25, q50, q75 = np.percentile(ratios, [25, 50, 75])
        sp[m] = float(q50)
        iqr[m] = (float(q25), float(q75))
        wall = float(np.median(per_wall[b] / per_wall[m]))
        sel = df[df["method"] == m]
        tot = (sel["new_tokens"].sum() / sel["sec_per_tok"].mul(sel["new_tokens"]).sum())
        bsel = df[df["method"] == b]
        tot_b = bsel["new_tokens"].sum() / bsel["sec_per_tok"].mul(bsel["new_tokens"]).sum()
        wall_tps = sel["new_tokens"].sum() / sel["wall"].sum()
        print(f"{m:<15} {tot:8.1f} {wall_tps:10.1f} {b:>4} {q50:8.3f} {f'[{q25:.3f}, {q75:.3f}]':>15} {wall:12.3f} "
              f"{tot / tot_b:15.3f}")
        if m == "null":
            null_iqr = (float(q25), float(q75))
    vs_hf = float(np.median((per["ar"] / per["spade"]) / (per["hf"] / per["hf_assisted"])))
    direct = float(np.median(per["hf_assisted"] / per["spade"]))
    print(f"SPADE vs HF assisted, same draft and gamma: ratio of speedups {vs_hf:.3f}; "
          f"tokens/s directly {direct:.3f}")

    # acceptance from one recorded (untimed) pass per prompt
    rec = SpeculativeDecoder(tgt_ad, ModelDrafter(dr_ad), gamma=args.gamma, sampling=sampling, record=True)
    records = []
    for i, (row, ids) in enumerate(prompts):
        seed = generation_seed(args.seed, row["question_id"], 0)
        records += [{"prompt_id": str(i), "sample": 0, **r} for r in rec.generate(ids, args.max_new_tokens,
                                                                               seed=seed).records()]
    tr = pd.DataFrame(records)
    alpha = metrics.acceptance_rate(tr)
    spade_rows = df[(df["method"] == "spade") & df["round"].isin(first["round"])]
    tau = metrics.mean_accepted_length(spade_rows)
    g, c, r = args.gamma, costs["c"], costs["r"].get(args.gamma)
    if r is None:
        r = measure_costs(tgt_ad, dr_ad, args.gamma, args.context, clock, device=device)["r"][args.gamma]
    e_tokens = float(expected_tokens(alpha, g))
    predicted = float(theory_speedup(alpha, g, c))
    predicted_r = float(theory_speedup(alpha, g, c, verify_cost=r))
    print(f"\nSPADE: alpha={alpha:.3f} tau={tau:.3f} (iid E[tokens] {e_tokens:.3f}) c={c:.4f} r({g})={r:.3f}")
    print(f"Thm 3.8 prediction {predicted:.3f} (r=1); r-aware E/(gamma c + r) {predicted_r:.3f}; "
          f"measured {sp['spade']:.3f}; with the measured tau instead of alpha: {tau / (g * c + r):.3f}")
    # the loop's own per-step cost (spade_lib.runs.costs: o = null step at gamma 1 - r(1)) and the two-sided
    # cost-model control: a prediction outside the measured IQR is a warning, not a physics violation
    loop = measure_loop_overhead(tgt_ad, context=args.context, device=device)
    o = max(0.0, loop["null_step"] - costs["r"][1])
    predicted_o = float(theory_speedup(alpha, g, c, verify_cost=r, overhead=o))
    print(f"loop overhead o = {o:.3f} target steps (a null-draft step at gamma 1 costs {loop['null_step']:.3f} AR "
          f"steps, in turns); prediction tau-model E/(gamma c + r + o) {predicted_o:.3f} "
          f"(measured / predicted {sp['spade'] / predicted_o:.3f})")
    model_rows = [{"pair": pair.name, "label": f"{m}-{draft_name if m == 'spade' else 'null'}-g{g}", "method": "spade",
                   "draft": draft_name if m == "spade" else "null", "T": args.temperature, "speedup": sp[m],
                   "speedup_low": iqr[m][0], "speedup_high": iqr[m][1], "predicted": pred, "overhead": o}
                  for m, pred in (("spade", predicted_o), ("null", 1.0 / (r + o))) if m in sp]
    for line in controls.prediction_warnings(model_rows):
        print("!!! " + line + " [interval: IQR of the per-round ratios]")

    problems_tree = []
    if args.tree is not None:
        problems_tree = report_tree(args, df, first, per, sp, tgt_ad, dr_ad, prompts, sampling, clock, device, pair.name)

    if args.compare:
        fixed = {m: v for m, v in sp.items() if m == "spade" or m.startswith("spade_g")}
        best = max(fixed, key=fixed.get)
        ad = df[df["method"] == "spade_adaptive"]["gammas"]
        mean_gamma = float(np.mean(np.concatenate([np.asarray(x, dtype=float) for x in ad])))
        hf_best = max((m for m in sp if m.startswith("hf_")), key=lambda m: sp[m])
        print(f"\nbest fixed gamma: {best} ({fixed[best]:.3f}); adaptive {sp['spade_adaptive']:.3f} "
              f"(mean gamma {mean_gamma:.2f}, {sp['spade_adaptive'] / fixed[best]:.3f} of the best fixed); "
              f"HF heuristic {sp['hf_heuristic']:.3f}, HF confidence {sp['hf_confidence']:.3f} (vs plain HF)")
        best_spade = max(sp[m] for m in sp if m.startswith("spade"))
        print(f"best SPADE configuration / best HF assisted configuration (each vs its own baseline): "
              f"{best_spade / sp[hf_best]:.3f} ({hf_best})")

    lb, la = load["load_before"], load["load_after"]
    print(f"\nload average before {lb[0]:.2f}, after {la[0]:.2f} (1 min); other processes used "
          f"{load['others_cores']:.2f} cores on average during the run ({os.cpu_count()} CPUs, "
          f"{threads} thread(s) here)")
    busy = load["others_cores"] > 0.5 or max(lb[0], la[0]) > threads + 0.5
    if busy:
        print("WARNING: the machine was busy during this run; the ratios are paired medians "
              f"({clock_kind} clock), but treat the absolute tok/s as inflated and re-run on a quiet machine.")

    if args.profile:
        profile_spade(methods["spade"], prompts, args)

    # the physical limit of the baseline: weight bytes streamed per AR token vs the machine's copy bandwidth
    ar_rows = df[df["method"] == "ar"]
    ar_tok = float(ar_rows["wall"].sum() / ar_rows["new_tokens"].sum())  # prefill included
    dec = methods["ar"].decode
    ar_step = sum(t for t, _ in dec) / max(1, sum(n for _, n in dec))  # one decode step (1-token forward + sampling)
    lean = methods["ar"].dec.target.lean
    # what a step streams (LeanForward.weight_bytes); on the HF forward every parameter, an upper bound
    nbytes = lean.weight_bytes() if lean is not None else sum(p.numel() * p.element_size() for p in pair.target.parameters())
    bw = timing.copy_bandwidth()
    print(f"\nAR loop: {1 / ar_tok:.1f} tok/s (wall, prefill included); a decode step {ar_step * 1e3:.2f} ms, "
          f"{nbytes / 1e6:.0f} MB of target weights per step -> {nbytes / ar_step / 1e9:.1f} GB/s streamed; copy "
          f"bandwidth here {bw / 1e9:.1f} GB/s (read + write of a {timing.COPY_BYTES >> 20} MiB copy) -> "
          f"{nbytes / ar_step / bw:.2f} of it. SPADE's AR loop vs HF generate: {sp['ar']:.3f}x")
    # the same, in turns: a copy, then 8 AR decode steps at the first prompt's context, per round
    ad = methods["ar"].dec.target
    ids0 = prompts[0][1]
    with torch.inference_mode():
        ad.prefill(torch.as_tensor(ids0, device=ad.device))
        length, tok = ad.length, torch.tensor([0], device=ad.device)

        def ar_step():
            ad.extend(tok, last_only=True).argmax(dim=-1)
            ad.rollback(length)

        st = timing.streaming_vs_copy(ar_step, nbytes)
    print(f"AR decode step in turns with the copy ({len(ids0)}-token context): {st['step_s'] * 1e3:.2f} ms, "
          f"{st['rate'] / 1e9:.1f} GB/s streamed vs copy {st['copy'] / 1e9:.1f} GB/s -> {st['ratio']:.2f} of it "
          f"[{st['ratio_q1']:.2f}, {st['ratio_q3']:.2f}] (median and IQR of per-round ratios)")

    # physical controls: r(g) >= 1, speedups <= tau, the null draft <= 1 (beyond the noise of the run)
    r_min = min(v for g, v in costs["r"].items() if g <= 8)
    problems = controls.cost_warnings({draft_name: costs}, pair=pair.name) + problems_tree
    if sp["spade"] > tau * 1.05:
        problems.append(f"physical control: {pair.name} SPADE gamma {g} speedup {sp['spade']:.3f} > tau {tau:.3f}: "
                        "a step costs at least one target forward, so this is a defect of the baseline")
    if null_iqr[0] > 1.0:
        problems.append(f"physical control: {pair.name} null draft speedup {sp['null']:.3f} (IQR from "
                        f"{null_iqr[0]:.3f}) > 1: a draft that is always rejected cannot speed decoding up")
    for line in problems:
        print("PHYSICS VIOLATION: " + line)

    frac = sp["spade"] / predicted
    frac_r = sp["spade"] / predicted_r
    print(f"spade_vs_ar={sp['spade']:.3f} spade_vs_hf_assisted={vs_hf:.3f} "
          f"fraction_of_prediction={frac:.3f} fraction_of_r_aware={frac_r:.3f} "
          f"tau={tau:.3f} r_min={r_min:.3f} null_vs_ar={sp['null']:.3f}")
    if problems:
        sys.exit(2)


def report_tree(args, df, first, per, sp, tgt_ad, dr_ad, prompts, sampling, clock, device, pair_name) -> list[str]:
    """The ``--tree`` figures: tau, nodes per drafted step, r(N) of the largest tree drafted (one recorded,
    untimed pass on the first prompt gives its parents), the speedup over AR and over the chain (paired per
    round, with the IQR); returns the physical-control violations (a speedup above tau)."""
    rows = df[(df["method"] == "spade_tree") & df["round"].isin(first["round"])]
    tau = metrics.mean_accepted_length(rows)
    nodes = np.concatenate([np.asarray(g, dtype=float) for g in rows["gammas"]])
    nodes = nodes[nodes > 0]
    rec = SpeculativeDecoder(tgt_ad, ModelDrafter(dr_ad, tree=args.tree), gamma=args.tree.max_depth,
                             sampling=sampling, record=True)
    steps = [s for s in rec.generate(prompts[0][1], args.max_new_tokens, seed=0).steps if s.tree is not None]
    if not steps:
        print(f"\ntree {args.tree.spec()}: no tree was drafted on the first prompt; r(N) not measured")
        return []
    parents = max(steps, key=lambda s: s.gamma).tree["parent"]
    cost = measure_tree_cost(tgt_ad, parents, args.context, clock, device=device)
    n = cost["n_nodes"]
    vs_ar = per["ar"] / per["spade_tree"]
    vs_chain = per["spade"] / per["spade_tree"]
    q_ar, q_chain = np.percentile(vs_ar, [25, 75]), np.percentile(vs_chain, [25, 75])
    print(f"\ntree {args.tree.spec()} (gamma {args.tree.max_depth}): tau={tau:.3f} nodes={float(nodes.mean()):.1f} "
          f"per drafted step (max {n}) r({n})={cost['r']:.3f} (tree mask, {n + 1} rows over 1); speedup vs ar {sp['spade_tree']:.3f} [{q_ar[0]:.3f}, {q_ar[1]:.3f}], "
          f"vs the chain (gamma {args.gamma}) {float(np.median(vs_chain)):.3f} [{q_chain[0]:.3f}, {q_chain[1]:.3f}]; "
          f"tau / r({n}) = {tau / cost['r']:.3f} (the speedup with a free draft)")
    if sp["spade_tree"] > tau * 1.05:
        return [f"physical control: {pair_name} SPADE tree {args.tree.spec()} speedup {sp['spade_tree']:.3f} > "
                f"tau {tau:.3f}: a step costs at least one target forward, so this is a defect of the baseline"]
    return []


def profile_spade(fn, prompts, args) -> None:
    """A cProfile of SPADE's timed loop on up to 4 prompts (top functions by own time)."""
    prof = cProfile.Profile()
    prof.enable()
    for row, ids in prompts[: min(4, len(prompts))]:
        fn(ids, args.max_new_tokens, 1)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    print("\n--- cProfile of SPADE (tottime) ---")
    print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
