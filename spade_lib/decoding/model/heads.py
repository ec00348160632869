"""Draft heads: the interface every head kind implements (:class:`DraftHead`), and the draft vocabulary.

A *draft head* is a small module that drafts from the target's own hidden states instead of from the
tokens (EAGLE: :mod:`spade_lib.decoding.drafts.eagle`; Medusa: :mod:`spade_lib.decoding.drafts.medusa`). Every kind
reads the features ``f_t = [h^{l_1}_t ; ... ; h^{l_k}_t]`` of the target layers it names
(:attr:`DraftHead.feature_layers`, Hugging Face's ``output_hidden_states`` indexing) and scores a draft
vocabulary of ``Vd <= V`` target tokens (FR-Spec style): draft row ``j`` is target token
``draft_ids[j] = j + d2t[j]`` (speculators' ``d2t`` offsets), and the head's ``q`` over the target's ``V``
tokens is ``softmax`` of :func:`scatter_vocab` of its ``[..., Vd]`` logits (``-inf``, so ``q = 0``, off the
draft vocabulary: still lossless).

What a kind gives, so that the decoder, the cost model and the zoo never ask which kind a head is: its
drafter (:meth:`DraftHead.drafter`), its timed drafting step (:meth:`DraftHead.cost_step`, which
:class:`spade_lib.decoding.studies.costs.HeadStep` times for ``c``), its draft logits by depth on teacher-forced
features (:meth:`DraftHead.chain_logits`: what the zoo's trainers and evaluators score), and which of its
parameters are the target's (:attr:`DraftHead.tied`: never trained, never saved). The zoo's recipes of
each kind (how one is built and trained) are :data:`spade_lib.zoo.heads.HEAD_KINDS`.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from spade_lib.validate import ArgumentTypeError

__all__ = ["DraftHead", "scatter_vocab", "check_head_state"]


def scatter_vocab(logits: torch.Tensor, token_ids: torch.Tensor, width: int) -> torch.Tensor:
    """``logits [..., Vd]`` over a sub-vocabulary -> ``[..., width]`` with column ``token_ids[j]`` holding
    ``logits[..., j]`` and ``-inf`` everywhere else (``token_ids [Vd]`` distinct, all ``< width``)."""
    full = logits.new_full((*logits.shape[:-1], int(width)), float("-inf"))
    return full.index_copy_(-1, token_ids, logits)


def check_head_state(head: nn.Module, state: dict, source: str = "state_dict") -> None:
    """Refuse a tensor of ``state`` that ``head`` cannot load, before loading it: for each key ``head`` has
    (others are the caller's to judge), a tensor of the shape the head's config gives, of the kind it holds
    (floating-point weights, integer maps such as ``d2t``, boolean masks such as ``t2d``) and, for weights,
    finite. Errors start with the key and name ``source`` (the file): a NaN weight or a float ``d2t`` loaded
    silently fails later, far from its cause (an argmax over NaN logits, offsets truncated to integers)."""
    own = head.state_dict()
    for key, t in state.items():
        if key not in own:
            continue
        want = own[key]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{key}: {source} holds a {type(t).__name__}, not a tensor")
        if tuple(t.shape) != tuple(want.shape):
            raise ValueError(f"{key}: {source} has shape {list(t.shape)}, the head's config gives "
                             f"{list(want.shape)}")
        if want.is_floating_point():
            if not t.is_floating_point():
                raise TypeError(f"{key}: {source} holds {t.dtype}, a weight must be floating-point "
                                "(an integer weight would be cast silently)")
            finite = torch.isfinite(t)
            if not bool(finite.all()):
                bad = int((~finite).sum())
                what = "NaN" if bool(torch.isnan(t).any()) else "inf"
                raise ValueError(f"{key}: {source} holds {what} ({bad} of {t.numel()} entries not finite)")
        elif want.dtype == torch.bool:
            if t.is_floating_point() or t.is_complex() or (t.dtype != torch.bool and bool(((t != 0) & (t != 1)).any())):
                raise TypeError(f"{key}: {source} holds {t.dtype} values, a mask must be boolean")
        elif t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"{key}: {source} holds {t.dtype}, a map must hold integers (ids or offsets: a "
                            "float one would be truncated)")


class DraftHead(nn.Module):
    """A draft head on the target's hidden states (module docstring). A subclass sets :attr:`kind` and
    :attr:`config_class`, builds its modules after ``super().__init__(config)``, and implements the
    methods that raise :class:`NotImplementedError` here.

    ``config`` is a dataclass with ``vocab_size`` (``V``), ``draft_vocab_size`` (``Vd``), ``to_dict()`` and
    ``from_dict()``. Buffers: ``d2t [Vd]`` (saved; speculators' offsets) and ``draft_ids [Vd]`` (not saved;
    ``arange(Vd) + d2t``, rebuilt whenever a state dict is loaded)."""

    kind: ClassVar[str]                   # the drafter that drafts with it ("eagle", "medusa"); a SPADE folder's key
    config_class: ClassVar[type]          # the config dataclass (from_dict of a saved head)
    tied: ClassVar[tuple[str, ...]] = ()  # parameters that are the target's own (tied): never trained or saved

    def __init__(self, config):
        super().__init__()
        self.config = config
        vd = int(config.draft_vocab_size)
        self.register_buffer("d2t", torch.zeros(vd, dtype=torch.long))
        self.register_buffer("draft_ids", torch.arange(vd), persistent=False)  # j + d2t[j], kept in step

    # -- what the head reads and drafts ---------------------------------------------------------------
    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target's ``hidden_states`` indices the head reads, in the order of its features."""
        raise NotImplementedError

    @property
    def in_features(self) -> int:
        """``F``: the width of one position's features (the widths of :attr:`feature_layers` summed)."""
        raise NotImplementedError

    @property
    def variant(self) -> str:
        """The zoo's name of this head's kind (:data:`spade_lib.zoo.heads.HEAD_KINDS`): :attr:`kind` unless a
        class has variants (EAGLE: ``"eagle3"``, ``"eagle1"``)."""
        return self.kind

    @property
    def max_depth(self) -> int | None:
        """The most tokens one drafting step can draft (Medusa: its ``k`` heads); ``None``: no limit."""
        return None

    def features(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """``[h^{l1} ; h^{l2} ; ...]`` from ``{layer: [..., H]}`` (a ``TargetView.hidden``): ``[..., F]``."""
        missing = [layer for layer in self.feature_layers if layer not in hidden]
        if missing:
            raise ValueError(f"hidden: lacks the target layers {missing} this head reads")
        return torch.cat([hidden[layer] for layer in self.feature_layers], dim=-1)

    # -- the draft vocabulary -------------------------------------------------------------------------
    def set_draft_vocab(self, token_ids: torch.Tensor) -> None:
        """The draft vocabulary: ``draft_vocab_size`` distinct target ids (sorted here, as speculators does)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten().sort().values
        vd, v = int(self.config.draft_vocab_size), int(self.config.vocab_size)
        if ids.numel() != vd or ids.unique().numel() != vd or ids.min() < 0 or ids.max() >= v:
            raise ValueError(f"token_ids: need {vd} distinct ids in [0, {v}), got {ids.numel()} "
                             f"({ids.unique().numel()} distinct)")
        self._set_draft_ids(ids)

    def _set_draft_ids(self, ids: torch.Tensor) -> None:
        """Point draft row ``j`` at target id ``ids[j]`` (checked by the caller): ``d2t`` and ``draft_ids``."""
        self.d2t.copy_((ids - torch.arange(ids.numel())).to(self.d2t.device))
        self.draft_ids.copy_(ids.to(self.draft_ids.device))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict`` after :func:`check_head_state` (shapes, kinds, finite weights)."""
        check_head_state(self, state_dict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.draft_ids.copy_(torch.arange(int(self.config.draft_vocab_size), device=self.d2t.device) + self.d2t)

    def target_logits(self, draft_logits: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
        """``[..., Vd]`` draft-vocabulary logits -> ``[..., V]`` with ``-inf`` off the draft vocabulary
        (cut or ``-inf``-padded to ``vocab_size`` when the target's head differs from the config's ``V``)."""
        v = int(self.config.vocab_size) if vocab_size is None else int(vocab_size)
        return scatter_vocab(draft_logits, self.draft_ids, max(v, int(self.config.vocab_size)))[..., :v]

    # -- building, drafting, costing, training -------------------------------------------------------
    @classmethod
    def from_target(cls, target, config=None, *, draft_token_ids=None, init_from_target: bool = True,
                    **config_options) -> "DraftHead":
        """A head for ``target`` (a causal LM) over ``draft_token_ids`` (all ``V`` when ``None``), initialised
        from the target's own weights where ``init_from_target``, on the target's device, in eval mode."""
        raise NotImplementedError

    def tie_to_target(self, target) -> None:
        """Share the :attr:`tied` parameters with ``target`` (after loading a saved head). Default: none."""

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The head's own parameters (those not :attr:`tied` to the target), in ``parameters()`` order."""
        return [p for name, p in self.named_parameters() if name not in self.tied]

    def drafter(self, **options):
        """The :class:`~spade_lib.decoding.drafts.drafters.Drafter` that drafts with this head (``tree=`` and the
        kind's own options)."""
        raise NotImplementedError

    def cost_step(self):
        """A fresh engine of one drafting step, for the cost model (:class:`spade_lib.decoding.studies.costs.HeadStep`
        times it): ``prefill(features [n, F], tokens [n])`` puts ``n`` committed positions in its context,
        ``step(feature [1, F], token [1], position) -> [1, Vd]`` is the drafting step a drafter takes after
        them, ``crop(length)`` rolls the context back, and ``length`` is the context's positions."""
        raise NotImplementedError

    def chain_logits(self, features: torch.Tensor, next_tokens: torch.Tensor, depth: int, *,
                     own_tokens: bool = False) -> list[torch.Tensor]:
        """Draft logits by depth after every position of one sequence: ``features [T, F]`` of positions
        ``0 .. T-1``, ``next_tokens [T]`` (``x_{t+1}``) -> ``depth`` tensors ``[T, Vd]``, the ``d``-th (from 0)
        at ``t`` a guess of ``x_{t+2+d}``. Depth ``d`` is fed the true ``x_{t+1+d}`` (teacher forcing: the
        trainers' and the build's figures; past the sequence's end a pad, never a valid label) or, with
        ``own_tokens``, the head's own greedy token of depth ``d - 1`` (what a greedy drafter does)."""
        raise NotImplementedError

    def greedy_chain(self, features: torch.Tensor, next_tokens: torch.Tensor, depth: int) -> torch.Tensor:
        """The head's greedy chain after every position (:meth:`chain_logits` with ``own_tokens``) as target
        ids ``[T, depth]``: ``y[t, d - 1]`` the ``d``-th proposal after ``t``."""
        logits = self.chain_logits(features, next_tokens, depth, own_tokens=True)
        return torch.stack([self.draft_ids[lg.argmax(-1)] for lg in logits], dim=1)


def config_from_dict(cls, d: dict, required: tuple[str, ...]):
    """``cls(**d)`` for a head kind's config dataclass read from a folder: ``d`` must be a dict of ``cls``'s
    fields, none unknown and every one of ``required`` present (each error names the fields)."""
    name = cls.__name__
    if not isinstance(d, dict):
        raise ArgumentTypeError(f"config: must be a dict of {name} fields, got {type(d).__name__}")
    unknown = sorted(set(d) - set(cls.__dataclass_fields__))
    if unknown:
        raise ValueError(f"config: unknown {name} fields {unknown}")
    missing = [k for k in required if k not in d]
    if missing:
        raise ValueError(f"config: lacks the required {name} fields {missing}")
    return cls(**d)
