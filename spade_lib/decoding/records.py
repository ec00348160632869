"""The trace's columns, each defined once: name, type, group, meaning, and where its value comes from.

A token-level trace has one row per *drafted* token (Leviathan et al. 2023: ``p`` target, ``q`` draft, ``gamma``
tokens drafted in a step, ``x`` a drafted token; probabilities of the *adjusted* -- temperature / top-k / top-p warped
-- distributions unless the name ends in ``_raw``: temperature 1, no truncation). Every column is one :class:`Column`
of this module's registry, which everything else reads: the Parquet schema (:func:`spade_lib.runs.trace.schema_for`:
name, ``dtype``); a generation's rows (:func:`rows`, ``GenerationResult.records()``: step / block / tree columns'
``value`` from the step's facts and the token's place, position columns from the decoder's statistics); the decoders'
:func:`position_stats` (one ``compute`` per column over a batch of verified blocks, :class:`StatInputs`); older schema
versions (each newer column filled with its ``fill``). Adding a column is one entry of ``_BUILTIN`` (bump
``spade_lib.runs.trace.SCHEMA_VERSION``, give ``since`` and ``fill``) or one :func:`register_column` call.

Groups (``GROUPS``):

``row``       added by the runner per generation (which prompt, its category, which sample); not in records
``step``      facts of the verification step, repeated on every row of the step
``block``     the drafted token's place in its block and in the text
``tree``      its node in the step's draft tree (terms below)
``position``  per-position statistics the decoder computes for each drafted token

**The draft tree.** Below the root (the newest committed token ``t``) each drafted token is a *node*, numbered ``0 ..``
in drafting order so that ``parent < node`` (``-1``: the root); ``depth = 0`` under the root, else ``depth(parent) +
1``; *sibling rank*: its place among its parent's children (0 first); *path*: the nodes from the root to it. A chain
has one child per node: ``node = pos``, ``parent = pos - 1``, ``depth = pos``, ``sibling_rank = 0``, which is what a
version-1 file is filled with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from spade_lib.measures import entropy, kl, tv

GROUPS = ("row", "step", "block", "tree", "position")
DTYPES = ("string", "bool", "int16", "int32", "float32", "float64")
TOPK_NAMES = ("p_topk_ids", "p_topk_probs", "q_topk_ids", "q_topk_probs")  # optional list columns (record_topk > 0)

# a trace's step identity (a list: pandas reads a tuple of keys as one key)
STEP_KEYS: list[str] = ["prompt_id", "sample", "step"]


@dataclass
class StatInputs:
    """What the decoder holds after verifying ``R`` blocks of ``g`` drafted tokens each.

    The single decoder passes ``R = 1``; the batched one a group of rows with the same ``g``. Derived
    distributions are computed once, on first use, and shared by the columns that read them.
    """

    logits_p: torch.Tensor          # [R, >= g, V] raw target logits at the drafted positions (more ignored)
    p: torch.Tensor                 # [R, >= g, V] adjusted target distributions p_0 .. (more ignored)
    x: torch.Tensor                 # [R, g] long: drafted tokens x_0 .. x_{g-1}
    q: torch.Tensor                 # [R, g, V] adjusted draft distributions each x_i was drawn from
    q_logits: torch.Tensor | None   # [R, g, V] raw draft logits; None: a logit-free drafter, q is its raw one too
    res: Any                        # spade_lib.verify.VerifyResult of the blocks (fields [R, g])

    @property
    def g(self) -> int:
        return int(self.x.shape[1])

    @cached_property
    def p_g(self) -> torch.Tensor:
        """[R, g, V] adjusted ``p`` at the drafted positions."""
        return self.p[:, :self.g]

    @cached_property
    def p_raw(self) -> torch.Tensor:
        """[R, g, V] target distributions at temperature 1, no truncation."""
        return self.logits_p[:, :self.g].float().softmax(dim=-1)

    @cached_property
    def q_raw(self) -> torch.Tensor:
        """[R, g, V] draft distributions at temperature 1 (``q`` itself for a logit-free drafter)."""
        return self.q if self.q_logits is None else self.q_logits.float().softmax(dim=-1)

    @cached_property
    def p_top2(self):
        """``torch.topk(p_raw, 2)``: values and indices ``[R, g, 2]``."""
        return torch.topk(self.p_raw, 2, dim=-1)

    def at_x(self, dist: torch.Tensor) -> torch.Tensor:
        """[R, g] ``dist_i(x_i)`` of a ``[R, g, V]`` distribution."""
        return dist.gather(-1, self.x[..., None])[..., 0]


@dataclass(frozen=True)
class Column:
    """One trace column. ``value`` (step, block and tree columns) gives it for one drafted token from
    its step's facts (``step``: a ``StepInfo``), the step's index and the token's position ``pos``;
    ``compute`` (position columns) gives it for a batch of blocks, ``[R, g]``; ``fill`` gives it, as an
    array, for a file of a schema version before ``since`` from that file's columns (``None``: such
    files cannot be read)."""

    name: str
    dtype: str                      # one of DTYPES (its Arrow type: spade_lib.runs.trace)
    group: str                      # one of GROUPS
    meaning: str                    # what it is, with its formula: the schema's documentation
    value: Callable[[Any, int, int], Any] | None = None
    compute: Callable[[StatInputs], torch.Tensor] | None = None
    since: int = 1                  # the schema version that added it
    fill: Callable[[Mapping[str, np.ndarray]], np.ndarray] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"column: name must be an identifier, got {self.name!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"column {self.name}: dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.group not in GROUPS:
            raise ValueError(f"column {self.name}: group must be one of {GROUPS}, got {self.group!r}")
        if not isinstance(self.meaning, str) or not self.meaning.strip():
            raise ValueError(f"column {self.name}: meaning must say what the column is")
        if self.group == "position" and self.compute is None:
            raise ValueError(f"column {self.name}: a position column needs compute")
        if self.group in ("step", "block", "tree") and self.value is None:
            raise ValueError(f"column {self.name}: a {self.group} column needs value")


def _chain(f: Callable[[Any], Any], name: str, dtype: str, meaning: str) -> Column:
    """A tree column: a tree step's own value (``StepInfo.tree[name]``, from the decoder), on a chain
    ``f(pos)``: written so by :func:`rows`, filled so in v1 files."""
    return Column(name, dtype, "tree", meaning, since=2,
                  value=lambda s, step, pos: f(pos) if s.tree is None else s.tree[name][pos],
                  fill=lambda cols: f(np.asarray(cols["pos"], dtype=np.int64)))


def _res(field: str) -> Callable[[StatInputs], torch.Tensor]:
    return lambda i: getattr(i.res, field)


# The built-in columns, in the trace's column order (the Parquet schema of spade_lib.runs.trace).
_BUILTIN: tuple[Column, ...] = (
    Column("prompt_id", "string", "row", "suite question_id (as a string)"),
    Column("category", "string", "row", "suite category"),
    Column("sample", "int32", "row", "repeat index of this prompt; the generation seed derives from "
                                      "(run seed, prompt_id, sample)"),
    Column("step", "int32", "step", "verification step within the generation, 0-based",
           value=lambda s, step, pos: step),
    Column("pos", "int16", "block", "draft position i in the block, 0-based (a tree: the node)",
           value=lambda s, step, pos: pos),
    Column("abs_pos", "int32", "block", "index of x in the generated continuation (tokens emitted before "
                                        "the step + its depth; a chain: + pos)",
           value=lambda s, step, pos: s.abs_pos + (pos if s.tree is None else s.tree["depth"][pos])),
    _chain(lambda pos: pos, "node", "int16", "x's node in the step's draft tree, 0-based in drafting order "
                                             "(a chain: pos)"),
    _chain(lambda pos: pos - 1, "parent", "int16", "its parent's node, < node; -1 is the root, the committed "
                                                   "token t (a chain: pos - 1)"),
    _chain(lambda pos: pos, "depth", "int16", "0 below the root, else depth(parent) + 1 (a chain: pos)"),
    _chain(lambda pos: 0 * pos, "sibling_rank", "int16", "its rank among its parent's children, 0 first "
                                                         "(a chain: 0)"),
    Column("gamma", "int16", "step", "tokens drafted in this step", value=lambda s, step, pos: s.gamma),
    Column("draft_token", "int32", "position", "drafted token x", compute=lambda i: i.x),
    Column("p_x", "float32", "position", "p(x) under the adjusted target distribution", compute=_res("p_x")),
    Column("q_x", "float32", "position", "q(x) under the adjusted draft distribution", compute=_res("q_x")),
    Column("accept_prob", "float32", "position", "the rule's accept probability a(x) (spade_lib.rules): "
                                                 "min(1, p(x) / q(x)) for exact", compute=_res("accept_prob")),
    Column("uniform", "float32", "position", "the uniform r drawn for this position; accepted iff "
                                             "r < accept_prob (NaN in deterministic modes)", compute=_res("uniforms")),
    Column("reached", "bool", "position", "all positions < pos of the block were accepted, so x was judged",
           compute=_res("reached")),
    Column("accepted", "bool", "position", "reached and accepted", compute=_res("accepted")),
    Column("n_accepted", "int16", "step", "accepted draft tokens in this step",
           value=lambda s, step, pos: s.n_accepted),
    Column("next_token", "int32", "step", "residual sample ~ norm(max(0, p - q)) at the first rejection, or "
                                          "the bonus token ~ p after gamma acceptances",
           value=lambda s, step, pos: s.next_token),
    Column("h_p", "float32", "position", "entropy -sum p log p (nats) of the adjusted p", compute=lambda i: entropy(i.p_g)),
    Column("h_q", "float32", "position", "entropy (nats) of the adjusted q", compute=lambda i: entropy(i.q)),
    Column("tv", "float32", "position", "TV(p, q) = 1/2 sum |p - q|; 1 - tv is the expected acceptance of a "
                                        "reached position", compute=lambda i: tv(i.p_g, i.q)),
    Column("kl", "float32", "position", "KL(p || q) = sum p log(p / q) (nats)", compute=lambda i: kl(i.p_g, i.q)),
    Column("p_top1", "int32", "position", "argmax of the target's raw logits",
           compute=lambda i: i.p_top2.indices[..., 0]),
    Column("p_margin", "float32", "position", "target top-1 minus top-2 probability at temperature 1",
           compute=lambda i: i.p_top2.values[..., 0] - i.p_top2.values[..., 1]),
    Column("q_top_prob", "float32", "position", "the draft's max probability at temperature 1 (a policy signal)",
           compute=lambda i: i.q_raw.amax(dim=-1)),
    Column("p_x_raw", "float32", "position", "p(x) at temperature 1, no top-k / top-p",
           compute=lambda i: i.at_x(i.p_raw)),
    Column("q_x_raw", "float32", "position", "q(x) at temperature 1", compute=lambda i: i.at_x(i.q_raw)),
    Column("h_p_raw", "float32", "position", "H(p) at temperature 1", compute=lambda i: entropy(i.p_raw)),
    Column("h_q_raw", "float32", "position", "H(q) at temperature 1", compute=lambda i: entropy(i.q_raw)),
    Column("tv_raw", "float32", "position", "TV(p, q) at temperature 1", compute=lambda i: tv(i.p_raw, i.q_raw)),
    Column("t_draft", "float64", "step", "seconds spent drafting (a measurement: differs run to run)",
           value=lambda s, step, pos: s.t_draft),
    Column("t_verify", "float64", "step", "seconds spent verifying", value=lambda s, step, pos: s.t_verify),
    Column("t_overhead", "float64", "step", "seconds in the rest of the step", value=lambda s, step, pos: s.t_overhead),
)

_REGISTRY: dict[str, Column] = {c.name: c for c in _BUILTIN}


def register_column(column: Column, *, replace: bool = False) -> Column:
    """Add ``column`` after the others (the trace's schema, rows and, for a position column, the
    decoders' statistics gain it). Refused: a ``row`` column, a built-in name, a taken name unless
    ``replace``."""
    if not isinstance(column, Column):
        raise TypeError(f"column must be a records.Column, got {type(column).__name__}")
    if column.group == "row":
        raise ValueError(f"column {column.name}: the row keys are fixed ({names('row')})")
    if any(c.name == column.name for c in _BUILTIN) or column.name in TOPK_NAMES:
        raise ValueError(f"column {column.name}: a built-in column of the trace")
    if column.name in _REGISTRY and not replace:
        raise ValueError(f"column {column.name}: already registered (pass replace=True)")
    _REGISTRY[column.name] = column
    return column


def unregister_column(name: str) -> None:
    """Remove a registered column (a built-in one cannot be removed)."""
    if any(c.name == name for c in _BUILTIN):
        raise ValueError(f"column {name}: a built-in column of the trace cannot be unregistered")
    _REGISTRY.pop(name, None)


def columns(*groups: str) -> tuple[Column, ...]:
    """The registered columns in the trace's order, those of ``groups`` only when given."""
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"groups: unknown {unknown}; choose from {GROUPS}")
    return tuple(c for c in _REGISTRY.values() if not groups or c.group in groups)


