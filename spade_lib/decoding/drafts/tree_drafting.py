"""Tree drafting: how a drafter with a model grows its draft tree, named once by a :class:`TreeConfig`.

A run names it once (``make_drafter(name, pair, tree=TreeConfig(...))``, or a spec for ``TreeConfig.parse`` such as
``"eagle2:nodes=16,depth=4,topk=4"``); every drafter with a model (``ModelDrafter``, EAGLE and Medusa heads) grows it
by :func:`grow_tree` with :mod:`spade_lib.decoding.drafts.tree_shapes`. Terms are :mod:`spade_lib.decoding.drafts.tree`'s (the root
is the pending token). **Shapes** (``TreeConfig.shape``; fields read in brackets; ``"chain"``, the default: no tree):

- ``"eagle2"`` [``total_nodes``, ``depth``, ``top_k``]: EAGLE-2 (Li et al. 2024): per level the ``top_k`` nodes of
  highest cumulative draft probability expand to their ``top_k`` likeliest children; all reranked to ``total_nodes``;
- ``"static"`` [``choices``, ``depth``]: a Medusa choice list (paths of top-k ranks; :data:`SMALL_TREE`, 16 nodes of
  depth 4, or ``"medusa63"``: ``mc_sim_7b_63``), the rank-th likeliest token at each parent (``fill_static``);
- ``"sampled"`` [``widths`` or ``top_k`` and ``depth``, ``draws``]: SpecInfer (Miao et al. 2024): ``widths[d]``
  children per node at depth ``d`` from ``q = adjust(draft logits, sampling)`` at the parent, i.i.d. (``"iid"``) or
  without replacement (Jeon et al. 2024); no ``widths``: ``(top_k, 1, .., 1)`` of length ``depth``;
- ``"trie"`` [``total_nodes``, ``depth``]: the model-free drafters' trie (``"ngram_tree"``, ``"suffix"``).

**Which q.** Exact verification needs the ``q`` the tokens were drawn from: a sampled tree carries
``q = adjust(logits, sampling)`` at each node's parent (before removing earlier siblings: ``verify_tree`` does that);
eagle2 and static (``draws="deterministic"``) rank by the temperature-1 softmax of the raw draft logits, as EAGLE
does, and carry ``q = None``: each node counts as drawn from ``one_hot(x_i)``, lossless at every temperature.
**One forward per level**: :func:`grow_tree` asks the drafter's ``feed(tokens, parents, depths)`` for the raw logits
after a level: new rows' tokens, the parents of every row fed so far then the new ones (indices into it, ``-1``: the
root), new rows' depths (0: child of the root). A draft model runs one tree-masked ``CausalLMAdapter.extend``, EAGLE
one layer pass, Medusa its depth's head; a repeated path is fed once; :meth:`TreeConfig.levels` cuts the depth so the
rows fed (eagle2: ``<= top_k (depth - 1)``; static: nodes with children; sampled: all but the last level) fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch

from spade_lib.decoding.drafts.tree import DraftTree
from spade_lib.decoding.drafts.tree_shapes import (MAX_TREE_NODES, MEDUSA_63, check_tree_size, eagle2_tree, fill_static,
                                            sampled_tree, static_tree)
from spade_lib.sampling import SamplingConfig, adjust
from spade_lib.validate import MAX_GAMMA, ArgumentTypeError, check_choice, check_int

__all__ = ["TreeConfig", "TREE_SHAPES", "MODEL_SHAPES", "SMALL_TREE", "STATIC_CHOICES", "grow_tree", "committed_rows",
           "empty_tree", "Feed"]

TREE_SHAPES = ("chain", "eagle2", "static", "sampled", "trie")
MODEL_SHAPES = ("eagle2", "static", "sampled")  # the shapes grow_tree builds from a model's logits

# A small static tree, 16 nodes of depth 4 (4 + 6 + 4 + 2 per level), skewed to the top rank as Medusa's are.
SMALL_TREE: list[list[int]] = [
    [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0],
    [0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1],
]
STATIC_CHOICES: dict[str, list[list[int]]] = {"small": SMALL_TREE, "medusa63": MEDUSA_63}

# feed(tokens [n], parents of all rows so far then the n new ones, depths [n]) -> raw logits [n, V]
Feed = Callable[[list[int], list[int], list[int]], torch.Tensor]

_SPEC_KEYS = {"nodes": "total_nodes", "depth": "depth", "topk": "top_k", "widths": "widths", "draws": "draws",
              "choices": "choices"}  # spec key -> TreeConfig field
_FIELDS = {field: key for key, field in _SPEC_KEYS.items()}


def _reads(shape: str, widths: bool) -> tuple[str, ...]:
    """The spec keys ``shape`` reads (``widths``: whether a sampled tree names its widths, which then set its
    depth and width): the fields of the module docstring's brackets, in :meth:`TreeConfig.spec`'s order."""
    return {"chain": (), "eagle2": ("nodes", "depth", "topk"), "static": ("choices", "depth"),
            "trie": ("nodes", "depth"),
            "sampled": ("widths", "draws") if widths else ("topk", "depth", "draws")}[shape]


@dataclass(frozen=True)
class TreeConfig:
    """The draft tree a run asks for (module docstring: which fields each shape reads)."""

    shape: str = "chain"       # "chain" | "eagle2" | "static" | "sampled" | "trie"
    total_nodes: int = 16      # node budget N (eagle2's rerank; the trie drafters' cap)
    depth: int = 4             # levels below the root, the longest path (static: a cap on its choices)
    top_k: int = 4             # eagle2: children per expanded node = nodes expanded per level; sampled: default width
    widths: tuple[int, ...] = ()  # sampled: children per node at each level (() = (top_k, 1, .., 1) of length depth)
    draws: str = "iid"         # sampled: "iid" | "without_replacement"
    choices: str | tuple[tuple[int, ...], ...] = "small"  # static: "small" | "medusa63" | a choice list

    def __post_init__(self) -> None:
        check_choice("shape", self.shape, TREE_SHAPES)
        check_int("total_nodes", self.total_nodes, min=1, max=MAX_TREE_NODES)
        check_int("depth", self.depth, min=1, max=MAX_GAMMA)
        check_int("top_k", self.top_k, min=1, max=MAX_TREE_NODES)
        if isinstance(self.widths, (str, bytes)) or not isinstance(self.widths, (tuple, list)):
            raise ArgumentTypeError(f"widths: must be a tuple of children per level, got {self.widths!r} "
                                    f"({type(self.widths).__name__})")
        widths = tuple(check_int(f"widths[{d}]", w, min=1, max=MAX_TREE_NODES) for d, w in enumerate(self.widths))
        object.__setattr__(self, "widths", widths)
        check_choice("draws", self.draws, ("iid", "without_replacement"))
        if isinstance(self.choices, str):
            check_choice("choices", self.choices, tuple(STATIC_CHOICES))
        else:
            static_tree(self.choices)  # refuses a list that is not a tree, an empty one, a non-list
            object.__setattr__(self, "choices", tuple(tuple(int(r) for r in c) for c in self.choices))
        # a field the shape does not read must keep its default: else two configs of one tree (one spec, one
        # run identity) would differ, and the value would be dropped silently from the spec
        reads = _reads(self.shape, bool(widths))
        shape = f"{self.shape!r}{' with widths' if self.shape == 'sampled' and widths else ''}"
        for name, default in ((f.name, f.default) for f in fields(self) if f.name != "shape"):
            if _FIELDS[name] not in reads and getattr(self, name) != default:
                read = _reads_text(tuple(_SPEC_KEYS[k] for k in reads))
                raise ValueError(f"{name}: shape {shape} does not read it (it reads {read}), got "
                                 f"{name}={getattr(self, name)!r}")
        if self.shape == "sampled":
            check_tree_size("sampled", widths=self.level_widths())
        elif self.shape == "eagle2":
            check_tree_size("eagle2", depth=self.depth, top_k=self.top_k)

    @property
    def is_chain(self) -> bool:
        return self.shape == "chain"

    def choice_list(self, depth: int | None = None) -> list[list[int]]:
        """The static tree's choices, those of at most ``depth`` ranks (a tree again: prefixes are shorter)."""
        choices = STATIC_CHOICES[self.choices] if isinstance(self.choices, str) else self.choices
        return [list(c) for c in choices if depth is None or len(c) <= depth]

    def level_widths(self) -> tuple[int, ...]:
        """The sampled tree's children per node at each level."""
        return self.widths or (self.top_k,) + (1,) * (self.depth - 1)

    @property
    def max_depth(self) -> int:
        """The longest path this shape can draft (the decoder's gamma for it)."""
        if self.shape == "static":
            return max(len(c) for c in self.choice_list(self.depth))
        if self.shape == "sampled":
            return len(self.level_widths())
        return self.depth

    def rows_fed(self, depth: int) -> int:
        """At most how many nodes a draft evaluates (feeds) to grow this tree ``depth`` levels deep."""
        if self.shape == "eagle2":
            return self.top_k * (depth - 1)
        if self.shape == "static":
            return sum(len(c) < depth for c in self.choice_list(depth))
        if self.shape == "sampled":
            n, rows = 1, 0
            for w in self.level_widths()[:depth - 1]:
                n *= w
                rows += n
            return rows
        return 0

    def levels(self, max_depth: int, room: int | None = None) -> int:
        """The depth to grow: ``max_depth`` (the decoder's cap) at most, cut until the rows fed fit ``room``."""
        depth = max(1, min(self.max_depth, int(max_depth)))
        while room is not None and depth > 1 and self.rows_fed(depth) > room:
            depth -= 1
        return depth

    # -- spec strings ------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, spec: str | TreeConfig | None) -> TreeConfig:
        """``"shape[:key=value,...]"`` with keys ``nodes``, ``depth``, ``topk``, ``widths`` (``4-1-1``),
        ``draws`` and ``choices`` (a name): e.g. ``"eagle2:nodes=16,depth=4,topk=4"``,
        ``"sampled:widths=2-2-1,draws=without_replacement"``, ``"static:choices=medusa63"``. ``None``, ``""``
        or ``"chain"``: the chain. A :class:`TreeConfig` is returned as it is.

        Strict: each key at most once, and only the keys the shape reads (module docstring: ``eagle2`` reads
        ``nodes, depth, topk``; ``static`` ``choices, depth``; ``trie`` ``nodes, depth``; ``sampled`` ``widths,
        draws`` or, without widths, ``topk, depth, draws``; the chain none); a key left out keeps its default."""
        if isinstance(spec, TreeConfig):
            return spec
        if spec is None or spec == "":
            return cls()
        if not isinstance(spec, str):
            raise ArgumentTypeError(f"tree: expected a spec string or a TreeConfig, got {type(spec).__name__}")
        shape, _, rest = spec.strip().partition(":")
        shape = shape.strip()
        if shape not in TREE_SHAPES:
            raise ValueError(f"tree: shape {shape!r} in {spec!r} is not one of {list(TREE_SHAPES)}")
        items = [x.strip() for x in rest.split(",")] if rest.strip() else []
        keys = [item.partition("=")[0].strip() for item in items]
        reads = _reads(shape, "widths" in keys)
        values: dict[str, str] = {}
        for item, key in zip(items, keys):
            _, eq, value = item.partition("=")
            if not eq or not key:
                raise ValueError(f"tree: {item!r} in {spec!r} is not key=value (shape {shape!r} reads "
                                 f"{_reads_text(reads)})")
            if key not in _SPEC_KEYS:
                raise ValueError(f"tree: unknown key {key!r} in {spec!r}; shape {shape!r} reads {_reads_text(reads)}")
            if key in values:
                raise ValueError(f"tree: key {key!r} given twice in {spec!r} ({values[key]!r} and {value.strip()!r})")
            if key not in reads:
                why = " with widths (they set the depth and the children per level)" if shape == "sampled" else ""
                raise ValueError(f"tree: key {key!r} in {spec!r} is not read by shape {shape!r}{why}; it reads "
                                 f"{_reads_text(reads)}")
            values[key] = value.strip()
        kwargs: dict = {}
        for key, value in values.items():
            name = _SPEC_KEYS[key]
            try:
                if name == "widths":
                    kwargs[name] = tuple(int(w) for w in value.split("-"))
                elif name in ("draws", "choices"):
                    kwargs[name] = value
                else:
                    kwargs[name] = int(value)
            except ValueError:
                raise ValueError(f"tree: {key}={value!r} in {spec!r} is not "
                                 f"{'integers joined by -' if name == 'widths' else 'an integer'}") from None
        return cls(shape=shape, **kwargs)

    def spec(self) -> str:
        """The canonical spec string :meth:`parse` reads back (only the fields the shape reads): the one
        spelling a run's identity uses (``RunConfig.tree``). The chain's is ``""``, ``RunConfig``'s default,
        so that ``tree="chain"`` and ``tree=""`` are one run."""
        if self.shape == "chain":
            return ""
        if self.shape == "static" and not isinstance(self.choices, str):
            raise ValueError("spec: a static tree with an explicit choice list has no spec string (name one of "
                             f"{sorted(STATIC_CHOICES)})")
        keys = {"eagle2": ("nodes", "depth", "topk"), "static": ("choices", "depth"), "trie": ("nodes", "depth"),
                "sampled": ("widths", "draws")}[self.shape]
        values = {"nodes": self.total_nodes, "depth": self.depth, "topk": self.top_k, "draws": self.draws,
                  "widths": "-".join(map(str, self.level_widths())), "choices": self.choices}
        return f"{self.shape}:" + ",".join(f"{k}={values[k]}" for k in keys)


