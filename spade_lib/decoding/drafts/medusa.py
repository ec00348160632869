"""Medusa-1 draft heads (Cai et al. 2024): ``k`` small heads on the target's last hidden state.

Notation as in :mod:`spade_lib.decoding.drafts.eagle`: ``h_t = h^L_t`` is the target's last hidden state at
position ``t`` (after its final norm: what its own LM head reads, so ``p(x_{t+1}) = softmax(W h_t)``).
Head ``i = 0 .. k-1`` predicts the token ``i + 2`` places ahead, skipping the one the target itself
predicts::

    r_i = h_t + SiLU(W^res_i h_t + b_i)                 one ResBlock (``num_layers`` of them in turn)
    q_i(x_{t+2+i}) = softmax(lm_head_i(r_i))            over Vd; draft row j is target token j + d2t[j]

Medusa-1 trains the heads on a frozen target, loss ``sum_i 0.8^i CE_i`` (Cai et al.'s ``lambda_i``);
each ResBlock's linear starts at zero and each ``lm_head_i`` from the target's head rows, so at
initialisation every head predicts what the target predicts for the *next* token. The heads share
the draft vocabulary (``d2t``, as the EAGLE heads do: ``Vd`` rows instead of ``V`` per head).

The heads see only ``h_t``, not the drafted tokens before theirs, so ``q_i`` is a distribution over
``x_{t+2+i}`` alone; a chain ``x_0 .. x_{gamma-1}`` with ``x_i ~ q_i`` and verification against ``q_i``
is still lossless (any ``q`` is), only less often accepted than a head that conditions on its prefix.
:class:`MedusaDrafter` drafts at most ``k`` tokens per step, one per head, running only the ``g`` heads it
drafts with (so a step of ``g`` tokens costs ``g`` head forwards: :class:`spade_lib.decoding.studies.costs.HeadStep`).
With ``tree=`` a :class:`~spade_lib.decoding.drafts.tree_drafting.TreeConfig` it proposes that tree over the
heads' distributions instead -- Medusa's own is ``TreeConfig(shape="static")`` over the per-head top-k
(``choices="medusa63"``, Medusa's ``mc_sim_7b_63``): a node at depth ``d`` draws from head ``d`` whatever
its path, so every level costs nothing beyond the one forward of the heads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from spade_lib.decoding.drafts.drafters import Draft, Drafter, HEAD_DRAFTER, TargetView, _model_tree, _signals, sample_categorical
from spade_lib.decoding.drafts.policies import Policy
from spade_lib.decoding.drafts.tree_drafting import TreeConfig, empty_tree, grow_tree
from spade_lib.decoding.model import native
from spade_lib.decoding.model.heads import DraftHead, config_from_dict
from spade_lib.sampling import SamplingConfig, adjust
from spade_lib.validate import ArgumentTypeError, check_int

__all__ = ["MedusaConfig", "MedusaHead", "MedusaDrafter"]


@dataclass
class MedusaConfig:
    """What a Medusa head set is."""

    hidden_size: int                 # H of the target
    vocab_size: int                  # V of the target
    feature_layer: int               # target hidden_states index read: L (after the final norm)
    num_heads: int = 4               # k: tokens drafted per step at most
    num_layers: int = 1              # ResBlocks per head
    draft_vocab_size: int | None = None  # Vd rows per head (None: the whole vocabulary)
    meta: dict = field(default_factory=dict)  # free-form facts saved with the heads

    def __post_init__(self) -> None:
        for name in ("hidden_size", "vocab_size", "num_heads", "num_layers"):
            setattr(self, name, check_int(name, getattr(self, name), min=1))
        self.feature_layer = check_int("feature_layer", self.feature_layer, min=0)
        if self.draft_vocab_size is None:
            self.draft_vocab_size = self.vocab_size
        self.draft_vocab_size = check_int("draft_vocab_size", self.draft_vocab_size, min=1)
        if not isinstance(self.meta, dict):
            raise ArgumentTypeError(f"meta: must be a dict, got {type(self.meta).__name__}")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size: must lie in [1, vocab_size={self.vocab_size}], got {self.draft_vocab_size}")

    @classmethod
    def for_target(cls, target_config, **options) -> "MedusaConfig":
        tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        return cls(hidden_size=int(tc.hidden_size), vocab_size=int(tc.vocab_size),
                   feature_layer=int(tc.num_hidden_layers), **options)

    def to_dict(self) -> dict:
        return {"hidden_size": self.hidden_size, "vocab_size": self.vocab_size, "feature_layer": self.feature_layer,
                "num_heads": self.num_heads, "num_layers": self.num_layers,
                "draft_vocab_size": self.draft_vocab_size, "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, d: dict) -> "MedusaConfig":
        return config_from_dict(cls, d, ("hidden_size", "vocab_size", "feature_layer"))


class ResBlock(nn.Module):
    """``x + SiLU(W x + b)``, ``W`` initialised to zero (an identity at the start)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHead(DraftHead):
    """``k`` heads, each ``num_layers`` ResBlocks and a linear over the draft vocabulary (module docstring).

    ``heads.{i}.{0..n-1}.linear`` are the ResBlocks and ``heads.{i}.{n}`` the head's ``lm_head`` (Medusa's
    own ``medusa_head.{i}`` layout); ``d2t`` maps draft rows to target ids as in :class:`~spade_lib.decoding.drafts.eagle.EagleHead`."""

    kind = "medusa"
    config_class = MedusaConfig

    def __init__(self, config: MedusaConfig):
        super().__init__(config)
        h, vd = config.hidden_size, config.draft_vocab_size
        self.heads = nn.ModuleList([
            nn.Sequential(*[ResBlock(h) for _ in range(config.num_layers)], nn.Linear(h, vd, bias=False))
            for _ in range(config.num_heads)])

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return (int(self.config.feature_layer),)

    @property
    def in_features(self) -> int:
        return int(self.config.hidden_size)

    @property
    def max_depth(self) -> int:
        return int(self.config.num_heads)

    @classmethod
    def from_target(cls, target, config: MedusaConfig | None = None, *, draft_token_ids=None,
                    init_from_target: bool = True, **config_options) -> "MedusaHead":
        """Heads for ``target``; ``init_from_target``: every ``lm_head_i`` from the target's output rows."""
        config = config or MedusaConfig.for_target(
            target.config, draft_vocab_size=None if draft_token_ids is None else len(draft_token_ids), **config_options)
        head = cls(config)
        if draft_token_ids is not None:
            head.set_draft_vocab(draft_token_ids)
        if init_from_target:
            rows = target.get_output_embeddings().weight[head.draft_ids.cpu()]
            with torch.no_grad():
                for h in head.heads:
                    h[-1].weight.copy_(rows)
        return head.to(next(target.parameters()).device).eval()

    def forward(self, hidden: torch.Tensor, n_heads: int | None = None) -> torch.Tensor:
        """``h [..., H]`` -> draft-vocabulary logits of the first ``n_heads`` heads (all ``k`` when ``None``)
        ``[..., n_heads, Vd]``. Without gradients, in fp32 on the CPU, each product runs on SPADE's native
        kernel (:mod:`spade_lib.decoding.model.native`: every weight streamed once for all rows; the same function,
        fp32 summation order apart): drafting reads ~all of the heads' bytes per step, so a GEMV that streams
        them at the machine's bandwidth is what the head's cost ``c`` is made of."""
        if not torch.is_grad_enabled() and self._native():
            x0 = hidden.reshape(-1, hidden.shape[-1]).to(torch.float32).contiguous()
            packed = native.module_weights(self, self._packed)
            outs = []
            for h, (blocks, lm) in zip(self.heads[:n_heads], packed):
                x = x0
                for block, w in zip(h[:-1], blocks):
                    x = x + F.silu(native.linear(x, w, block.linear.bias, packed=True))
                outs.append(native.linear(x.contiguous(), lm, packed=True))
            return torch.stack(outs, dim=-2).reshape(*hidden.shape[:-1], len(outs), -1)
        return torch.stack([h(hidden) for h in self.heads[:n_heads]], dim=-2)

    def _packed(self) -> list:
        """Each head's ``([block weights], lm_head weight)`` as the native kernel reads them (:func:`native.pack`)."""
        with torch.inference_mode():
            return [([native.pack(b.linear.weight.contiguous()) for b in h[:-1]], native.pack(h[-1].weight.contiguous()))
                    for h in self.heads]

    def _native(self) -> bool:
        first = self.heads[0][-1].weight
        return first.device.type == "cpu" and first.dtype == torch.float32 and native.available()

    def chain_logits(self, features: torch.Tensor, next_tokens: torch.Tensor, depth: int, *,
                     own_tokens: bool = False) -> list[torch.Tensor]:
        """:class:`DraftHead`'s chain: head ``d`` on ``h^L_t`` (the heads never see the tokens, so
        ``next_tokens`` and ``own_tokens`` change nothing); ``depth`` is at most ``num_heads``."""
        if depth > self.config.num_heads:
            raise ValueError(f"depth: a Medusa head set with {self.config.num_heads} heads drafts at most that many")
        logits = self(features.to(self.d2t.device).float(), n_heads=depth)  # [T, depth, Vd]
        return [logits[:, i] for i in range(depth)]

    def drafter(self, **options) -> "MedusaDrafter":
        return MedusaDrafter(self, **options)

    def cost_step(self) -> "_MedusaStep":
        return _MedusaStep(self)


