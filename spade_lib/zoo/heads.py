"""EAGLE and Medusa heads for a target, built offline and cached like the other drafts.

A build (:func:`build_head`) runs, for one :class:`HeadConfig`:

1. the teacher sequences (``head_data.py``: the target's greedy answers to training-split corpus prompts, plus
   training-split code windows), cached in their own entry (:func:`data_entry`), shared by every head of a target;
2. the target's features and soft labels on them (teacher-forced, ``output_hidden_states``);
3. the draft vocabulary: the ``draft_vocab_size`` most frequent training tokens plus the special tokens (FR-Spec; as
   speculators' ``build_vocab_mappings_from_distribution`` ranks), as ``d2t`` / ``t2d``;
4. the head, initialised from the target, trained by its kind's trainer (``head_train.py``: EAGLE's training-time test,
   ``0.8^i``-weighted steps; Medusa-1's heads) under the wall-clock guard ``budget_s`` (the whole build);
5. held-out ``top1`` / ``alpha_lb`` per depth, ``c`` (a drafted token / a target step: :func:`head_costs`), manifest.

Entries (``cache.get_or_build``: lock, temporary folder, sha256 of every file, atomic rename)::

    <name>-headdata-<key>/sequences.safetensors  token sequences (+ manifest: counts, seconds)
    <name>-<kind>-<key>/head/                     eagle3: a speculators folder (vLLM loads it); eagle1/medusa: save_head

keyed by the target entry, the recipe (``HeadConfig`` less the thread count) and the corpus sha256; seeded, so a recipe
and thread count give the same bytes unless the budget guard trips (manifest: ``budget_hit``). :data:`HEAD_KINDS` maps
``"eagle3"``, ``"eagle1"``, ``"medusa"`` (``HeadConfig.kind``, ``head_cli --kind``, ``load_pair(heads=...)``) to a
:class:`HeadKind` (head class, recipe, trainer, folder format; the rest goes through the head's methods);
:func:`register_head_kind` adds one. Recipes: :data:`PROFILES` ``"make"`` (<= 8 min a head for SmolLM2-135M on two
cores), ``"long"`` (5x data, 3x steps, 1-hour guard); :data:`PAIR_PROFILES` (``default``: ``make`` <= 2 min a head);
:func:`head_config` picks one, ``pairs.head_entry(pair, kind, profile)`` builds it. CLI: :mod:`spade_lib.zoo.head_cli`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from spade_lib.decoding.drafts.eagle import EagleHead
from spade_lib.decoding.drafts.medusa import MedusaHead
from spade_lib.decoding.model.heads import DraftHead
from spade_lib.devices import clock
from spade_lib.io import write_json
from spade_lib.zoo.cache import cache_key, get_or_build, read_manifest
from spade_lib.zoo.head_data import HeadDataConfig, Sequences, extract, teacher_sequences
from spade_lib.zoo.head_train import HeadTrainConfig, evaluate, train_eagle, train_medusa

__all__ = ["HeadKind", "HEAD_KINDS", "register_head_kind", "head_kind", "head_kinds", "HeadConfig", "PROFILES",
           "PAIR_PROFILES", "head_config", "attach_heads", "build_head", "data_entry", "head_entry", "save_head",
           "load_head", "head_costs", "draft_vocabulary", "load_target", "with_threads"]

HEADS_FORMAT_VERSION = 1  # bump when the build changes in a way HeadConfig does not capture
VOCAB_SOURCES = ("all", "generations")  # HeadConfig.vocab_source: what draft_vocabulary counts
# recipe fields added after the first builds, with the value those builds had: left out of the key at that value
_IMPLICIT = {("vocab_source",): "all", ("data", "bos"): False}
SPADE_HEAD = "spade_head"  # config.json key of a SPADE-format head folder
COST_DEFINITION = ("c = t(one drafting step of the head: EAGLE fc(feature) + layer on a context-position cache + "
                   "lm_head + scatter to V; Medusa one head) / t(target 1-token forward); spade_lib.decoding.studies.costs")


@dataclass(frozen=True)
class HeadKind:
    """One kind of draft head the zoo builds: what no method of the head itself can say (module docstring)."""

    name: str                  # HeadConfig.kind, head_cli --kind, a head's DraftHead.variant: "eagle3", ...
    head_class: type           # its DraftHead subclass (spade_lib.decoding)
    new: Callable              # (target, cfg: HeadConfig, draft_token_ids [Vd] or None: all V) -> head from the target
    train: Callable            # (head, data, train_ids, cfg.train, deadline=) -> (curve, facts): spade_lib.zoo.head_train
    save: Callable | None = None  # (head, folder, verifier_name_or_path=) -> folder; None: SPADE's folder (save_head)

    def __post_init__(self) -> None:
        if not isinstance(self.head_class, type) or not issubclass(self.head_class, DraftHead):
            raise ValueError(f"head_class: must be a DraftHead subclass, got {self.head_class!r}")


HEAD_KINDS: dict[str, HeadKind] = {}


def register_head_kind(kind: HeadKind, *, replace: bool = False) -> None:
    """Add ``kind`` to :data:`HEAD_KINDS` under ``kind.name`` (``replace=True`` to change a registered one)."""
    if not isinstance(kind, HeadKind):
        raise ValueError(f"kind: must be a HeadKind, got {type(kind).__name__}")
    if kind.name in HEAD_KINDS and not replace:
        raise ValueError(f"kind: head kind {kind.name!r} is already registered (pass replace=True)")
    HEAD_KINDS[kind.name] = kind


def head_kinds() -> tuple[str, ...]:
    """The registered head kinds' names, in registration order."""
    return tuple(HEAD_KINDS)


