"""Building an embedded pair from the pinned ``transformers`` sources alone (cached, see ``cache.py``).

Steps: corpus (``corpus.py``) → byte-level BPE tokenizer (``tokenizer.py``) → target trained on the
training split → each draft trained on data (``lm``) or distilled from the target (``kl``) → every
model saved with ``save_pretrained`` (safetensors) next to a copy of the tokenizer, exactly the layout
of a hub repository → held-out figures and costs (``evaluate.py``) into ``manifest.json``.

Entry layout::

    <name>-<key>/manifest.json              recipe, corpus hash, curves, figures, sha256 of every file
    <name>-<key>/target/                    config.json, model.safetensors, tokenizer files
    <name>-<key>/drafts/<draft name>/       same

The tokenizer has its own entry ``<name>-tokenizer-<key>`` so that it can be built without the models.
"""

from __future__ import annotations

import functools
import platform
import sys
import time
from pathlib import Path

import torch

from spade_lib import paths
from spade_lib.devices import bf16_matmul, clock
from spade_lib.zoo.cache import cache_key, get_or_build
from spade_lib.zoo.configs import BUILD_FORMAT_VERSION, PairConfig
from spade_lib.zoo.corpus import Corpus, CorpusConfig, build_corpus
from spade_lib.zoo.data import encode_documents, eval_windows
from spade_lib.zoo.evaluate import cost_ratios, teacher_forced_stats
from spade_lib.zoo.tokenizer import build_tokenizer, select_documents
from spade_lib.zoo.train import n_parameters, new_model, train_model


def zoo_dir() -> Path:
    """``CACHE_DIR/zoo`` (read at call time, so tests can point ``spade_lib.paths.CACHE_DIR`` elsewhere)."""
    return Path(paths.CACHE_DIR) / "zoo"


@functools.lru_cache(maxsize=4)
def cached_corpus(config: CorpusConfig) -> Corpus:
    return build_corpus(config)


def _environment() -> dict:
    import tokenizers
    import transformers

    return {"python_version": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "platform": platform.platform()}


def tokenizer_recipe(config: PairConfig) -> dict:
    """What the tokenizer's cache key hashes: the build format, the tokenizer and corpus configs (the
    pinned source package and version among them) and the corpus sha256 (which covers the source
    files). Nothing of the interpreter: the key is the same on every Python."""
    corpus = cached_corpus(config.corpus)
    return _jsonable({"format": BUILD_FORMAT_VERSION, "kind": "tokenizer", "tokenizer": config.tokenizer,
                      "corpus": config.corpus, "corpus_sha256": corpus.sha256})


def pair_recipe(config: PairConfig) -> dict:
    """What a pair's cache key hashes: the build format, the whole ``PairConfig`` (its ``CorpusConfig``
    names the pinned source package and version) and the corpus sha256; no interpreter facts."""
    corpus = cached_corpus(config.corpus)
    return _jsonable({"format": BUILD_FORMAT_VERSION, "kind": "pair", "config": config.to_dict(),
                      "corpus_sha256": corpus.sha256})


def tokenizer_entry(config: PairConfig, *, rebuild: bool = False) -> Path:
    """The cache folder of ``config``'s tokenizer, built if needed."""
    corpus = cached_corpus(config.corpus)
    recipe = tokenizer_recipe(config)
    entry = zoo_dir() / f"{config.name}-tokenizer-{cache_key(recipe)}"

    def build(tmp: Path) -> dict:
        t0 = clock()
        facts = build_tokenizer(tmp, corpus.train, config.tokenizer)
        return {"kind": "tokenizer", "name": config.name, "recipe": recipe, **facts,
                "corpus": corpus.manifest(), "environment": _environment(),
                "build_seconds": clock() - t0}

    return get_or_build(entry, build, rebuild=rebuild)


def pair_entry(config: PairConfig, *, rebuild: bool = False) -> Path:
    """The cache folder of the pair ``config``, built if needed."""
    corpus = cached_corpus(config.corpus)
    recipe = pair_recipe(config)
    entry = zoo_dir() / f"{config.name}-{cache_key(recipe)}"
    return get_or_build(entry, functools.partial(_build_pair, config, corpus, recipe), rebuild=rebuild)


def _build_pair(config: PairConfig, corpus: Corpus, recipe: dict, out: Path) -> dict:
    threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        return _build_pair_body(config, corpus, recipe, out)
    finally:
        torch.set_num_threads(threads)


def _build_pair_body(config: PairConfig, corpus: Corpus, recipe: dict, out: Path) -> dict:
    from transformers import AutoTokenizer

    t0, cpu0 = clock(), time.process_time()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_entry(config))
    train_docs = select_documents(corpus.train, config.train_chars, config.seed)
    stream = encode_documents(tokenizer, train_docs)
    heldout = encode_documents(tokenizer, corpus.heldout)
    windows = eval_windows(heldout, config.eval.n_windows, config.eval.seq_len)
    bf16 = {"auto": bf16_matmul(), "bf16": True, "off": False}[config.autocast]
    vocab = len(tokenizer)
    t_data = clock() - t0

    models: dict[str, dict] = {}
    t = clock()
    target = new_model(config.target, vocab, config.target_train.seed)
    curve = train_model(target, stream, config.target_train, bf16=bf16, desc=f"{config.name} target")
    models["target"] = {"n_parameters": n_parameters(target), "train_seconds": clock() - t,
                        "train_curve": curve}
    drafts = {}
    for spec in config.drafts:
        t = clock()
        draft = new_model(spec.model, vocab, spec.train.seed)
        teacher = target if spec.train.objective == "kl" else None
        curve = train_model(draft, stream, spec.train, teacher=teacher, bf16=bf16,
                            desc=f"{config.name} draft {spec.name}")
        drafts[spec.name] = draft
        models[spec.name] = {"n_parameters": n_parameters(draft), "objective": spec.train.objective,
                             "train_seconds": clock() - t, "train_curve": curve}

    for sub, model in [("target", target), *((f"drafts/{n}", m) for n, m in drafts.items())]:
        model.save_pretrained(out / sub, safe_serialization=True)
        tokenizer.save_pretrained(out / sub)

    t = clock()
    ev = config.eval
    stats = teacher_forced_stats(target, drafts, windows, temperatures=ev.temperatures)
    costs = cost_ratios(target, drafts, gamma=ev.gamma, context=ev.context, reps=ev.timing_reps)
    t_eval = clock() - t
    for name, m in models.items():
        m.update(stats[name])
        if name in costs["drafts"]:
            m["c"] = costs["drafts"][name]["c"]
    return {
        "kind": "pair",
        "name": config.name,
        "default_draft": config.default_draft,
        "drafts": [d.name for d in config.drafts],
        "recipe": recipe,
        "corpus": corpus.manifest(),
        "environment": _environment(),
        "bf16_autocast": bf16,
        "train_tokens": len(stream),
        "heldout_tokens": len(heldout),
        "eval_positions": stats["n_positions"],
        "models": models,
        "costs": costs,
        "timings_note": "seconds are wall-clock on the build machine, inflated if it was shared",
        "seconds": {"data": t_data, "eval": t_eval, "total": clock() - t0,
                    "cpu_total": time.process_time() - cpu0},
    }


def _jsonable(obj):
    """Dataclasses/tuples → plain JSON types, for hashing and manifests."""
    import dataclasses

    if dataclasses.is_dataclass(obj):
        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj
