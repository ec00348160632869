"""GPU cost model: measured c and r(gamma) of real-size architectures, and the embedded pair end to end.

One prepared script for a GPU machine (it also runs on CPU with ``--shapes tiny``, which the tests do).

1. **Costs of real pairs' shapes.** Randomly initialised models with the exact architecture configs
   below (Qwen2.5-0.5B -> Qwen2.5-7B, Llama-3.2-1B -> Llama-3.1-8B; written here from their public
   ``config.json`` files, nothing is downloaded), in ``--dtype`` (bf16) on ``--device``, batch 1, a
   ``--context``-token KV cache (512). Each decode forward goes through :class:`spade_lib.decoding.model.adapter.CausalLMAdapter`
   exactly as in decoding (extend ``k`` tokens, roll back), and the pair's draft and target forwards are
   timed **in turns** by SPADE's one cost measurement, :func:`spade_lib.decoding.studies.costs.measure_costs`
   (every round runs each forward, in a rotated order, with CUDA synchronisation; ``--reps`` rounds):
   ``c = t_draft(1) / t_target(1)`` and ``r(gamma) = t_target(gamma + 1) / t_target(1)``, gamma 1..8, each
   the median of the per-round ratios, so load that hits one round hits numerator and denominator alike.
   The ``forward`` rows are the medians of the same timings. Both models of a pair are resident while
   they are timed. Random weights cost exactly what trained ones do (same shapes, same kernels).
2. **Predicted speedups.** ``theory.speedup(alpha, gamma, c, verify_cost=r(gamma))`` at the optimal
   gamma for an *assumed* acceptance grid (``--alphas``, default 0.6/0.7/0.8: the range Leviathan et al.
   2023, Table 3, report for drafts 10-100x smaller than their targets). These alphas are not measured
   on these pairs; the CSV labels them ``alpha_source=assumed``.
3. **The embedded pair end to end** (``--pair default``, skipped if it is not in the cache): greedy
   SPADE vs SPADE's autoregressive loop on a few embedded prompts, output equality and the speedup.

Writes ``--out`` (CSV, long format: one row per measured quantity) and prints a table. Finishes in
about 3 minutes on an H200 (model construction dominates). Usage::

    python benchmarks/gpu_costs.py --device cuda --out runs/gpu_costs.csv
    python benchmarks/gpu_costs.py --device cpu --shapes tiny --out /tmp/costs.csv   # a smoke run
    # the embedded default pair's shapes on CPU (fp32, CPU-time clock), lean vs Hugging Face forward:
    python benchmarks/gpu_costs.py --device cpu --dtype float32 --shapes embedded --context 128 --clock cpu \
        --reps 30 --pair '' --backend hf --out runs/costs_embedded_hf.csv
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from spade_lib import io as sio  # noqa: E402
from spade_lib import devices  # noqa: E402
from spade_lib.decoding.model.adapter import CausalLMAdapter  # noqa: E402
from spade_lib.decoding.studies.costs import measure_costs  # noqa: E402
from spade_lib.runs import timing  # noqa: E402
from spade_lib.theory import optimal_gamma, speedup  # noqa: E402

# Architecture configs (public config.json values; weights are random).
QWEN = dict(arch="qwen2", rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=32768)
LLAMA = dict(arch="llama", rms_norm_eps=1e-5, max_position_embeddings=131072,
             rope_parameters=None)  # filled per model below (llama3 RoPE scaling)
_LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SHAPES = {
    "qwen2.5-0.5b": dict(QWEN, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(QWEN, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "llama-3.2-1b": dict(LLAMA, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                         tie_word_embeddings=True, rope_parameters=dict(_LLAMA3_ROPE, factor=32.0)),
    "llama-3.1-8b": dict(LLAMA, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         tie_word_embeddings=False, rope_parameters=_LLAMA3_ROPE),
}
PAIRS = {"qwen2.5-0.5b->7b": ("qwen2.5-0.5b", "qwen2.5-7b"), "llama-3.2-1b->3.1-8b": ("llama-3.2-1b", "llama-3.1-8b")}


def _embedded_shape(mc, vocab: int) -> dict:
    return dict(arch="llama", hidden_size=mc.hidden, intermediate_size=mc.intermediate, num_hidden_layers=mc.n_layers,
                num_attention_heads=mc.n_heads, num_key_value_heads=mc.n_heads, vocab_size=vocab,
                max_position_embeddings=mc.max_positions, tie_word_embeddings=mc.tie_embeddings, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def embedded_shapes() -> dict:
    """The embedded default pair's shapes (``spade_lib.zoo.configs.DEFAULT``), for CPU cost runs
    (``--shapes embedded``): the 6-layer target and the 1-layer draft."""
    from spade_lib.zoo.configs import DEFAULT

    draft = next(d for d in DEFAULT.drafts if d.name == DEFAULT.default_draft).model
    vocab = DEFAULT.tokenizer.vocab_size
    return {"embedded-draft": _embedded_shape(draft, vocab), "embedded-target": _embedded_shape(DEFAULT.target, vocab)}


EMBEDDED_PAIRS = {"embedded-default": ("embedded-draft", "embedded-target")}
# Same architectures, toy sizes: what the CPU test runs.
TINY_SHAPES = {
    "qwen2.5-0.5b": dict(SHAPES["qwen2.5-0.5b"], hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256),
    "qwen2.5-7b": dict(SHAPES["qwen2.5-7b"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=256),
    "llama-3.2-1b": dict(SHAPES["llama-3.2-1b"], hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=256),
    "llama-3.1-8b": dict(SHAPES["llama-3.1-8b"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256),
}
FIELDS = ("section", "pair", "model", "quantity", "gamma", "alpha", "alpha_source", "value", "unit", "device",
          "dtype", "backend", "context", "clock")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--shapes", choices=("real", "tiny", "embedded"), default="real",
                    help="real: the GPU pairs; tiny: toy sizes (tests); embedded: the default pair's shapes (CPU)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall (synchronised perf_counter) or this process's CPU time (1 thread, busy CPU machines)")
    ap.add_argument("--pairs", default=None, help="comma-separated subset of " + ", ".join(PAIRS)
                    + " (default: all of them; embedded-default with --shapes embedded)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is; --clock cpu forces 1)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--max-gamma", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20, help="timed rounds per model")
    ap.add_argument("--backend", choices=("auto", "hf"), default="auto")
    ap.add_argument("--alphas", default="0.6,0.7,0.8", help="assumed acceptance rates for the predictions")
    ap.add_argument("--pair", default="default", help="embedded pair for the end-to-end check ('' to skip)")
    ap.add_argument("--e2e-prompts", type=int, default=4)
    ap.add_argument("--e2e-tokens", type=int, default=128)
    ap.add_argument("--out", default="runs/gpu_costs.csv")
    return ap.parse_args(argv)


def build(name: str, shapes: dict, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A randomly initialised model of architecture ``name`` (seeded), built directly on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = dict(shapes[name])
    arch = spec.pop("arch")
    rope = spec.pop("rope_parameters", None)
    theta = spec.pop("rope_theta", None)
    if arch == "qwen2":
        cfg = Qwen2Config(**spec, rope_parameters={"rope_type": "default", "rope_theta": theta})
        cls = Qwen2ForCausalLM
    else:
        cfg = LlamaConfig(**spec, rope_parameters=rope)
        cls = LlamaForCausalLM
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(previous)
    return model.to(device=device, dtype=dtype).eval()


def costs_in_turns(draft, target, *, device, context: int, max_gamma: int, reps: int, backend: str, clock=None
                   ) -> tuple[dict, str]:
    """:func:`spade_lib.decoding.studies.costs.measure_costs` of two models on decoding adapters with a ``context``-token
    cache: ``c``, ``r(g)`` for ``g = 1 .. max_gamma`` and the median forward times, all from the same
    rounds (each round times every forward in turn); also the adapters' backend."""
    ads = [CausalLMAdapter(m, backend=backend, max_length=context + max_gamma + 2) for m in (target, draft)]
    costs = measure_costs(ads[0], ads[1], max_gamma, context=context, clock=clock, reps=reps, device=device)
    return costs, ads[0].backend