def head_kind(name: str) -> HeadKind:
    """The registered :class:`HeadKind` ``name``; ``ValueError`` naming ``kind`` and the known ones otherwise."""
    if name not in HEAD_KINDS:
        raise ValueError(f"kind: must be one of {head_kinds()}, got {name!r}")
    return HEAD_KINDS[name]


def _save_speculators(head, folder, *, verifier_name_or_path=None) -> Path:
    from spade_lib.zoo.speculators_format import save_speculators

    return save_speculators(head, folder, verifier_name_or_path=verifier_name_or_path)


def _new_eagle(target, cfg: "HeadConfig", ids) -> EagleHead:
    return EagleHead.from_target(target, draft_token_ids=ids, variant=cfg.kind, feature_layers=cfg.feature_layers)


def _new_medusa(target, cfg: "HeadConfig", ids) -> MedusaHead:
    return MedusaHead.from_target(target, draft_token_ids=ids, num_heads=cfg.medusa_heads, num_layers=cfg.medusa_layers)


register_head_kind(HeadKind("eagle3", EagleHead, _new_eagle, train_eagle, save=_save_speculators))  # vLLM loads it
register_head_kind(HeadKind("eagle1", EagleHead, _new_eagle, train_eagle))
register_head_kind(HeadKind("medusa", MedusaHead, _new_medusa, train_medusa))