class _MedusaStep:
    """The heads' drafting step for the cost model (:meth:`DraftHead.cost_step`): one head (its ResBlocks and
    ``lm_head_0``) on the newest state; a step drafting ``g`` tokens runs ``g`` of them, so it costs ``g c``.
    The heads keep no context: ``prefill`` and ``crop`` only count positions."""

    def __init__(self, head: MedusaHead):
        self.head, self.length = head, 0

    def prefill(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        self.length = int(tokens.numel())

    def step(self, feature: torch.Tensor, token: torch.Tensor, position: int) -> torch.Tensor:
        return self.head(feature[-1], n_heads=1)  # [1, Vd]

    def crop(self, length: int) -> None:
        self.length = min(self.length, int(length))


class MedusaDrafter(Drafter):
    """One token per head from the target's last hidden state at the newest committed position (or the
    tree ``tree`` names over the heads' distributions)."""

    kind = HEAD_DRAFTER  # q over the target's vocabulary from its features: model shapes

    def __init__(self, head: MedusaHead, tree: TreeConfig | str | None = None):
        if not isinstance(head, MedusaHead):
            raise ValueError(f"head: expected a MedusaHead, got {type(head).__name__}")
        self.tree = _model_tree(tree)
        self.head = head.eval()
        self.hidden_layers = (int(head.config.feature_layer),)
        self.device = next(head.parameters()).device
        self.vocab_size = head.config.vocab_size
        self._h: torch.Tensor | None = None

    def reset(self, prompt_ids, vocab_size: int) -> None:
        if len(prompt_ids) == 0 if not isinstance(prompt_ids, torch.Tensor) else prompt_ids.numel() == 0:
            raise ValueError("prompt_ids: empty prompt")
        self.vocab_size = int(vocab_size)
        self._h = None

    def observe(self, view: TargetView) -> None:
        """Keep ``h^L`` at the newest committed position (the one whose target prediction is ``next_token``)."""
        if view.tokens.numel() == 0:
            return
        layer = self.hidden_layers[0]
        if layer not in view.hidden:
            raise ValueError(f"view: hidden lacks the target layer {layer} the Medusa heads read")
        self._h = view.hidden[layer][-1].to(self.device)

    @torch.inference_mode()
    def propose(self, max_gamma: int, policy: Policy, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft:
        """``x_i ~ q_i`` from head ``i``, ``i < min(max_gamma, k)`` (stop ``"heads"`` when ``k`` is the cap)."""
        g = min(int(max_gamma), self.head.config.num_heads)
        if not self.tree.is_chain:
            return self._propose_tree(g, sampling, generator)
        if self._h is None or g < 1:
            empty = torch.empty(0, dtype=torch.long, device=self.device)
            return Draft(empty, torch.empty(0, self.vocab_size, device=self.device), None,
                         "no_match" if self._h is None else "max_gamma")
        self._h, h = None, self._h  # a fresh state comes with the next observe
        logits = self.head.target_logits(self.head(h, n_heads=g), self.vocab_size)  # [g, V]: g heads run
        q = adjust(logits, sampling, validate=False)
        x = logits.argmax(dim=-1) if sampling.greedy else sample_categorical(q, generator)
        stop = "max_gamma" if g == max_gamma else "heads"
        if policy.needs_signals:
            for i in range(g - 1):
                if not policy.keep_drafting(*_signals(logits[i])):
                    g, stop = i + 1, "policy"
                    break
        return Draft(x[:g], q[:g], logits[:g], stop)

    def _propose_tree(self, max_depth: int, sampling: SamplingConfig, generator: torch.Generator | None):
        """:func:`grow_tree` over the heads: the logits after a node at depth ``d`` (0: a child of the root)
        are head ``d + 1``'s, read from the one forward of the heads."""
        if self._h is None or max_depth < 1:
            return empty_tree(self.device, "no_match" if self._h is None else "max_gamma")
        self._h, h = None, self._h
        logits = self.head.target_logits(self.head(h), self.vocab_size)  # [k, V]: head i at depth i
        tree, _ = grow_tree(self.tree, logits[0], lambda tokens, parents, depths: logits[[d + 1 for d in depths]],
                            sampling, generator, max_depth=max_depth)
        return tree

    def drafting_model(self) -> MedusaHead:
        """Its head: a drafting step is the head's (:meth:`MedusaHead.cost_step`)."""
        return self.head

    def accept(self, n_accepted: int, next_token: int) -> None:
        pass

    def accept_path(self, path: list[int], next_token: int) -> None:
        pass
