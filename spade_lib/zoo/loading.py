"""Loading a target, its drafts and their shared tokenizer from hub ids or local folders.

:func:`load_models` is what every pair comes through (``pairs.load_pair`` for embedded and real
pairs, ``smollm2.load_smollm2`` for the real one): ``AutoModelForCausalLM`` /
``AutoTokenizer.from_pretrained``, safetensors only (a draft whose tokenizer vocabulary differs from the
target's keeps its own tokenizer, ``Pair.draft_tokenizers``), placed whole on a device or through a
``device_map`` (the drafts then follow the target's first device, :func:`first_device`).
"""

from __future__ import annotations

import copy
import importlib.metadata
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from spade_lib.devices import clock


@dataclass
class Pair:
    """A target model, named drafts (all in eval mode), the target's tokenizer, and draft heads
    (``heads``: EAGLE / Medusa heads that draft from the target's hidden states, by name).

    ``draft_tokenizers[name]``: the own tokenizer of each draft whose vocabulary differs from the target's
    (a *cross-vocabulary* draft); every other draft shares ``tokenizer``. ``make_drafter(name, pair)``
    drafts with a cross-vocabulary draft through the text (``decoding.drafts.crossvocab``)."""

    name: str
    target: Any
    drafts: dict[str, Any]
    default_draft: str
    tokenizer: Any
    manifest: dict
    path: Path | None = None
    heads: dict[str, Any] = field(default_factory=dict)
    draft_tokenizers: dict[str, Any] = field(default_factory=dict)
    prepared: list[dict] = field(default_factory=list)  # prepare()'s records, one per model

    def prepare(self, capacity: int = 256, drafts: list[str] | None = None) -> list[dict]:
        """Time the kernel plan of the target and of the draft models ``drafts`` (default: every draft model that
        shares the target's tokenizer; a cross-vocabulary draft is prepared when named, else its decoder checks it
        once when first built), and check each lean forward against its HF forward
        (:func:`spade_lib.decoding.model.lean.prepare`: once per model and machine, recorded on disk), so the decoders
        built on them time and check nothing; with ``SPADE_DRAFT_PREFILL=auto`` a draft's prefill runs in bf16 where
        that is faster here (its proposals change, never the target's output). Returns (and keeps in ``prepared``) one
        record per model, ``"role"`` ``"target"`` or the draft's name first (a draft that is the target model itself:
        prepared once, as the target)."""
        from spade_lib.decoding.model.lean import prepare

        models = {n: m for n, m in self.drafts.items() if isinstance(m, torch.nn.Module)}
        if drafts is None:
            drafts = [n for n in models if n not in self.draft_tokenizers]
        unknown = [n for n in drafts if n not in models]
        if unknown:
            raise ValueError(f"drafts: {unknown} are not draft models of this pair (those: {list(models)})")
        own = [n for n in drafts if models[n] is not self.target]  # the target as a draft keeps a target's fp32 prefill
        target = prepare(self.target, capacity=capacity)[0]
        records = dict(zip(own, prepare(*(models[n] for n in own), capacity=capacity, draft=True)))
        self.prepared = [{"role": "target", **target}] + [{"role": n, **records.get(n, target)} for n in drafts]
        return self.prepared

    def draft_model(self, name: str | None = None) -> str:
        """``name`` (else the default draft) when it is a draft model of the target's vocabulary, the kind a
        benchmark times as ``c`` and hands to HF assisted generation; a ``ValueError`` naming the pair's draft
        models otherwise (a model-free drafter, a head, a cross-vocabulary draft)."""
        name = name or self.default_draft
        models = [n for n, m in self.drafts.items()
                  if isinstance(m, torch.nn.Module) and n not in self.draft_tokenizers]
        if name not in models:
            raise ValueError(f"draft: {name!r} is not a draft model of pair {self.name!r} in its target's vocabulary "
                             f"(those: {models or 'none'}; model-free and cross-vocabulary drafts: notebook 03)")
        return name

    @property
    def draft(self):
        """The default draft (a draft model, or a head when the default names one)."""
        return self.drafts[self.default_draft] if self.default_draft in self.drafts else self.heads[self.default_draft]

    def __repr__(self) -> str:
        def size(m) -> str:
            return f"{type(m).__name__}({sum(p.numel() for p in m.parameters()) / 1e6:.2f} M params)"

        drafts = ", ".join(f"{n!r}: {size(m)}" + (f" (own vocab {len(self.draft_tokenizers[n])})"
                                                   if n in self.draft_tokenizers else "")
                           for n, m in self.drafts.items())
        heads = ", ".join(f"{n!r}: {size(m)}" for n, m in self.heads.items())
        heads = f", heads={{{heads}}}" if self.heads else ""
        return (f"Pair(name={self.name!r}, target={size(self.target)}, drafts={{{drafts}}}{heads}, "
                f"default_draft={self.default_draft!r}, vocab={len(self.tokenizer)}, path={self.path})")