@dataclass(frozen=True)
class HeadConfig:
    kind: str = "eagle3"                       # a HEAD_KINDS name: "eagle3", "eagle1" (EAGLE-1 variant), "medusa"
    draft_vocab_size: int = 8192               # Vd: frequency-ranked draft vocabulary (capped at V)
    vocab_source: str = "all"                  # ranked by "all" training tokens or "generations": the target's own
                                               # generated tokens (ties by all tokens, then id): draft_vocabulary
    feature_layers: tuple[int, ...] | None = None  # None: speculators' [2, L//2, L-3] (eagle1: (L,))
    medusa_heads: int = 4                      # Medusa: k heads (tokens drafted per step at most)
    medusa_layers: int = 1                     # Medusa: ResBlocks per head
    data: HeadDataConfig = field(default_factory=HeadDataConfig)
    train: HeadTrainConfig = field(default_factory=HeadTrainConfig)
    top_k: int = 32                            # soft labels kept per position
    feature_dtype: str = "bfloat16"            # storage of the features in memory while training
    eval_depth: int = 4                        # held-out figures for depths 0 .. eval_depth-1
    budget_s: float = 480.0                    # wall-clock guard of the whole head build (data entry excluded)
    threads: int | None = 2                    # torch threads while building (not in the cache key)

    def __post_init__(self) -> None:
        head_kind(self.kind)  # a registered kind (ValueError naming the known ones)
        if self.draft_vocab_size < 1 or self.top_k < 1 or self.eval_depth < 1:
            raise ValueError("draft_vocab_size, top_k, eval_depth: must be >= 1")
        if self.vocab_source not in VOCAB_SOURCES:
            raise ValueError(f"vocab_source: must be one of {VOCAB_SOURCES}, got {self.vocab_source!r}")
        if self.feature_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"feature_dtype: must be float32, bfloat16 or float16, got {self.feature_dtype!r}")
        if not self.budget_s > 0:
            raise ValueError(f"budget_s: must be > 0, got {self.budget_s!r}")

    def recipe(self) -> dict:
        """What is hashed into a build's cache key: every field but ``threads``; a field added later is left
        out while it has the value every earlier recipe meant (:data:`_IMPLICIT`), so their keys stand."""
        from spade_lib.zoo.build import _jsonable

        d = {k: v for k, v in dataclasses.asdict(self).items() if k != "threads"}
        for path, value in _IMPLICIT.items():
            *outer, key = path
            inner = d
            for part in outer:
                inner = inner[part]
            if inner.get(key) == value:
                del inner[key]
        return _jsonable(d)


_MAKE_DATA = HeadDataConfig(n_prompts=48, gen_tokens=96, n_windows=96, window=256)
# "long" (opt-in): 5x make's data (384 of the target's own answers of 128 tokens and 384 windows of 256,
# ~160 k tokens) and 3x its steps, about as many passes over the data as make; a 1-hour guard. Measured
# for SmolLM2's eagle3 on the 2-core AMD EPYC, alone (`python -m spade_lib.zoo.head_cli eval --pair smollm2
# --kind eagle3 --profile long --depth 4`): data entry 473 s (generations 468 s), head 1330 s (features
# and 480 steps), ~32 min with the evaluation; held-out top-1 by depth 0.565 / 0.517 / 0.478 / 0.322
# (make: 0.44 / 0.39 / 0.36 / 0.24), on the target's own greedy continuations 0.478 / 0.288 / 0.215 /
# 0.112, a greedy 4-chain accepting 0.90 tokens there (make: 0.56).
_LONG_DATA = HeadDataConfig(n_prompts=384, gen_tokens=128, gen_batch=32, n_windows=384, window=256)
_LONG_BUDGET = 3600.0
PROFILES: dict[str, dict[str, HeadConfig]] = {
    "make": {
        "eagle3": HeadConfig("eagle3", data=_MAKE_DATA,
                             train=HeadTrainConfig(steps=160, batch_size=4, seq_len=256, ttt_steps=3, lr=1e-3)),
        "eagle1": HeadConfig("eagle1", data=_MAKE_DATA,
                             train=HeadTrainConfig(steps=160, batch_size=4, seq_len=256, ttt_steps=3, lr=1e-3,
                                                   ce_weight=0.1, feature_weight=1.0)),
        "medusa": HeadConfig("medusa", data=_MAKE_DATA, train=HeadTrainConfig(steps=240, rows=512, lr=1e-3)),
    },
    "long": {
        "eagle3": HeadConfig("eagle3", data=_LONG_DATA, budget_s=_LONG_BUDGET,
                             train=HeadTrainConfig(steps=480, batch_size=4, seq_len=256, ttt_steps=3, lr=1e-3)),
        "eagle1": HeadConfig("eagle1", data=_LONG_DATA, budget_s=_LONG_BUDGET,
                             train=HeadTrainConfig(steps=480, batch_size=4, seq_len=256, ttt_steps=3, lr=1e-3,
                                                   ce_weight=0.1, feature_weight=1.0)),
        "medusa": HeadConfig("medusa", data=_LONG_DATA, budget_s=_LONG_BUDGET,
                             train=HeadTrainConfig(steps=720, rows=512, lr=1e-3)),
    },
}


