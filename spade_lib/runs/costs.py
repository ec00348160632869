"""The pairs' cost tables: :func:`spade_lib.decoding.studies.costs.measure_costs` per draft, cached per pair.

:func:`pair_costs` measures each draft of a pair once (``c`` and ``r(g)`` from paired micro-benchmarks, the method of
:mod:`spade_lib.decoding.studies.costs`) and caches it as JSON under ``runs/costs/`` (folder :func:`cost_folder`; keyed by
pair and folder, draft, device, dtype, threads, ``max_gamma``, ``context``), so every notebook of one ``make run``
predicts from the same numbers; :func:`read_costs` reads a table back.

**One r(g) per target.** ``r(g)`` is the target's alone, but each draft's table times it anew; the first table measured
(or read) for a target (key without draft and ``max_gamma``) becomes the target's, ``target/r-<digest>.json`` (``r``,
``t_target``, ``t_verify``, ``source``: the draft whose session gave them), and prices every draft's table of that
target (a larger ``max_gamma`` extends it, new ``g`` in ``extended``): a table keeps its own differing ``r`` as
``r_paired``, ``r_source`` names the shared one's draft, and its loop overhead is recomputed from the shared ``r(1)``.

**Loop overhead** ``o`` (:func:`loop_overhead`), in target steps: ``o = max(0, null_step - r(1))``, ``null_step`` one
null-draft step at ``gamma = 1`` over one AR step (:func:`spade_lib.decoding.studies.costs.measure_loop_overhead`, once per
pair, cached under ``runs/costs/<pair>/loop/``), so ``tau / (gamma c + r(gamma) + o)`` meets the null draft at
``gamma = 1`` exactly and every other configuration tests it (:func:`spade_lib.runs.controls.prediction_warnings`).
``overhead_raw`` is ``o`` before the clip (a negative one is noise: the speculative loop does all the AR loop does).

A draft is priced by what it runs (:func:`_draft_of`), never by its name: a pair's draft model (``pair.drafts[name]``)
by its one-token forward, a feature head (``pair.heads[name]``) by its drafting step (``costs.HeadStep``; key: the
head's build), a registered drafter by ``Drafter.drafting_model()``: an adapter is timed (key: class, sha256 of its
weights), a head by its drafting step; ``None`` (``"ngram"``, ``"ngram_tree"``, ``"suffix"``, ``"null"``) runs no
forward, ``c = 0`` by rule (host lookups are in the step times and ``o``). Anything else (undeclared; ``None`` while
holding a module or adapter) is **refused** (``ValueError``): ``c = 0`` would be a silent lie.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import torch

from spade_lib import paths
from spade_lib.decoding.studies.costs import measure_costs, measure_loop_overhead
from spade_lib.io import write_json

__all__ = ["MIN_GAMMA", "cost_folder", "loop_overhead", "pair_costs", "read_costs", "select_costs", "with_overhead"]

MAX_SECONDS = 60.0  # pair_costs stops starting rounds of a measurement after this long (5 rounds at least)
MIN_GAMMA = 12  # pair_costs measures r(g) at least up to this g (05's max_gamma: one measurement per draft)


def read_costs(path) -> dict:
    """A cost table :func:`pair_costs` cached as JSON, with its ``r`` and ``t_verify`` keyed by int ``g``."""
    saved = json.loads(Path(path).read_text(encoding="utf-8"))
    saved["r"] = {int(g): v for g, v in saved["r"].items()}
    saved["t_verify"] = {int(g): v for g, v in saved["t_verify"].items()}
    if "r_paired" in saved:
        saved["r_paired"] = {int(g): v for g, v in saved["r_paired"].items()}
    return saved


def select_costs(folder, *, device: str | None = None, dtype: str | None = None,
                 threads: int | None = None) -> dict[str, dict]:
    """The cost table per draft that predictions read from a pair's cost folder (``runs/costs/<pair>/``):
    among the cached tables measured on ``device``, in ``dtype``, at ``threads`` (each filter skipped when
    ``None``, ``threads`` also when 0: "left as set"), the newest per draft (by file time, then name).
    Each table gets ``"file"``, its path, so a report can show the very table a prediction used
    (:func:`spade_lib.runs.compare.speedups`, :mod:`spade_lib.report`). Unreadable files are skipped."""
    folder = Path(folder)
    best: dict[str, tuple[tuple, dict]] = {}
    for f in sorted(folder.glob("*.json")):
        try:
            t = read_costs(f)
            key = t["key"]
            draft = key["draft"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if device is not None and not (str(key.get("device")) == str(device)
                                       or str(key.get("device")).split(":")[0] == str(device)):
            continue
        if dtype is not None and str(key.get("dtype")) != str(dtype):
            continue
        if threads and key.get("threads") != threads:
            continue
        rank = (f.stat().st_mtime, f.name)
        if draft not in best or rank >= best[draft][0]:
            best[draft] = (rank, {**t, "file": str(f)})
    return {d: t for d, (_, t) in sorted(best.items())}


def cost_folder(pair_name: str) -> Path:
    """``RUNS_DIR/costs/<pair>``, a ``/`` in the name (a hub id) as ``--``, as the run folders have it
    (:func:`spade_lib.runs.store.run_dir_for`), so :func:`spade_lib.runs.compare.speedups` finds the tables."""
    return paths.RUNS_DIR / "costs" / pair_name.strip("/").replace("/", "--")


def _device_dtype(pair) -> tuple[str, str]:
    p = next(pair.target.parameters())
    return str(p.device), str(p.dtype).replace("torch.", "")


def loop_overhead(pair, *, context: int = 128, min_seconds: float = 5.0, cache: bool = True,
                  progress: bool = False, max_seconds: float = MAX_SECONDS) -> dict:
    """:func:`spade_lib.decoding.studies.costs.measure_loop_overhead` of ``pair``'s target (at least ``min_seconds`` of
    timed rounds, as many as ``max_seconds`` holds past 3), cached as JSON under ``runs/costs/<pair>/loop/``
    (keyed by pair and its folder, device, dtype, threads, ``context``, ``min_seconds`` and ``max_seconds``)."""
    device, dtype = _device_dtype(pair)
    key = dict(pair=pair.name, path=str(getattr(pair, "path", None)), device=device, dtype=dtype,
               threads=torch.get_num_threads(), context=int(context), min_seconds=float(min_seconds),
               max_seconds=float(max_seconds), what="loop_overhead")
    path = cost_folder(pair.name) / "loop" / f"loop-{_digest(key)}.json"
    if cache and path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    got = {**measure_loop_overhead(pair.target, context=int(context), min_seconds=min_seconds,
                                   max_seconds=max_seconds, device=next(pair.target.parameters()).device),
           "key": key}
    if progress:
        print(f"loop of {pair.name}: a null-draft step at gamma 1 costs {got['null_step']:.3f} AR steps "
              f"({1e3 * got['s_null']:.2f} vs {1e3 * got['s_ar']:.2f} ms)")
    if cache:
        write_json(path, got)
    return got


def with_overhead(table: dict, loop: dict) -> dict:
    """``table`` (one draft's costs) with the loop's ``overhead = max(0, null_step - r(1))`` (module
    docstring), ``overhead_raw`` and ``null_step``."""
    raw = float(loop["null_step"]) - float(table["r"][1])
    return {**table, "overhead": max(0.0, raw), "overhead_raw": raw, "null_step": float(loop["null_step"])}


def pair_costs(pair, drafts: Iterable[str], max_gamma: int, *, context: int = 128, reps: int = 20,
               cache: bool = True, progress: bool = False, overhead: bool = True,
               max_seconds: float = MAX_SECONDS) -> dict[str, dict]:
    """:func:`measure_costs` for each draft of ``pair`` (a draft model, a feature head, or a registered
    drafter: timed by what it runs, ``c = 0`` only for one that holds no model, a drafter with a model
    that cannot be timed refused; :func:`_draft_of`), cached under ``runs/costs/`` (module docstring).
    ``r(g)`` is measured for ``g = 1 .. max(max_gamma, MIN_GAMMA)``, so notebooks asking for different
    ``max_gamma`` below that share one measurement (and one prediction per configuration). With
    ``overhead`` (the default) every table carries the pair's loop overhead (:func:`loop_overhead`,
    :func:`with_overhead`; a table cached before it existed gets it added, and is rewritten with it).
    ``max_seconds`` bounds each measurement past 5 rounds (:func:`spade_lib.devices.time_in_turns`): a
    small pair does its ``reps`` well inside it, a 1.5 B-parameter target about 5."""
    from spade_lib.decoding.model.adapter import CausalLMAdapter

    max_gamma = max(int(max_gamma), MIN_GAMMA)
    device = next(pair.target.parameters()).device
    dtype = str(next(pair.target.parameters()).dtype).replace("torch.", "")
    out = {}
    target = None
    # one target measurement serves every model-free drafter (c = 0) of this call: r(g) is the target's
    # alone, so the first model draft's measurement (in turns with its draft) gives it too
    no_draft = None
    target_key = dict(pair=pair.name, path=str(getattr(pair, "path", None)), device=str(device), dtype=dtype,
                      threads=torch.get_num_threads(), context=int(context), reps=int(reps),
                      max_seconds=float(max_seconds))
    target_path = cost_folder(pair.name) / "target" / f"r-{_digest(target_key)}.json"
    shared = read_costs(target_path) if cache and target_path.is_file() else None
    for name in dict.fromkeys(drafts):
        model, what, identity = _draft_of(pair, name)
        key = dict(target_key, draft=name, max_gamma=int(max_gamma))
        if identity is not None:
            key[what] = identity  # "head" or "model": another build under the same name is measured again
        path = cost_folder(pair.name) / f"{name}-{_digest(key)}.json"
        if cache and path.is_file():
            table = read_costs(path)
            shared = _target_table(shared, table, target_key, name, target_path if cache else None)
            fixed = _with_target(table, shared)
            if overhead and ("overhead" not in fixed or fixed["r"] != table["r"]):
                fixed = with_overhead(fixed, loop_overhead(pair, context=context, cache=cache, progress=progress))
            if fixed != table:
                write_json(path, fixed)
            out[name] = fixed
            continue
        target = target or CausalLMAdapter(pair.target)
        if model is None and no_draft is not None:
            got = dict(no_draft)
        else:
            draft = CausalLMAdapter(model) if what == "draft" else model
            got = measure_costs(target, draft, int(max_gamma), context, reps=reps, device=device,
                                max_seconds=max_seconds)
            if no_draft is None:
                no_draft = {**got, "c": 0.0, "t_draft": 0.0}
        got = {**got, "key": key}
        shared = _target_table(shared, got, target_key, name, target_path if cache else None)
        got = _with_target(got, shared)
        if overhead:
            got = with_overhead(got, loop_overhead(pair, context=context, cache=cache, progress=progress))
        if progress:
            print(f"costs of {pair.name}/{name}: c = {got['c']:.3f}, r(1..{max_gamma}) = "
                  + " ".join(f"{v:.2f}" for v in got["r"].values())
                  + (f", loop overhead o = {got['overhead']:.3f}" if "overhead" in got else ""))
        if cache:
            write_json(path, got)
        out[name] = got
    return out


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _target_table(shared: dict | None, table: dict, target_key: dict, source: str, path: Path | None) -> dict:
    """The target's one ``r(g)`` (module docstring): ``shared`` (``None``: none yet, then ``table``'s is taken,
    ``source`` naming its draft), extended by ``table``'s ``r(g)`` at any ``g`` beyond its range (a table
    measured to a larger ``max_gamma``; those ``g`` are listed in ``extended``), saved at ``path`` when new or
    extended (``None``: not saved)."""
    if shared is None:
        shared = {"r": dict(table["r"]), "t_target": table["t_target"], "t_verify": dict(table.get("t_verify", {})),
                  "source": source, "key": target_key, "extended": {}}
    else:
        more = {g: v for g, v in table["r"].items() if g not in shared["r"]}
        if not more:
            return shared
        shared = {**shared, "r": {**shared["r"], **more},
                  "extended": {**shared.get("extended", {}), **{str(g): source for g in more}}}
    if path is not None:
        write_json(path, shared)
    return shared


def _with_target(table: dict, shared: dict) -> dict:
    """``table`` priced with the target's one ``r(g)``; where its own (paired with its draft) differed, it is
    kept as ``r_paired``, so the file shows both, and the predictions use the shared one."""
    r = {g: shared["r"][g] for g in table["r"]}
    if r == table["r"]:
        return table
    return {**table, "r": r, "r_paired": table.get("r_paired", table["r"]), "r_source": shared["source"]}


def _draft_of(pair, name: str):
    """``(timed, what, identity)`` of the draft ``name`` (module docstring): what :func:`measure_costs` times
    for it and how the cache key names it.

    - ``pair.drafts[name]``: ``(model, "draft", None)`` (the key's ``draft`` and ``path`` name it);
    - a feature head (``pair.heads[name]``, or the :meth:`~spade_lib.decoding.drafts.drafters.Drafter.drafting_model`
      of a registered drafter such as ``"eagle"``): ``(head, "head", identity)`` (:func:`_head_identity`);
    - a registered drafter whose drafting model is a decoding adapter: ``(it, "model", {"class",
      "weights_sha256"})``;
    - a registered drafter whose drafting model is ``None`` (and that holds no ``torch.nn.Module`` or
      decoding adapter): ``(None, "none", None)``, ``c = 0``.

    Raises ``ValueError`` (naming ``draft``) for a registered drafter that does not say what it runs, says
    ``None`` while holding a model, or names something that is neither, and (from
    :func:`~spade_lib.decoding.drafts.drafters.make_drafter`) for an unknown name."""
    from spade_lib.decoding.drafts.drafters import make_drafter
    from spade_lib.decoding.model.adapter import CausalLMAdapter
    from spade_lib.decoding.model.heads import DraftHead

    model = (getattr(pair, "drafts", {}) or {}).get(name)
    if model is not None:
        return model, "draft", None
    head = (getattr(pair, "heads", {}) or {}).get(name)
    if head is not None:
        return head, "head", _head_identity(pair, head)
    drafter = make_drafter(name, pair)  # a registered drafter (unknown names refused)
    what = f"registered drafter {name!r} ({type(drafter).__name__})"
    try:
        timed = drafter.drafting_model()
    except (AttributeError, NotImplementedError):
        held = _held_model(drafter)
        raise ValueError(f"draft: {what} does not say what a drafting step runs (Drafter.drafting_model)"
                         + (f" and holds a model ({held})" if held else "") + "; pair_costs cannot price it, "
                         "and c = 0 would be a guess") from None
    if isinstance(timed, DraftHead):
        return timed, "head", _head_identity(pair, timed)
    if isinstance(timed, CausalLMAdapter):
        return timed, "model", {"class": type(timed.model).__name__, "weights_sha256": _weights_sha256(timed.model)}
    if timed is not None:
        raise ValueError(f"draft: {what} drafts with a {type(timed).__name__}, which pair_costs cannot time "
                         "(Drafter.drafting_model: a CausalLMAdapter, a DraftHead or None)")
    held = _held_model(drafter)
    if held is not None:
        raise ValueError(f"draft: {what} says it runs no model but holds one ({held}); pair_costs cannot "
                         "time it, and c = 0 would be wrong (Drafter.drafting_model)")
    return None, "none", None


def _held_model(obj, depth: int = 3, _seen: set | None = None) -> str | None:
    """Where ``obj`` (a drafter) holds a ``torch.nn.Module`` or a decoding adapter, searched through its
    attributes and containers ``depth`` levels deep (``"attr.attr"``), else ``None``."""
    from spade_lib.decoding.model.adapter import CausalLMAdapter

    _seen = set() if _seen is None else _seen
    if id(obj) in _seen or depth < 0 or isinstance(obj, (torch.Tensor, str, bytes, int, float, bool, type(None))):
        return None
    _seen.add(id(obj))
    if isinstance(obj, (torch.nn.Module, CausalLMAdapter)):
        return type(obj).__name__
    if isinstance(obj, dict):
        items = list(obj.items())[:64]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = list(enumerate(obj))[:64]
    else:
        items = list(getattr(obj, "__dict__", {}).items())
    for k, v in items:
        got = _held_model(v, depth - 1, _seen)
        if got is not None:
            return f"{k}: {got}" if got == type(v).__name__ else f"{k}.{got}"
    return None


def _weights_sha256(module, skip: tuple[str, ...] = ()) -> str:
    """16 hex digits of a sha256 over ``module``'s state dict (names and fp32 bytes, sorted by name)."""
    digest = hashlib.sha256()
    for k, v in sorted(module.state_dict().items()):
        if k not in skip:
            digest.update(k.encode())
            digest.update(v.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _head_identity(pair, head) -> dict:
    """The identity of a feature head (the head's name in ``pair.heads``, ``None`` for a head of a drafter's
    own; its kind; the build id from the pair's manifest when it came from a cached build; a sha256 of its
    weights but the ones tied to the target), which keys the cost cache, so another head under the same
    name is measured again."""
    heads = getattr(pair, "heads", {}) or {}
    head_name = next((n for n, h in heads.items() if h is head), None)
    built = ((getattr(pair, "manifest", {}) or {}).get("heads") or {}).get(head_name) or {}
    return {"name": head_name, "kind": head.kind, "build_id": built.get("build_id"),
            "weights_sha256": _weights_sha256(head, skip=head.tied)}
