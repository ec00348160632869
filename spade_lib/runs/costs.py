"""The pairs' cost tables: :func:`spade_lib.decoding.costs.measure_costs` per draft, cached per pair.

:func:`pair_costs` measures each draft of a pair once (``c`` and ``r(g)`` from paired
micro-benchmarks; the method is :mod:`spade_lib.decoding.costs`) and caches the result as JSON under
``runs/costs/`` (keyed by pair and its folder, draft, device, dtype, threads, ``max_gamma`` and
``context``), so every notebook of one ``make run`` predicts from the same numbers;
:func:`read_costs` reads a cached table back.
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
    """:func:`measure_costs` for each draft of ``pair`` (a pair draft model or a registered model-free
    drafter such as ``"ngram"``: ``c = 0``), cached under ``runs/costs/`` (see the module docstring).
    ``r(g)`` is measured for ``g = 1 .. max(max_gamma, MIN_GAMMA)``, so notebooks asking for different
    ``max_gamma`` below that share one measurement (and one prediction per configuration)."""
    from spade_lib.decoding.adapter import CausalLMAdapter

    max_gamma = max(int(max_gamma), MIN_GAMMA)
    device = next(pair.target.parameters()).device
    dtype = str(next(pair.target.parameters()).dtype).replace("torch.", "")
    out = {}
    target = None
    no_draft = None  # one target-only measurement serves every model-free drafter (c = 0) of this call
    for name in dict.fromkeys(drafts):
        model = (getattr(pair, "drafts", {}) or {}).get(name)
        key = dict(pair=pair.name, path=str(getattr(pair, "path", None)), draft=name, device=str(device), dtype=dtype,
                   threads=torch.get_num_threads(), max_gamma=int(max_gamma), context=int(context), reps=int(reps))
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        path = paths.RUNS_DIR / "costs" / pair.name / f"{name}-{digest}.json"
        if cache and path.is_file():
            out[name] = read_costs(path)
            continue
        target = target or CausalLMAdapter(pair.target)
        if model is None and no_draft is not None:
            got = dict(no_draft)
        else:
            got = measure_costs(target, CausalLMAdapter(model) if model is not None else None, int(max_gamma),
                                context, reps=reps, device=device)
            if model is None:
                no_draft = dict(got)
        got = {**got, "key": key}
        if progress:
            print(f"costs of {pair.name}/{name}: c = {got['c']:.3f}, r(1..{max_gamma}) = "
                  + " ".join(f"{v:.2f}" for v in got["r"].values()))
        if cache:
            write_json(path, got)
        out[name] = got
    return out