# The embedded ``default`` pair (a 6-layer, hidden-384 Llama of 12 M parameters, V = 4096, trained on
# 128-token windows): its own recipes, sized so that a ``make`` head builds in <= 2 minutes on two cores.
# Timings on this project's 2-core machine under load (another build running; niced, 2 threads): greedy
# generation of 16 x 64 tokens 4.5 s, teacher-forced features ~2 k tok/s, one EAGLE-3 step (4 x 128
# positions, 3 unrolled steps, Vd = V = 4096) 0.67 s, one Medusa step (512 rows, 4 heads) 1.1 s. So
# ``make``: the data entry (32 answers of 48 tokens + 64 windows of 128) ~20 s once for all heads, features
# ~5 s, 100 EAGLE steps ~65 s, 80 Medusa steps of 256 rows ~45 s; the guard is 2 minutes. EAGLE-3 reads
# layers (1, 3, 5): speculators' [2, L // 2, L - 3] is not three distinct layers at L = 6.
_EMBEDDED_DATA = HeadDataConfig(n_prompts=32, max_prompt_tokens=96, gen_tokens=48, gen_batch=16, n_windows=64,
                                window=128)
_EMBEDDED_LONG_DATA = HeadDataConfig(n_prompts=384, max_prompt_tokens=96, gen_tokens=96, gen_batch=32,
                                     n_windows=768, window=128)
_EMBEDDED_EAGLE = HeadTrainConfig(steps=100, batch_size=4, seq_len=128, ttt_steps=3, lr=1e-3)
_EMBEDDED_EAGLE_LONG = HeadTrainConfig(steps=3000, batch_size=8, seq_len=128, ttt_steps=5, lr=5e-4)
_EAGLE1_LOSS = {"ce_weight": 0.1, "feature_weight": 1.0}


def _embedded(data: HeadDataConfig, eagle: HeadTrainConfig, medusa: HeadTrainConfig, budget_s: float):
    common = {"draft_vocab_size": 4096, "data": data, "budget_s": budget_s}
    return {"eagle3": HeadConfig("eagle3", feature_layers=(1, 3, 5), train=eagle, **common),
            "eagle1": HeadConfig("eagle1", train=dataclasses.replace(eagle, **_EAGLE1_LOSS), **common),
            "medusa": HeadConfig("medusa", train=medusa, **common)}


# Gemma-3-270M (``gemma3``: 18 layers, hidden 640, V = 262,144 tied): heads over a reduced draft vocabulary
# ranked by the target's own generations (vocab_source="generations"; its size: GEMMA3_DRAFT_VOCAB), prompts and
# windows with <bos> (a base model that needs it). Provisional sizes, to be checked against timings of a real build.
GEMMA3_DRAFT_VOCAB = 16384
_GEMMA3_DATA = HeadDataConfig(n_prompts=48, gen_tokens=96, gen_batch=16, n_windows=64, window=256, bos=True)
_GEMMA3_LONG_DATA = HeadDataConfig(n_prompts=384, gen_tokens=128, gen_batch=32, n_windows=256, window=256, bos=True)


def _gemma3(data: HeadDataConfig, eagle: HeadTrainConfig, medusa: HeadTrainConfig, budget_s: float):
    common = {"draft_vocab_size": GEMMA3_DRAFT_VOCAB, "vocab_source": "generations", "data": data, "budget_s": budget_s}
    return {"eagle3": HeadConfig("eagle3", train=eagle, **common),
            "medusa": HeadConfig("medusa", medusa_heads=3, train=medusa, **common)}


PAIR_PROFILES: dict[str, dict[str, dict[str, HeadConfig]]] = {
    "smollm2": PROFILES,
    "gemma3": {"make": _gemma3(_GEMMA3_DATA,
                               HeadTrainConfig(steps=100, batch_size=4, seq_len=128, ttt_steps=3, lr=1e-3),
                               HeadTrainConfig(steps=120, rows=512, lr=1e-3), 1200.0),
               "long": _gemma3(_GEMMA3_LONG_DATA,
                               HeadTrainConfig(steps=480, batch_size=4, seq_len=256, ttt_steps=3, lr=1e-3),
                               HeadTrainConfig(steps=720, rows=512, lr=1e-3), 3600.0)},
    "default": {"make": _embedded(_EMBEDDED_DATA, _EMBEDDED_EAGLE, HeadTrainConfig(steps=80, rows=256, lr=1e-3), 120.0),
                "long": _embedded(_EMBEDDED_LONG_DATA, _EMBEDDED_EAGLE_LONG,
                                  HeadTrainConfig(steps=3000, rows=2048, lr=5e-4), 3600.0)},
}


