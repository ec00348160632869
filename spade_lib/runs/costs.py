"""The pairs' cost tables: :func:`spade_lib.decoding.costs.measure_costs` per draft, cached per pair.

:func:`pair_costs` measures each draft of a pair once (``c`` and ``r(g)`` from paired
micro-benchmarks; the method is :mod:`spade_lib.decoding.costs`) and caches the result as JSON under
``runs/costs/`` (keyed by pair and its folder, draft, device, dtype, threads, ``max_gamma`` and
``context``), so every notebook of one ``make run`` predicts from the same numbers;
:func:`read_costs` reads a cached table back.

A draft is a draft model of the pair (``pair.drafts``), a feature head (``pair.heads[name]``, or a
registered drafter that drafts with one, ``"eagle"`` / ``"medusa"``: its ``c`` is the head's drafting
step, :class:`spade_lib.decoding.costs.HeadStep`, and the key names the head's build) or a model-free
drafter (``"ngram"``, ``"null"``: ``c = 0``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import torch

from spade_lib import paths
from spade_lib.io import write_json
from spade_lib.decoding.costs import measure_costs

__all__ = ["MIN_GAMMA", "pair_costs", "read_costs"]

MIN_GAMMA = 12  # pair_costs measures r(g) at least up to this g (05's max_gamma: one measurement per draft)


def read_costs(path) -> dict:
    """A cost table :func:`pair_costs` cached as JSON, with its ``r`` and ``t_verify`` keyed by int ``g``."""
    saved = json.loads(Path(path).read_text(encoding="utf-8"))
    saved["r"] = {int(g): v for g, v in saved["r"].items()}
    saved["t_verify"] = {int(g): v for g, v in saved["t_verify"].items()}
    return saved


def pair_costs(pair, drafts: Iterable[str], max_gamma: int, *, context: int = 128, reps: int = 20,
               cache: bool = True, progress: bool = False) -> dict[str, dict]:
    """:func:`measure_costs` for each draft of ``pair`` (a draft model, a feature head, or a registered
    drafter: a head's for ``"eagle"`` / ``"medusa"``, ``c = 0`` for a model-free one such as ``"ngram"``),
    cached under ``runs/costs/`` (see the module docstring).
    ``r(g)`` is measured for ``g = 1 .. max(max_gamma, MIN_GAMMA)``, so notebooks asking for different
    ``max_gamma`` below that share one measurement (and one prediction per configuration)."""
    from spade_lib.decoding.adapter import CausalLMAdapter

    max_gamma = max(int(max_gamma), MIN_GAMMA)
    device = next(pair.target.parameters()).device
    dtype = str(next(pair.target.parameters()).dtype).replace("torch.", "")
    out = {}
    target = None
    # one target measurement serves every model-free drafter (c = 0) of this call: r(g) is the target's
    # alone, so the first model draft's measurement (in turns with its draft) gives it too
    no_draft = None
    for name in dict.fromkeys(drafts):
        model = (getattr(pair, "drafts", {}) or {}).get(name)
        head, head_key = (None, None) if model is not None else _head_of(pair, name)
        model = model if head is None else head
        key = dict(pair=pair.name, path=str(getattr(pair, "path", None)), draft=name, device=str(device), dtype=dtype,
                   threads=torch.get_num_threads(), max_gamma=int(max_gamma), context=int(context), reps=int(reps))
        if head_key is not None:
            key["head"] = head_key
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        path = paths.RUNS_DIR / "costs" / pair.name / f"{name}-{digest}.json"
        if cache and path.is_file():
            out[name] = read_costs(path)
            continue
        target = target or CausalLMAdapter(pair.target)
        if model is None and no_draft is not None:
            got = dict(no_draft)
        else:
            draft = None if model is None else model if head is not None else CausalLMAdapter(model)
            got = measure_costs(target, draft, int(max_gamma), context, reps=reps, device=device)
            if no_draft is None:
                no_draft = {**got, "c": 0.0, "t_draft": 0.0}
        got = {**got, "key": key}
        if progress:
            print(f"costs of {pair.name}/{name}: c = {got['c']:.3f}, r(1..{max_gamma}) = "
                  + " ".join(f"{v:.2f}" for v in got["r"].values()))
        if cache:
            write_json(path, got)
        out[name] = got
    return out


def _head_of(pair, name: str):
    """``(head, identity)`` of the draft ``name`` when a feature head drafts it (``pair.heads[name]``, or the
    head a registered drafter such as ``"eagle"`` picks), else ``(None, None)``. The identity (the head's
    name, kind, build id from the pair's manifest when it came from a cached build, and a sha256 of its
    weights) keys the cost cache, so another head under the same name is measured again."""
    import hashlib

    from spade_lib.decoding.drafters import make_drafter

    heads = getattr(pair, "heads", {}) or {}
    head = heads.get(name)
    if head is None:
        head = getattr(make_drafter(name, pair), "head", None)  # a registered drafter (unknown names refused)
    if head is None:
        return None, None
    head_name = next(n for n, h in heads.items() if h is head)
    digest = hashlib.sha256()
    for k, v in sorted(head.state_dict().items()):
        if k != "embed_tokens.weight":  # tied to the target's embedding
            digest.update(k.encode())
            digest.update(v.detach().float().cpu().numpy().tobytes())
    built = ((getattr(pair, "manifest", {}) or {}).get("heads") or {}).get(head_name) or {}
    return head, {"name": head_name, "kind": head.kind, "build_id": built.get("build_id"),
                  "weights_sha256": digest.hexdigest()[:16]}