def package_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (``None`` if it is not installed)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_gguf(gguf: Path, expected: str):
    """``(model, tokenizer, seconds)``: the GGUF file ``gguf`` dequantised by transformers (with the ``gguf``
    package) into an fp32 causal LM, which must be an ``expected`` (a class name, e.g. ``"Qwen2ForCausalLM"``),
    and its tokenizer; ``seconds`` the time both took."""
    import time

    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = clock()
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if type(src).__name__ != expected:
        raise RuntimeError(f"{gguf.name}: loaded as {type(src).__name__}, expected {expected}")
    return src, tokenizer, clock() - t0


def save_dequantised(src, tokenizer, out: Path, model_cls):
    """Copy ``src`` (a GGUF-loaded causal LM: ``save_pretrained`` refuses one) into a clean ``model_cls`` built
    from its config without the quantization config, and save it at ``out`` as safetensors with ``tokenizer``
    (its pad token set to eos where it has none). Returns the clean model (eval mode, embeddings tied).

    The clean model is built on the meta device and takes ``src``'s tensors themselves (``assign=True``), so
    the weights are held once (a 7 GB fp32 target is never held twice); the buffers that are not in the
    state dict (the rotary ``inv_freq``, Gemma's embedding scale) are taken from ``src``."""
    config = src.config
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        clean = model_cls(config)
    missing, unexpected = clean.load_state_dict(src.state_dict(), strict=False, assign=True)
    # tied embeddings: lm_head.weight may be absent from the GGUF state dict; it is tied after loading
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF state dict does not fit {model_cls.__name__}: missing {missing}, "
                           f"unexpected {unexpected}")
    for name, buf in list(clean.named_buffers()):
        if buf.is_meta:
            owner, _, leaf = name.rpartition(".")
            clean.get_submodule(owner)._buffers[leaf] = src.get_buffer(name)
    clean.tie_weights()
    left = [n for n, t in [*clean.named_parameters(), *clean.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"{model_cls.__name__}: tensors left without values after the copy: {left[:5]}")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    clean.generation_config.pad_token_id = tokenizer.pad_token_id
    clean.eval()
    clean.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return clean


def _in_memory(model, folder: str | None = None):
    """``model`` with every CPU tensor in the process's own memory (``model`` returned).

    ``from_pretrained`` leaves safetensors weights memory-mapped from the file: the kernel may drop such clean
    pages under memory pressure and read them back from disk inside a timed forward (a 7 GB target then ran
    one token in seconds). So each tensor a local ``folder``'s safetensors files hold is read again into memory
    of its own (``safe_open(..., backend="pread")``: the mapping's pages are never touched, so they never count
    in the process's memory beside the copy); any other CPU tensor (a buffer, a name the files spell otherwise)
    is copied out of wherever it lives. The weights are held once."""
    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    done: set[int] = set()
    files = sorted(Path(folder).glob("*.safetensors")) if folder is not None and Path(folder).is_dir() else []
    with torch.no_grad():
        for file in files:
            from safetensors import safe_open

            with safe_open(str(file), framework="pt", device="cpu", backend="pread") as st:
                for key in st.keys():
                    t = named.get(key)
                    if t is None or t.device.type != "cpu" or id(t) in done:
                        continue
                    value = st.get_tensor(key)
                    if value.shape != t.shape:
                        raise ValueError(f"{file.name}: {key} has shape {tuple(value.shape)}, the model's is {tuple(t.shape)}")
                    t.data = value.to(t.dtype)
                    done.add(id(t))
        for t in named.values():
            if t.device.type == "cpu" and id(t) not in done:
                t.data = t.data.clone()
                done.add(id(t))
    return model


def shared_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` with its own module/parameter/buffer/hook tables, their entries shared: what a pair's
    twin drafts are made of (``frspec.trimmed_twin``, ``narrow.narrow_twin``), so replacing one of the copy's
    submodules or parameters never reaches ``module``, while the tensors they do not replace are held once."""
    twin = copy.copy(module)
    for key, value in vars(module).items():
        if isinstance(value, (dict, set)):
            twin.__dict__[key] = copy.copy(value)
    return twin


def first_device(model) -> torch.device:
    """Where ``model`` takes its inputs and computes: for a model placed with a ``device_map``, the
    first device of its map that is neither ``"cpu"`` nor ``"disk"`` (accelerate's execution device;
    modules offloaded to CPU or disk are computed there), else ``"cpu"``; otherwise the device of its
    first parameter."""
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return next(model.parameters()).device
    gpus = [d for d in device_map.values() if d not in ("cpu", "disk")]
    if not gpus:
        return torch.device("cpu")
    first = gpus[0]
    return torch.device(f"cuda:{first}" if isinstance(first, int) else first)


def _resolve(ref: str, arg: str) -> str:
    """A local folder as an absolute path, or a hub id unchanged; ``FileNotFoundError`` for a missing path."""
    if not isinstance(ref, (str, os.PathLike)) or not str(ref):
        raise ValueError(f"{arg}: expected a hub id or a local path, got {ref!r}")
    ref = str(ref)
    path = Path(ref).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{arg}: {ref!r} is a file; give the model's folder")
        return str(path.resolve())
    looks_local = ref.startswith(("/", ".", "~")) or ref.count("/") > 1 or os.sep != "/" and os.sep in ref
    if looks_local:
        raise FileNotFoundError(f"{arg}: local path {ref!r} does not exist")
    return ref


def _from_pretrained(loader, ref: str, arg: str, local_only: bool, **kwargs):
    try:
        return loader.from_pretrained(ref, local_files_only=local_only, **kwargs)
    except (OSError, ValueError) as e:
        where = "local folder" if Path(ref).exists() else (
            "hub id (HF_HUB_OFFLINE is set, so only the local HF cache was searched)" if local_only else "hub id")
        raise OSError(f"{arg}: could not load {loader.__name__} from {where} {ref!r}: {e}") from e


def load_models(target_ref: str, draft_refs: dict[str, str], default: str, *, placement: dict[str, Any], dtype,
                 trust_remote_code: bool, local_only: bool) -> Pair:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_ref = _resolve(target_ref, "target")
    draft_refs = {n: _resolve(r, f"drafts[{n!r}]" if n != "draft" else "draft") for n, r in draft_refs.items()}
    common = {"trust_remote_code": trust_remote_code}
    tokenizer = _from_pretrained(AutoTokenizer, target_ref, "target", local_only, **common)
    vocab = tokenizer.get_vocab()
    draft_tokenizers = {}
    for name, ref in draft_refs.items():
        draft_tokenizer = _from_pretrained(AutoTokenizer, ref, f"draft {name!r}", local_only, **common)
        if draft_tokenizer.get_vocab() != vocab:  # a cross-vocabulary draft: it keeps its own tokenizer
            draft_tokenizers[name] = draft_tokenizer

    def model(ref: str, arg: str, **kwargs):
        return _from_pretrained(AutoModelForCausalLM, ref, arg, local_only, dtype=dtype, use_safetensors=True,
                                **common, **kwargs).eval()

    if "device" in placement:
        device = placement["device"]
        target = _in_memory(model(target_ref, "target").to(device), target_ref)
    else:  # accelerate places the target (GPUs, then CPU, then disk); the drafts follow its first device
        target = model(target_ref, "target", **placement)
        device = first_device(target)
        first = next(target.parameters()).device
        if first != device:
            raise ValueError(f"max_memory: the target's first weights landed on {first}, not on its execution "
                             f"device {device} (device map {target.hf_device_map}); leave room for the input "
                             "embeddings on the first device")
    drafts = {name: _in_memory(model(ref, f"draft {name!r}").to(device), ref) for name, ref in draft_refs.items()}
    if draft_tokenizers:  # the drafters that draft across vocabularies register themselves from their module
        import spade_lib.decoding.drafts.crossvocab  # noqa: F401
    return Pair(name="", target=target, drafts=drafts, default_draft=default, tokenizer=tokenizer, manifest={},
                draft_tokenizers=draft_tokenizers)