def head_config(kind: str = "eagle3", profile: str = "make", *, pair: str = "smollm2", **changes) -> HeadConfig:
    """The ``profile`` recipe of ``kind`` for ``pair`` (``PAIR_PROFILES``: SmolLM2's are ``PROFILES``), with
    dataclass ``changes`` applied."""
    if pair not in PAIR_PROFILES:
        raise ValueError(f"pair: head recipes exist for {sorted(PAIR_PROFILES)}, not {pair!r} (pass a HeadConfig)")
    profiles = PAIR_PROFILES[pair]
    if profile not in profiles:
        raise ValueError(f"profile: must be one of {sorted(profiles)}, got {profile!r}")
    if kind not in profiles[profile]:
        raise ValueError(f"kind: must be one of {sorted(profiles[profile])}, got {kind!r}")
    return dataclasses.replace(profiles[profile][kind], **changes)


# ------------------------------------------------------------------------------------------------ storage

def _kind_of(head) -> HeadKind:
    """The registered kind of ``head`` (by its :attr:`~spade_lib.decoding.model.heads.DraftHead.variant`)."""
    if not isinstance(head, DraftHead):
        raise ValueError(f"head: expected a DraftHead, got {type(head).__name__}")
    kind = head_kind(head.variant)
    if not isinstance(head, kind.head_class):
        raise ValueError(f"head: a {type(head).__name__} of variant {head.variant!r}, but that kind's heads are "
                         f"{kind.head_class.__name__}s")
    return kind


def save_head(head, folder, *, verifier_name_or_path: str | None = None) -> Path:
    """A head in its kind's folder format (:class:`HeadKind` ``save``: an eagle3 head as a speculators
    folder), else SPADE's: ``config.json`` (``spade_head``: its class kind, ``config``: its dataclass) +
    ``model.safetensors`` (without the parameters tied to the target)."""
    from safetensors.torch import save_file

    kind = _kind_of(head)
    if kind.save is not None:
        return kind.save(head, folder, verifier_name_or_path=verifier_name_or_path)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items() if k not in head.tied}
    write_json(folder / "config.json", {SPADE_HEAD: head.kind, "format": HEADS_FORMAT_VERSION,
                                        "config": head.config.to_dict(), "verifier": verifier_name_or_path})
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def load_head(folder, target):
    """A head saved by :func:`save_head` (or any speculators EAGLE-3 folder) for ``target``, in eval mode."""
    from safetensors.torch import load_file

    from spade_lib.zoo.speculators_format import is_speculators_folder, load_speculators

    from spade_lib.decoding.model.heads import check_head_state

    folder = Path(folder)
    if is_speculators_folder(folder):
        return load_speculators(folder, target=target)
    for name in ("config.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"folder: {folder} has no {name} (a head folder holds config.json and "
                                    "model.safetensors, as save_head writes them)")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    kind = config.get(SPADE_HEAD)
    classes = {k.head_class.kind: k.head_class for k in HEAD_KINDS.values()}
    if kind not in classes:
        raise ValueError(f"folder: {folder} is neither a speculators folder nor a SPADE head ({SPADE_HEAD!r} key "
                         f"one of {sorted(classes)}, got {kind!r})")
    cls = classes[kind]
    head = cls(cls.config_class.from_dict(config["config"]))
    state = load_file(str(folder / "model.safetensors"))
    check_head_state(head, state, str(folder / "model.safetensors"))
    missing, unexpected = head.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k not in head.tied]:
        raise ValueError(f"folder: {folder} does not fit a {kind} head: missing {missing}, unexpected {unexpected}")
    p = next(target.parameters())
    head = head.to(device=p.device, dtype=p.dtype)
    head.tie_to_target(target)
    return head.eval()