def e2e_embedded(name: str, device, n_prompts: int, n_tokens: int) -> list[dict]:
    """Greedy SPADE vs AR on the embedded pair: equality and speedup (wall clock, synchronised)."""
    from spade_lib.bench import default_suite
    from spade_lib.decoding.decode import AutoregressiveDecoder, SpeculativeDecoder
    from spade_lib.runs.config import RunConfig, prompt_ids
    from spade_lib.sampling import SamplingConfig
    from spade_lib.zoo.pairs import load_pair

    pair = load_pair(name, device=device)
    greedy = SamplingConfig(temperature=0)
    spade = SpeculativeDecoder(pair.target, pair.draft, gamma=4, sampling=greedy, record="light")
    ar = AutoregressiveDecoder(pair.target, sampling=greedy)
    suite = default_suite(tokenizer=name, n_per_category=max(1, n_prompts // 4 + 1), seed=0)
    cfg = RunConfig(method="ar", device=str(device))
    prompts = [prompt_ids(pair.tokenizer, r["turns"][0], cfg) for r in suite.rows][:n_prompts]
    same, t_sp, t_ar, n_sp, n_ar = 0, [], [], 0, 0
    spade.generate(prompts[0], 8), ar.generate(prompts[0], 8)  # warm-up
    for ids in prompts:
        for dec, ts in ((ar, t_ar), (spade, t_sp)):  # in turns, prompt by prompt
            t0 = devices.clock(device)
            out = dec.generate(ids, n_tokens)
            ts.append(devices.clock(device) - t0)
            if dec is ar:
                ref, n_ar = out.tokens, n_ar + len(out.tokens)
            else:
                same += out.tokens == ref
                n_sp += len(out.tokens)
    speed = (n_sp / sum(t_sp)) / (n_ar / sum(t_ar))
    backend = spade.target.backend
    return [
        {"section": "e2e", "pair": name, "model": "spade_vs_ar", "quantity": "speedup", "gamma": 4,
         "value": speed, "unit": "ratio", "backend": backend},
        {"section": "e2e", "pair": name, "model": "spade", "quantity": "greedy_equal_to_ar", "gamma": 4,
         "value": same / len(prompts), "unit": "fraction of prompts", "backend": backend},
        {"section": "e2e", "pair": name, "model": "ar", "quantity": "tokens_per_s", "value": n_ar / sum(t_ar),
         "unit": "tok/s", "backend": backend},
    ]


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = devices.resolve_device(args.device)
    dtype = devices.resolve_dtype(args.dtype)
    shapes = {"real": SHAPES, "tiny": TINY_SHAPES}.get(args.shapes) or embedded_shapes()
    known = EMBEDDED_PAIRS if args.shapes == "embedded" else PAIRS
    alphas = [float(a) for a in args.alphas.split(",") if a.strip()]
    pairs = [p for p in (args.pairs or ",".join(known)).split(",") if p.strip()]
    for p in pairs:
        if p not in known:
            raise ValueError(f"pairs: unknown pair {p!r}; known: {sorted(known)}")
    clock = time.process_time if args.clock == "cpu" else None  # None: devices.clock, synchronised wall time
    if args.clock == "cpu" or args.threads:
        timing.fix_threads(1 if args.clock == "cpu" else args.threads)  # CPU time of spinning threads is not work
    t_start = devices.clock()
    rows: list[dict] = []
    common = {"device": str(device), "dtype": str(dtype).removeprefix("torch."), "context": args.context,
              "clock": args.clock}
    print(f"device={device} ({timing.environment_fingerprint(device)['gpu']}) dtype={dtype} context={args.context} "
          f"shapes={args.shapes} backend={args.backend} "
          f"threads={torch.get_num_threads()} clock={args.clock}")
    for pair in pairs:
        models, built = {}, {}
        for role, name in zip(("draft", "target"), known[pair]):
            t0 = devices.clock()
            models[role] = build(name, shapes, device, dtype)
            built[role] = devices.clock() - t0
        t0 = devices.clock()
        costs, backend = costs_in_turns(models["draft"], models["target"], device=device, context=args.context,
                                            max_gamma=args.max_gamma, reps=args.reps, backend=args.backend, clock=clock)
        timed = devices.clock() - t0
        # median forward times of the same rounds: the draft's 1-token forward, the target's 1 .. max_gamma + 1
        times = {"draft": {1: costs["t_draft"]},
                 "target": {1: costs["t_target"], **{g + 1: t for g, t in costs["t_verify"].items()}}}
        for role, name in zip(("draft", "target"), known[pair]):
            n_params = sum(p.numel() for p in models[role].parameters())
            for k, s in times[role].items():
                rows.append({"section": "forward", "pair": pair, "model": name, "quantity": f"t_forward_{k}tok",
                             "value": s, "unit": "s", "backend": backend})
            rows.append({"section": "forward", "pair": pair, "model": name, "quantity": "params",
                         "value": n_params, "unit": "count", "backend": backend})
            print(f"{pair:<22} {role:<6} {name:<14} {n_params / 1e9:6.2f} B params  1-token forward "
                  f"{times[role][1] * 1e3:7.2f} ms  (built in {built[role]:.0f} s, {backend})")
        del models
        if device.type == "cuda":
            torch.cuda.empty_cache()
        c = costs["c"]
        r = [costs["r"][g] for g in range(1, args.max_gamma + 1)]
        print(f"{pair:<22} c and r(g) timed in turns ({args.reps} rounds, {timed:.0f} s): medians of per-round ratios")
        rows.append({"section": "costs", "pair": pair, "quantity": "c", "value": c, "unit": "ratio"})
        for g, rg in enumerate(r, start=1):
            rows.append({"section": "costs", "pair": pair, "quantity": "r", "gamma": g, "value": rg, "unit": "ratio"})
        print(f"{pair:<22} c = {c:.4f}; r(g) = " + " ".join(f"{g}:{v:.3f}" for g, v in enumerate(r, start=1)))
        for a in alphas:
            g = optimal_gamma(a, c, args.max_gamma, verify_cost=r)
            s = float(speedup(a, g, c, verify_cost=r[g - 1]))
            rows.append({"section": "prediction", "pair": pair, "quantity": "speedup", "gamma": g, "alpha": a,
                         "alpha_source": "assumed", "value": s, "unit": "ratio"})
            print(f"{'':<22} assumed alpha {a:.2f}: optimal gamma {g}, predicted speedup {s:.3f}")
    if args.pair:
        try:
            e2e = e2e_embedded(args.pair, device, args.e2e_prompts, args.e2e_tokens)
        except Exception as e:  # noqa: BLE001 - the pair may be absent from this machine's cache
            print(f"embedded pair {args.pair!r} end to end: skipped ({type(e).__name__}: {e})")
            e2e = [{"section": "e2e", "pair": args.pair, "quantity": "skipped", "value": float("nan"),
                    "unit": f"{type(e).__name__}"}]
        for row in e2e:
            row.setdefault("dtype", "float32")  # the embedded pair is fp32
        rows += e2e
        for row in e2e:
            print(f"e2e {row['pair']}: {row.get('model', '')} {row['quantity']} = {row['value']:.3f} {row['unit']}")
    rows = [{**{f: "" for f in FIELDS}, **common, **row} for row in rows]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    out = sio.write_text(args.out, buf.getvalue())
    print(f"wrote {out} ({len(rows)} rows) in {devices.clock() - t_start:.0f} s")
    return rows


if __name__ == "__main__":
    main()