def names(*groups: str) -> tuple[str, ...]:
    """The names of :func:`columns` (``groups``)."""
    return tuple(c.name for c in columns(*groups))


def record_names() -> tuple[str, ...]:
    """The columns of one record (the trace's columns minus the row keys), in order."""
    return tuple(c.name for c in _REGISTRY.values() if c.group != "row")


def position_stats(inputs: StatInputs) -> tuple[tuple[str, ...], torch.Tensor]:
    """``(names, stats)``: every position column's ``compute`` of ``inputs``, stacked as float64
    ``[R, len(names), g]`` in the trace's order (one device-to-host transfer for all of them)."""
    cols = columns("position")
    return tuple(c.name for c in cols), torch.stack([c.compute(inputs).to(torch.float64) for c in cols], dim=1)


def rows(steps: Sequence[Any]) -> list[dict[str, Any]]:
    """One dict per drafted token of ``steps`` (``StepInfo``s, ``stats`` recorded) with exactly the
    record columns, in order; plus the top-k columns (``TOPK_NAMES``) of a step that recorded them.
    A step that drafted nothing has no rows."""
    layout = [(c.name, c.value, None) if c.group != "position" else
              (c.name, None, int if c.dtype.startswith("int") else bool if c.dtype == "bool" else None)
              for c in _REGISTRY.values() if c.group != "row"]
    out: list[dict[str, Any]] = []
    for step, s in enumerate(steps):
        if s.gamma == 0:
            continue
        if s.stats is None:
            raise ValueError("records: this generation ran with record='light' or False (no token records)")
        missing = [n for n, value, _ in layout if value is None and n not in s.stats]
        if missing:
            raise ValueError(f"records: the decoder computed no {missing} (position columns come from "
                             "spade_lib.decoding.records.position_stats)")
        for pos in range(s.gamma):
            row = {}
            for name, value, kind in layout:
                if value is not None:
                    row[name] = value(s, step, pos)
                else:
                    v = s.stats[name][pos]
                    row[name] = kind(v) if kind is not None else v
            if s.topk is not None:
                for name, values in zip(TOPK_NAMES, s.topk):
                    row[name] = values[pos]
            out.append(row)
    return out


# The built-in layout by group (schema version 2; registered columns are in columns() / names()).
ROW_KEYS: tuple[str, ...] = tuple(c.name for c in _BUILTIN if c.group == "row")
STEP_COLUMNS: tuple[str, ...] = tuple(c.name for c in _BUILTIN if c.group == "step")
BLOCK_COLUMNS: tuple[str, ...] = tuple(c.name for c in _BUILTIN if c.group == "block")
TREE_COLUMNS: tuple[str, ...] = tuple(c.name for c in _BUILTIN if c.group == "tree")
RECORD_COLUMNS: tuple[str, ...] = tuple(c.name for c in _BUILTIN if c.group != "row")
POSITION_STATS: tuple[str, ...] = tuple(c.name for c in _BUILTIN if c.group == "position")
INT_STATS: frozenset[str] = frozenset(c.name for c in _BUILTIN if c.group == "position" and c.dtype.startswith("int"))
BOOL_STATS: frozenset[str] = frozenset(c.name for c in _BUILTIN if c.group == "position" and c.dtype == "bool")