def attach_heads(pair, entries: dict[str, Path]) -> None:
    """Load the heads of the cache ``entries`` (``{name: head entry}``) into ``pair.heads[name]`` and their
    manifests (without file hashes and loss curves, with the entry's path) into ``pair.manifest["heads"]``."""
    pair.heads = {**(getattr(pair, "heads", {}) or {}),
                  **{name: load_head(Path(e) / "head", pair.target) for name, e in entries.items()}}
    pair.manifest.setdefault("heads", {})
    pair.manifest["heads"].update({name: {k: v for k, v in read_manifest(e).items() if k not in ("files", "train_curve")}
                                   | {"path": str(e)} for name, e in entries.items()})


# ------------------------------------------------------------------------------------------------ building

def token_counts(seqs: list[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """``[vocab_size]`` float64: how often each id occurs in ``seqs``."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for s in seqs:
        counts += torch.bincount(s, minlength=vocab_size)[:vocab_size].double()
    return counts


def draft_vocabulary(seqs: list[torch.Tensor], vocab_size: int, size: int, special: list[int], *,
                     generations_only: bool = False, starts: list[int] | None = None) -> torch.Tensor:
    """The ``size`` most frequent ids of ``seqs`` (ties by id), always with ``special``; sorted.

    ``generations_only``: ranked by the target's own tokens, ``seqs[i][starts[i]:]`` (a window's ``start``
    is 0: give ``seqs`` the generations only, or ``starts`` past their ends), ties (ids the generations
    never used: the tail of a 262 k vocabulary) by their counts in all of ``seqs``, then by id."""
    from spade_lib.zoo.distill import frequent_tokens

    counts = token_counts(seqs, vocab_size)
    if generations_only:
        if starts is None or len(starts) != len(seqs):
            raise ValueError("starts: generations_only needs one start per sequence (where its generated tokens begin)")
        own = token_counts([s[int(a):] for s, a in zip(seqs, starts)], vocab_size)
        counts = own * (counts.sum() + 1) + counts  # lexicographic: own counts first, then all (exact in float64)
    return frequent_tokens(counts, min(size, vocab_size), [i for i in special if 0 <= i < vocab_size])


def _new_head(target, cfg: HeadConfig, vocab: torch.Tensor) -> DraftHead:
    """``cfg``'s kind of head for ``target`` over ``vocab`` (all ``V`` when it holds every id)."""
    ids = vocab if int(vocab.numel()) < int(target.config.vocab_size) else None
    return head_kind(cfg.kind).new(target, cfg, ids)


@torch.inference_mode()
def head_costs(target, head, *, gamma: int = 4, context: int = 64, reps: int = 10) -> dict:
    """``c`` of one drafting step of ``head`` against one target step, and ``r(gamma)``
    (:func:`spade_lib.decoding.studies.costs.measure_costs` on a :class:`~spade_lib.decoding.studies.costs.HeadStep`:
    forwards timed in turns, medians of ratios)."""
    from spade_lib.decoding.model.adapter import CausalLMAdapter
    from spade_lib.decoding.studies.costs import measure_costs

    m = measure_costs(CausalLMAdapter(target), head, gamma, context, reps=reps)
    return {"c": m["c"], "verify_cost_ratio": m["r"][gamma], "gamma": gamma, "context": m["context"],
            "target_step_s": m["t_target"], "head_step_s": m["t_draft"], "reps": reps,
            "definition": COST_DEFINITION}


def build_head(target, tokenizer, cfg: HeadConfig, out: Path | None = None, *, sequences: Sequences | None = None,
               verifier_name_or_path: str | None = None, data_facts: dict | None = None,
               cost_reps: int = 10) -> tuple[object, dict]:
    """Build one head for ``target`` (module docstring, steps 2-5; ``sequences`` default to fresh
    :func:`~spade_lib.zoo.head_data.teacher_sequences`); saves it under ``out/head`` when ``out`` is given.
    Returns ``(head, manifest facts)``."""
    from spade_lib.zoo.build import _environment

    t0, cpu0 = clock(), time.process_time()
    deadline = t0 + cfg.budget_s
    torch.manual_seed(cfg.train.seed)
    if sequences is None:
        sequences, data_facts = teacher_sequences(target, tokenizer, cfg.data)
    n = len(sequences.seqs)
    held = [i for i in range(n) if i % cfg.data.heldout_every == 0]
    train = [i for i in range(n) if i % cfg.data.heldout_every]
    if not train or not held:
        raise ValueError(f"sequences: {n} sequences leave no training or no held-out ones "
                         f"(heldout_every={cfg.data.heldout_every})")
    special = sorted({i for i in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                  getattr(tokenizer, "unk_token_id", None)) if i is not None})
    gen = cfg.vocab_source == "generations"
    vocab = draft_vocabulary([sequences.seqs[i] for i in train], int(target.config.get_text_config().vocab_size),
                             cfg.draft_vocab_size, special, generations_only=gen,
                             starts=[_own_start(sequences, i) for i in train] if gen else None)
    head = _new_head(target, cfg, vocab)
    t = clock()
    data = extract(target, sequences, head.feature_layers, top_k=cfg.top_k,
                   feature_dtype=getattr(torch, cfg.feature_dtype))
    t_features = clock() - t
    depth = cfg.eval_depth if head.max_depth is None else min(cfg.eval_depth, head.max_depth)
    at_init = evaluate(head, data, held, depth)
    curve, train_facts = head_kind(cfg.kind).train(head, data, train, cfg.train, deadline=deadline)
    t = clock()
    heldout = evaluate(head, data, held, depth)
    costs = head_costs(target, head, reps=cost_reps)
    t_eval = clock() - t
    if out is not None:
        save_head(head, Path(out) / "head", verifier_name_or_path=verifier_name_or_path)
    facts = {
        "kind": cfg.kind, "head_class": type(head).__name__, "head_config": head.config.to_dict(),
        "n_trainable": sum(p.numel() for p in head.trainable_parameters()),
        "feature_layers": list(head.feature_layers), "draft_vocab_size": int(vocab.numel()),
        "draft_vocab_token_mass": _mass(sequences, train, vocab, int(target.config.vocab_size)),
        "vocab_source": cfg.vocab_source,
        "draft_vocab_heldout_generated_mass": _mass(sequences, held, vocab, int(target.config.vocab_size),
                                                    generated=True),
        "data": {**(data_facts or {}), "sequences": n, "train_sequences": len(train), "heldout_sequences": len(held),
                 "feature_tokens": data.n_tokens()},
        "heldout": heldout, "heldout_at_init": at_init,
        "heldout_note": "teacher-forced per depth: top1 = alpha(T=0); alpha_lb <= alpha(T=1) (the target's mass "
                        "outside its top-k not counted); 'generated': labels of the target's own answers",
        "train_curve": curve, **train_facts, "budget_s": cfg.budget_s,
        "costs": costs, "environment": _environment(),
        "seconds": {"features": t_features, "eval": t_eval, "total": clock() - t0,
                    "cpu_total": time.process_time() - cpu0},
    }
    return head, facts