def _reads_text(reads: tuple[str, ...]) -> str:
    return ", ".join(reads) if reads else "no keys"


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().softmax(dim=-1)


def grow_tree(config: TreeConfig, root_logits: torch.Tensor, feed: Feed, sampling: SamplingConfig,
              generator: torch.Generator | None, *, max_depth: int, room: int | None = None
              ) -> tuple[DraftTree, dict[tuple[int, ...], int]]:
    """Grow ``config``'s tree (a model shape) from the draft's raw logits at the root, ``root_logits [V]``
    (cut or padded to the target's vocabulary), asking ``feed`` for each level (module docstring).

    ``max_depth``: the decoder's cap on the path length; ``room``: how many rows the draft's cache can
    still take (``None``: no limit). Returns the :class:`DraftTree` (its ``logits [N, V]``: the raw draft
    logits at each node's parent; ``q``: see the module docstring; ``stop="budget"`` when ``room`` cut
    the depth) and the row each fed path was given (``path tokens -> row``, rows numbered in feed order),
    which the drafter needs to commit the accepted path."""
    if config.shape not in MODEL_SHAPES:
        raise ValueError(f"tree: shape {config.shape!r} is not grown from a model's logits (one of {MODEL_SHAPES})")
    depth = config.levels(max_depth, room)
    cut = depth < config.levels(max_depth)
    logits_of: dict[tuple[int, ...], torch.Tensor] = {(): root_logits}
    rows: dict[tuple[int, ...], int] = {}
    parents: list[int] = []

    def raw(paths: list[list[int]]) -> torch.Tensor:
        new = list(dict.fromkeys(p for p in map(tuple, paths) if p not in logits_of))
        if new:
            par = [rows[p[:-1]] if len(p) > 1 else -1 for p in new]
            out = feed([p[-1] for p in new], parents + par, [len(p) - 1 for p in new])
            for j, p in enumerate(new):
                rows[p] = len(parents) + j
                logits_of[p] = out[j]
            parents.extend(par)
        return torch.stack([logits_of[tuple(p)] for p in paths])

    if config.shape == "eagle2":
        shape = eagle2_tree(lambda ps: _softmax(raw(ps)), total_nodes=config.total_nodes, depth=depth,
                            top_k=config.top_k)
    elif config.shape == "static":
        shape = fill_static(config.choice_list(depth), lambda ps: _softmax(raw(ps)))
    else:
        gen = generator if generator is not None else torch.default_generator
        shape = sampled_tree(lambda ps: adjust(raw(ps), sampling, validate=False), config.level_widths()[:depth],
                             generator=gen, draws=config.draws)
    dev, v = root_logits.device, int(root_logits.shape[-1])
    n = shape.n_nodes
    logits = torch.stack([logits_of[tuple(p[:-1])] for p in shape.paths()]) if n else root_logits.new_empty(0, v)
    q = None
    if shape.draws != "deterministic":
        q = shape.q.to(dev) if n else torch.zeros(0, v, device=dev)
    tree = DraftTree(shape.tokens.to(dev), q, logits, "budget" if cut else "max_gamma", shape.parents.to(dev),
                     shape.draws)
    return tree, rows


def empty_tree(device, stop: str) -> DraftTree:
    """A tree of no nodes (the decoder then takes a plain target step)."""
    none = torch.empty(0, dtype=torch.long, device=device)
    return DraftTree(none, None, None, stop, none, "deterministic")


def committed_rows(rows: dict[tuple[int, ...], int], tokens: Sequence[int]) -> list[int]:
    """The fed rows of the accepted path ``tokens`` (root-down): those of its longest fed prefix, increasing."""
    out = []
    for j in range(1, len(tokens) + 1):
        row = rows.get(tuple(tokens[:j]))
        if row is None:
            break
        out.append(row)
    return out