def _own_start(sequences: Sequences, i: int) -> int:
    """Where the target's own tokens begin in sequence ``i``: its ``start`` for a generation, its end for a window."""
    return sequences.starts[i] if sequences.kinds[i] == "generation" else int(sequences.seqs[i].numel())


def _mass(sequences: Sequences, ids: list[int], vocab: torch.Tensor, v: int, *, generated: bool = False) -> float:
    """The share of the tokens of sequences ``ids`` (``generated``: of their generated tokens only) in ``vocab``."""
    seqs = [sequences.seqs[i][_own_start(sequences, i):] if generated else sequences.seqs[i] for i in ids]
    counts = token_counts(seqs, v)
    return float(counts[vocab].sum() / counts.sum().clamp(min=1))


def with_threads(threads: int | None, fn):
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def load_target(target_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spade_lib.zoo import frspec  # noqa: F401  (registers the FR-Spec class, should a target be one)

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, use_safetensors=True)
    return model.eval(), tokenizer


def _corpus_sha() -> str:
    from spade_lib.zoo.build import cached_corpus
    from spade_lib.zoo.corpus import CorpusConfig

    return cached_corpus(CorpusConfig()).sha256


def data_entry(target_dir, name: str, cfg: HeadConfig, *, rebuild: bool = False, prompts=None, documents=None,
               label: str = "headdata") -> Path:
    """The cache folder ``<name>-<label>-<key>`` of the teacher sequences of the target saved at ``target_dir``
    (an HF folder; ``name`` names the entries), built if needed; ``prompts`` / ``documents`` replace the
    corpus's (hashed). ``label="heldout"``: the held-out evaluation sequences (``head_eval.heldout_entry``)."""
    from spade_lib.zoo.build import _environment, zoo_dir

    target_dir = Path(target_dir)
    texts = {k: cache_key({"texts": list(v)}) for k, v in (("prompts", prompts), ("documents", documents))
             if v is not None}
    recipe = {"format": HEADS_FORMAT_VERSION, "kind": "head-data", "target": _target_identity(target_dir),
              "data": cfg.recipe()["data"], "texts": texts,
              "corpus_sha256": _corpus_sha() if len(texts) < 2 else None}
    entry = zoo_dir() / f"{name}-{label}-{cache_key(recipe)}"

    def build(tmp: Path) -> dict:
        from safetensors.torch import save_file

        def body():
            target, tokenizer = load_target(target_dir)
            seqs, facts = teacher_sequences(target, tokenizer, cfg.data, prompts=prompts, documents=documents)
            save_file(seqs.to_tensors(), str(tmp / "sequences.safetensors"))
            return {"kind": "head-data", "label": label, "name": name, "recipe": recipe, **facts,
                    "environment": _environment(), "threads": torch.get_num_threads()}

        return with_threads(cfg.threads, body)

    return get_or_build(entry, build, rebuild=rebuild)


def _target_identity(target_dir: Path) -> dict:
    """What identifies a saved target in a key: its cache entry's manifest build id when it lives in one,
    else the sha256 of its weights."""
    from spade_lib.zoo.cache import MANIFEST, sha256_file

    for parent in (target_dir, target_dir.parent):
        if (parent / MANIFEST).is_file():
            m = read_manifest(parent)
            return {"entry": parent.name, "build_id": m.get("build_id"), "sub": str(target_dir.relative_to(parent))}
    return {"weights_sha256": sorted(sha256_file(p) for p in target_dir.glob("*.safetensors"))}


def head_entry(target_dir, name: str, cfg: HeadConfig, *, rebuild: bool = False, prompts=None,
               documents=None) -> Path:
    """The cache folder ``<name>-<kind>-<key>`` of a head for the target saved at ``target_dir``, built if
    needed (its data entry first); the head is at ``<entry>/head`` (:func:`load_head`)."""
    from safetensors.torch import load_file

    from spade_lib.zoo.build import zoo_dir

    target_dir = Path(target_dir)
    data = data_entry(target_dir, name, cfg, prompts=prompts, documents=documents)
    recipe = {"format": HEADS_FORMAT_VERSION, "kind": cfg.kind, "data_entry": data.name,
              "data_build_id": read_manifest(data).get("build_id"), "head": cfg.recipe()}
    entry = zoo_dir() / f"{name}-{cfg.kind}-{cache_key(recipe)}"

    def build(tmp: Path) -> dict:
        def body():
            target, tokenizer = load_target(target_dir)
            seqs = Sequences.from_tensors(load_file(str(data / "sequences.safetensors")))
            facts_data = {k: v for k, v in read_manifest(data).items() if k not in ("files", "recipe", "environment")}
            _, facts = build_head(target, tokenizer, cfg, tmp, sequences=seqs, data_facts=facts_data,
                                  verifier_name_or_path=str(target_dir))
            return {**facts, "kind": f"head-{cfg.kind}", "head_kind": cfg.kind, "name": name, "recipe": recipe,
                    "threads": torch.get_num_threads(),
                    "timings_note": "seconds are wall-clock on the build machine, inflated if it was shared"}

        return with_threads(cfg.threads, body)

    return get_or_build(entry, build, rebuild=rebuild)
