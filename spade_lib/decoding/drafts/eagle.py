"""EAGLE draft heads (Li et al. 2024, 2025): one decoder layer that drafts from the target's own hidden states.

Notation: ``x_t`` the token at position ``t``; ``h^l_t`` the target's hidden state, indexed like HF's
``output_hidden_states`` (``l = 0`` embeddings, ``0 < l < L`` output of layer ``l`` = the residual stream entering
``l + 1``, vLLM's ``eagle_aux_hidden_state_layer_ids = [l]``; ``l = L`` after the final norm); ``E`` the input
embedding, ``H`` the width, ``V`` the target's vocabulary, ``Vd <= V`` the head's (frequency-ranked, FR-Spec).
**EAGLE-3** (``variant="eagle3"``, training-time test; vLLM speculators' ``Eagle3DraftModel`` layout)::

    g_t = fc([h^{l1}_t ; h^{l2}_t ; h^{l3}_t])                  fc: 3H -> H (speculators' default l = 2, L // 2, L - 3)
    u   = [input_layernorm(E x_{t+1}) ; hidden_norm(g_t)]       2H: q/k/v of the one layer take 2H inputs
    a   = g_t + o_proj(Attn(u))                                  (residual = hidden_norm(g_t) if norm_before_residual)
    o_t = a + MLP(post_attention_layernorm(a))
    q(x_{t+2} | x_{<=t+1}) = softmax(lm_head(norm(o_t)))        over Vd; draft row j is target token j + d2t[j]

The next position feeds ``o_t`` (``norm(o_t)`` with ``norm_output``) in place of ``g``: ``gamma`` tokens are ``gamma``
one-layer forwards on the head's own KV cache; draft position ``t`` sits at RoPE position ``t + 1`` (speculators').
**Training-time test** (:meth:`EagleHead.unrolled`, ``k`` steps): step ``i > 0`` runs position ``t`` on step ``i - 1``'s
output with ``x_{t+1+i}``, attending to step-0 keys ``<= t`` plus steps ``1 .. i`` at ``t`` only (the cache of an
``i + 1``-token chain), predicts ``x_{t+2+i}``; loss ``sum_i 0.8^i CE_i`` (:func:`step_weights`). A Gemma-3 target
keeps this Llama layer (SiLU, no QK-norm) and embeds ``s E x``, ``s = sqrt(H)`` (``EagleConfig.embed_scale``, Llama 1).
**EAGLE-1** (``variant="eagle1"``): one feature, default ``h^L``, fed back through ``fc`` (``g = fc(o_t)``, ``o_t``
regressed onto ``h^L_{t+1}``, SmoothL1 beside the CE, :mod:`spade_lib.zoo.heads`), same 2H layer, no speculators format.
:class:`EagleDrafter` reads ``hidden_layers``, feeds observed features at the next ``propose``, drafts ``q_i =
adjust(logits)`` (``-inf`` off ``Vd``: lossless), crops its cache to the committed positions on ``accept``; ``tree=``:
one tree level per pass under the tree mask; :meth:`EagleDrafter.propose_tree`: the full top-``k`` tree as tensors.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from spade_lib.decoding.drafts.drafters import Draft, Drafter, HEAD_DRAFTER, TargetView, _model_tree, _signals, draw_token
from spade_lib.decoding.drafts.policies import Policy
from spade_lib.decoding.drafts.tree import DraftTree
from spade_lib.decoding.drafts.tree_drafting import TreeConfig, empty_tree, grow_tree
from spade_lib.decoding.model import native
from spade_lib.decoding.model.heads import DraftHead, config_from_dict
from spade_lib.decoding.model.masks import ancestor_mask, causal_additive
from spade_lib.sampling import SamplingConfig, adjust
from spade_lib.validate import ArgumentTypeError, check_bool, check_int

__all__ = ["EagleConfig", "EagleHead", "EagleDrafter", "NativeRunner", "default_feature_layers", "step_weights",
           "VARIANTS"]

VARIANTS = ("eagle3", "eagle1")
LLAMA_TYPES = ("llama", "spade_frspec_llama")  # targets whose own layer the head's layer copies
GEMMA_TYPES = ("gemma3_text", "gemma3")         # Gemma-3 targets: a Llama draft layer over their features
STEP_DECAY = 0.8  # weight of unrolled step i is STEP_DECAY ** i (EAGLE-3's training-time test)
EMBED_INIT_MAX = 1 << 26  # an EagleHead initialises its (to be tied) embedding only up to this many numbers

# LlamaConfig fields the decoder layer is built from (the rest of a target's config is irrelevant to it)
LAYER_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "hidden_act", "rms_norm_eps", "rope_parameters", "max_position_embeddings",
              "attention_bias", "attention_dropout", "mlp_bias", "pretraining_tp")


def default_feature_layers(n_layers: int, variant: str = "eagle3") -> tuple[int, ...]:
    """EAGLE-3: speculators' ``[2, L // 2, L - 3]`` (low, middle, high); EAGLE-1: ``(L,)``, the last state."""
    if variant == "eagle1":
        return (int(n_layers),)
    layers = (2, n_layers // 2, n_layers - 3)
    if len(set(layers)) != 3 or min(layers) < 0:
        raise ValueError(f"feature_layers: the default [2, L // 2, L - 3] = {list(layers)} is not three distinct "
                         f"layers for a target of L = {n_layers} layers; pass feature_layers explicitly")
    return layers


def step_weights(steps: int, decay: float = STEP_DECAY) -> list[float]:
    """Loss weights ``decay^i`` of the unrolled steps ``i = 0 .. steps - 1``."""
    return [decay ** i for i in range(steps)]


@dataclass
class EagleConfig:
    """What an EAGLE head is: its one decoder layer, the target layers it reads, its vocabulary."""

    layer: dict                            # LlamaConfig fields of the decoder layer (LAYER_KEYS); vocab_size = V
    feature_layers: tuple[int, ...]        # target hidden_states indices read (HF indexing, module docstring)
    draft_vocab_size: int                  # Vd: rows of lm_head (= V: the whole vocabulary)
    variant: str = "eagle3"                # "eagle3" or "eagle1" (module docstring)
    target_hidden_size: int | None = None  # width of the target's states if it differs from the layer's
    norm_before_residual: bool = False     # speculators' option: the residual is hidden_norm(g), not g
    norm_output: bool = False              # speculators' option (EAGLE 3.1): feed norm(o) back, not o
    target_layers: int | None = None       # L of the target the head was built for (checked when known)
    embed_scale: float = 1.0               # s: the head embeds s * E x, as the target does (Gemma-3: sqrt(H))
    meta: dict = field(default_factory=dict)  # free-form facts saved with the head (verifier, training)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant: must be one of {VARIANTS}, got {self.variant!r}")
        if not isinstance(self.layer, dict):
            raise ArgumentTypeError(f"layer: must be a dict of LlamaConfig fields, got {type(self.layer).__name__}")
        for key in ("vocab_size", "hidden_size", "num_attention_heads"):
            if key in self.layer:
                self.layer[key] = check_int(f"layer.{key}", self.layer[key], min=1)
        if isinstance(self.feature_layers, (str, bytes)) or not hasattr(self.feature_layers, "__iter__"):
            raise ArgumentTypeError(f"feature_layers: must be a list of layer indices, got {self.feature_layers!r}")
        self.feature_layers = tuple(check_int(f"feature_layers[{i}]", layer, min=0)
                                    for i, layer in enumerate(self.feature_layers))
        self.draft_vocab_size = check_int("draft_vocab_size", self.draft_vocab_size, min=1)
        if self.target_hidden_size is not None:
            self.target_hidden_size = check_int("target_hidden_size", self.target_hidden_size, min=1)
        if self.target_layers is not None:
            self.target_layers = check_int("target_layers", self.target_layers, min=1)
        self.norm_before_residual = check_bool("norm_before_residual", self.norm_before_residual)
        self.norm_output = check_bool("norm_output", self.norm_output)
        if not isinstance(self.meta, dict):
            raise ArgumentTypeError(f"meta: must be a dict, got {type(self.meta).__name__}")
        if not self.feature_layers or len(set(self.feature_layers)) != len(self.feature_layers) \
                or min(self.feature_layers) < 0:
            raise ValueError(f"feature_layers: need distinct non-negative layer indices, got {list(self.feature_layers)}")
        if self.target_layers is not None and max(self.feature_layers) > self.target_layers:
            raise ValueError(f"feature_layers: {list(self.feature_layers)} reach past the target's "
                             f"{self.target_layers} layers (hidden_states has indices 0 .. {self.target_layers})")
        if self.variant == "eagle1" and len(self.feature_layers) != 1:
            raise ValueError(f"feature_layers: the eagle1 variant reads one layer, got {list(self.feature_layers)}")
        missing = [k for k in ("vocab_size", "hidden_size", "num_attention_heads") if k not in self.layer]
        if missing:
            raise ValueError(f"layer: missing LlamaConfig fields {missing}")
        if not 0 < int(self.draft_vocab_size) <= int(self.layer["vocab_size"]):
            raise ValueError(f"draft_vocab_size: must lie in [1, vocab_size={self.layer['vocab_size']}], "
                             f"got {self.draft_vocab_size}")
        s = self.embed_scale
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise ValueError(f"embed_scale: must be a finite number > 0, got {self.embed_scale!r}")
        self.embed_scale = float(self.embed_scale)
        if self.variant == "eagle1" and self.feature_width != self.hidden_size:
            raise ValueError("target_hidden_size: the eagle1 variant feeds its output back through fc, so the "
                             f"target's width ({self.feature_width}) must equal the layer's ({self.hidden_size})")

    @property
    def vocab_size(self) -> int:
        return int(self.layer["vocab_size"])

    @property
    def hidden_size(self) -> int:
        return int(self.layer["hidden_size"])

    @property
    def feature_width(self) -> int:
        """Width of one target state: ``target_hidden_size`` or the layer's."""
        return int(self.target_hidden_size or self.hidden_size)

    def llama_config(self) -> LlamaConfig:
        """The one-layer ``LlamaConfig`` of the decoder layer (SDPA attention)."""
        config = LlamaConfig(**{**self.layer, "num_hidden_layers": 1, "tie_word_embeddings": False})
        config._attn_implementation = "sdpa"
        return config

    @classmethod
    def for_target(cls, target_config, *, variant: str = "eagle3", feature_layers=None,
                   draft_vocab_size: int | None = None, **options) -> "EagleConfig":
        """A head for a target of config ``target_config``: a Llama-type target's head is shaped like its own
        layers (speculators builds its layer from the verifier's config); a Gemma-3 target's keeps a Llama
        layer (SiLU MLP, no QK-norm, the global layers' RoPE) of the target's widths over its features, and
        embeds with its scale ``sqrt(H)`` (:attr:`EagleConfig.embed_scale`)."""
        tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        model_type = getattr(tc, "model_type", "llama")
        if model_type not in LLAMA_TYPES + GEMMA_TYPES:
            raise ValueError(f"target_config: EAGLE heads support Llama-type and Gemma-3 targets "
                             f"({LLAMA_TYPES + GEMMA_TYPES}), got model_type {model_type!r}")
        full = tc.to_dict()
        layer = {k: full[k] for k in LAYER_KEYS if k in full and full[k] is not None}
        layer.setdefault("head_dim", tc.hidden_size // tc.num_attention_heads)
        if model_type in GEMMA_TYPES:
            layer["hidden_act"] = "silu"  # the draft layer is a Llama layer (speculators fixes only the draft layer)
            rope = layer.get("rope_parameters") or {}
            if "full_attention" in rope:  # per layer type: the head attends globally
                layer["rope_parameters"] = dict(rope["full_attention"])
            options.setdefault("embed_scale", float(tc.hidden_size) ** 0.5)
        n = int(tc.num_hidden_layers)
        layers = default_feature_layers(n, variant) if feature_layers is None else tuple(feature_layers)
        vd = int(tc.vocab_size if draft_vocab_size is None else draft_vocab_size)
        return cls(layer=layer, feature_layers=layers, draft_vocab_size=vd, variant=variant, target_layers=n, **options)

    def to_dict(self) -> dict:
        return {"layer": dict(self.layer), "feature_layers": list(self.feature_layers),
                "draft_vocab_size": int(self.draft_vocab_size), "variant": self.variant,
                "target_hidden_size": self.target_hidden_size, "norm_before_residual": self.norm_before_residual,
                "norm_output": self.norm_output, "target_layers": self.target_layers, "embed_scale": self.embed_scale,
                "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, d: dict) -> "EagleConfig":
        return config_from_dict(cls, d, ("layer", "feature_layers", "draft_vocab_size"))


class EagleDecoderLayer(LlamaDecoderLayer):
    """A ``LlamaDecoderLayer`` whose q/k/v take ``[E x ; g]`` (2H) and whose residual is ``g`` (module docstring)."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False):
        super().__init__(config, layer_idx=0)
        h, d = config.hidden_size, config.head_dim
        bias = config.attention_bias
        self.norm_before_residual = norm_before_residual
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.self_attn.q_proj = nn.Linear(2 * h, config.num_attention_heads * d, bias=bias)
        self.self_attn.k_proj = nn.Linear(2 * h, config.num_key_value_heads * d, bias=bias)
        self.self_attn.v_proj = nn.Linear(2 * h, config.num_key_value_heads * d, bias=bias)

    def forward(self, embeds: torch.Tensor, g: torch.Tensor, position_embeddings, attention_mask=None,
                cache=None) -> torch.Tensor:
        """``embeds, g [B, m, H]`` -> ``o [B, m, H]`` (pre-norm)."""
        hidden = self.hidden_norm(g)
        residual = hidden if self.norm_before_residual else g
        u = torch.cat([self.input_layernorm(embeds), hidden], dim=-1)
        a, _ = self.self_attn(hidden_states=u, position_embeddings=position_embeddings,
                              attention_mask=attention_mask, cache=cache)
        a = residual + a
        return a + self.mlp(self.post_attention_layernorm(a))


class _HFRunner:
    """The head's drafting passes on its Hugging Face modules: :meth:`EagleHead.layer` over a ``DynamicCache``
    (every device and dtype). Rows are appended at cache slot :attr:`length`; see :class:`NativeRunner`."""

    def __init__(self, head: "EagleHead"):
        self.head, self.cache, self.device = head, DynamicCache(), next(head.parameters()).device

    @property
    def length(self) -> int:
        return int(self.cache.get_seq_length())

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return self.head.fuse(features)

    def feedback(self, o: torch.Tensor) -> torch.Tensor:
        return self.head.feedback(o)

    def draft_logits(self, o: torch.Tensor) -> torch.Tensor:
        return self.head.draft_logits(o)

    def feed(self, g: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, tree_from: int | None = None,
             ancestors: torch.Tensor | None = None) -> torch.Tensor:
        m, past = int(tokens.numel()), self.length
        if ancestors is None:
            mask = causal_additive(m, past, g.dtype, self.device)
        else:
            mask = torch.zeros(1, 1, m, past + m, dtype=g.dtype, device=self.device)
            mask[0, 0, :, tree_from:] = torch.where(ancestors, 0.0, float("-inf"))
        o = self.head.layer(g[None], tokens.reshape(1, m), positions.reshape(1, m), attention_mask=mask,
                            cache=self.cache)
        return o[0]

    def crop(self, length: int) -> None:
        extra = self.length - int(length)
        if extra > 0:
            self.cache.crop(-extra)


class NativeRunner:
    """The head's drafting passes on SPADE's native kernels (:mod:`spade_lib.decoding.model.native`), the same
    function as :class:`_HFRunner` (fp32 summation order apart): the head's own KV cache is one buffer
    ``[2, KV, capacity, hd]`` (rolling back is setting an integer), each product streams its weights once
    for all rows with the norms and residual adds fused in, and a pass is

    ``hidden = hidden_norm(g)``, ``u = [input_layernorm(E x) ; hidden]``, ``qkv = W_qkv u`` (query rows
    scaled by ``1 / sqrt(hd)``), ``att = attend(qkv)`` (rotation, cache write, causal or tree mask),
    ``a = residual + W_o att``, ``o = a + W_down (silu * up)(W_gu rmsnorm(a))`` (the post-attention gain folded
    into ``W_gu``); ``draft_logits(o) = W_lm rmsnorm(o)`` with the final norm's gain as the product's prologue.
    :meth:`usable` says where it runs (fp32 on the CPU, a SiLU MLP without bias, the native kernels built)."""

    def __init__(self, head: "EagleHead", capacity: int = 256):
        layer, lc = head.layers[0], head.layer_config
        self.head, self.device = head, next(head.parameters()).device
        self.n_heads, self.n_kv = int(lc.num_attention_heads), int(lc.num_key_value_heads)
        self.head_dim, self.hidden = int(lc.head_dim), int(lc.hidden_size)
        self.eps = float(lc.rms_norm_eps)
        w = native.module_weights(head, lambda: self._weights(head))
        self.w_qkv, self.b_qkv, self.w_o, self.b_o = w["qkv"], w["b_qkv"], w["o"], w["b_o"]
        self.w_gu, self.w_down, self.w_fc, self.w_lm = w["gu"], w["down"], w["fc"], w["lm"]
        self.g_in, self.g_hidden, self.g_norm = (layer.input_layernorm.weight, layer.hidden_norm.weight,
                                                 head.norm.weight)
        self.post_eps = float(layer.post_attention_layernorm.variance_epsilon)
        self.norm_before_residual = layer.norm_before_residual
        self.length, self._size = 0, 0
        self.kv = torch.empty(0)
        self._grow(capacity)

    @staticmethod
    def _weights(head: "EagleHead") -> dict:
        """The products' weights as the native kernel reads them (:func:`native.pack`), the query rows of
        ``W_qkv`` scaled by ``1 / sqrt(hd)`` and the post-attention gain folded into ``W_gu``."""
        layer, lc = head.layers[0], head.layer_config
        a, m = layer.self_attn, layer.mlp
        q_rows, scale = int(lc.num_attention_heads) * int(lc.head_dim), int(lc.head_dim) ** -0.5
        with torch.inference_mode():
            wqkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])  # a new tensor: scaled in place
            wqkv[:q_rows] *= scale
            b_qkv = None
            if a.q_proj.bias is not None:
                b_qkv = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
                b_qkv[:q_rows] *= scale
            gu = torch.cat([m.gate_proj.weight, m.up_proj.weight]) * layer.post_attention_layernorm.weight[None, :]
            return {"qkv": native.pack(wqkv), "b_qkv": b_qkv, "o": native.pack(a.o_proj.weight.contiguous()),
                    "b_o": None if a.o_proj.bias is None else a.o_proj.bias.contiguous(),
                    "gu": native.pack(gu), "down": native.pack(m.down_proj.weight.contiguous()),
                    "fc": native.pack(head.fc.weight.contiguous()),
                    "lm": native.pack(head.lm_head.weight.contiguous())}

    @staticmethod
    def usable(head: "EagleHead") -> bool:
        first = next(head.parameters())
        lc = head.layer_config
        return (first.device.type == "cpu" and first.dtype == torch.float32 and getattr(lc, "hidden_act", "silu") == "silu"
                and not getattr(lc, "mlp_bias", False) and head.fc.bias is None and native.available())

    def _grow(self, size: int) -> None:
        kv = torch.zeros(2, self.n_kv, size, self.head_dim)
        if self.length:
            kv[:, :, :self.length] = self.kv[:, :, :self.length]
        with torch.inference_mode():
            cos, sin = self.head.rotary_emb(self.w_o[:1][None], torch.arange(size + 1)[None])
        self.kv, self._cos, self._sin, self._size = kv, cos[0].contiguous(), sin[0].contiguous(), size

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return native.linear(features.to(torch.float32).contiguous(), self.w_fc, packed=True)

    def feedback(self, o: torch.Tensor) -> torch.Tensor:
        if self.head.config.variant == "eagle1":
            return native.linear(o.contiguous(), self.w_fc, packed=True)
        return F.rms_norm(o, (self.hidden,), self.g_norm, self.eps) if self.head.config.norm_output else o

    def draft_logits(self, o: torch.Tensor) -> torch.Tensor:
        return native.linear(o.contiguous(), self.w_lm, eps=self.eps, gain=self.g_norm, packed=True)

    def feed(self, g: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, tree_from: int | None = None,
             ancestors: torch.Tensor | None = None) -> torch.Tensor:
        """``g [m, H]``, ``tokens [m]`` (the token after each feature), ``positions [m]`` (RoPE positions) ->
        ``o [m, H]``; the rows go to cache slots ``length .. length + m - 1``; with ``ancestors [m, M]`` (a
        draft tree's rows from slot ``tree_from``) each row sees the slots before ``tree_from`` and its ancestors."""
        m, start = int(tokens.numel()), self.length
        if start + m > self._size:
            self._grow(max(2 * self._size, start + m))
        positions = positions.reshape(-1).cpu()
        hidden = F.rms_norm(g, (self.hidden,), self.g_hidden, self.eps)
        u = torch.cat([F.rms_norm(self.head.embed(tokens.reshape(-1)), (self.hidden,), self.g_in, self.eps), hidden],
                      dim=-1)
        qkv = native.linear(u, self.w_qkv, self.b_qkv, packed=True)
        att = native.attend(qkv, self.kv, start, self._cos[positions], self._sin[positions], self.n_heads,
                            tree_from, ancestors)
        a = native.linear(att, self.w_o, self.b_o, (hidden if self.norm_before_residual else g).contiguous(), packed=True)
        o = native.linear(native.linear(a, self.w_gu, eps=self.post_eps, packed=True), self.w_down, residual=a,
                          gated=True, packed=True)
        self.length = start + m
        return o

    def crop(self, length: int) -> None:
        self.length = min(self.length, int(length))


class EagleHead(DraftHead):
    """The EAGLE head: ``fc``, one :class:`EagleDecoderLayer` (``layers.0``), ``norm``, ``lm_head`` over the
    draft vocabulary, ``d2t``/``t2d`` maps, and the target's input embedding ``embed_tokens`` (shared with
    the target by :meth:`tie_embeddings`, never trained). Parameter names are speculators'."""

    kind = "eagle"
    config_class = EagleConfig
    tied = ("embed_tokens.weight",)

    def __init__(self, config: EagleConfig):
        super().__init__(config)
        lc = config.llama_config()
        self.layer_config = lc
        h, v, vd = config.hidden_size, config.vocab_size, config.draft_vocab_size
        # the target's input embedding, tied (tie_embeddings) or loaded: a real-size vocabulary's is never
        # drawn at random here (a Gemma-3 one is 168 M numbers); a small one is, as before
        init = None if v * h <= EMBED_INIT_MAX else torch.empty(v, h)
        self.embed_tokens = nn.Embedding(v, h, _weight=init)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(len(config.feature_layers) * config.feature_width, h, bias=False)
        self.layers = nn.ModuleList([EagleDecoderLayer(lc, config.norm_before_residual)])
        self.norm = LlamaRMSNorm(h, eps=lc.rms_norm_eps)
        self.lm_head = nn.Linear(h, vd, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(lc)
        # speculators' vocabulary maps: target id of draft row j = j + d2t[j] (DraftHead); t2d[v] marks v in it
        self.register_buffer("t2d", torch.zeros(v, dtype=torch.bool))
        self.t2d[:vd] = True
        self._init_weights()

    def _init_weights(self) -> None:
        std = float(getattr(self.layer_config, "initializer_range", 0.02))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    # -- what it reads, vocabulary, embeddings, initialisation -----------------------------------------
    @property
    def feature_layers(self) -> tuple[int, ...]:
        return tuple(self.config.feature_layers)

    @property
    def in_features(self) -> int:
        return self.fc.in_features

    @property
    def variant(self) -> str:
        return self.config.variant

    def _set_draft_ids(self, ids: torch.Tensor) -> None:
        """``d2t`` and ``draft_ids`` (:class:`DraftHead`), and ``t2d`` marking the same target ids."""
        super()._set_draft_ids(ids)
        mask = torch.zeros(self.config.vocab_size, dtype=torch.bool)
        mask[ids.cpu()] = True
        self.t2d.copy_(mask.to(self.t2d.device))

    def set_vocab_maps(self, d2t: torch.Tensor, t2d: torch.Tensor | None) -> None:
        """Load speculators' ``d2t`` (offsets) and ``t2d`` (mask; rebuilt from ``d2t`` when ``None``, checked otherwise)."""
        vd, v = self.config.draft_vocab_size, self.config.vocab_size
        d2t = torch.as_tensor(d2t)
        if d2t.is_floating_point() or d2t.is_complex() or d2t.dtype == torch.bool:
            raise ArgumentTypeError(f"d2t: must hold integer offsets, got {d2t.dtype} (a float map would be truncated)")
        if t2d is not None:
            t2d = torch.as_tensor(t2d)
            if t2d.is_floating_point() or t2d.is_complex() or (t2d.dtype != torch.bool and bool(((t2d != 0) & (t2d != 1)).any())):
                raise ArgumentTypeError(f"t2d: must be a boolean mask over the target's ids, got {t2d.dtype} values")
        d2t = d2t.to(torch.long).flatten()
        if d2t.numel() != vd:
            raise ValueError(f"d2t: need {vd} entries (draft_vocab_size), got {d2t.numel()}")
        ids = torch.arange(vd) + d2t.cpu()
        if ids.min() < 0 or ids.max() >= v or ids.unique().numel() != vd:
            raise ValueError(f"d2t: draft ids + d2t must be {vd} distinct target ids in [0, {v})")
        mask = torch.zeros(v, dtype=torch.bool)
        mask[ids] = True
        if t2d is not None and not torch.equal(torch.as_tensor(t2d, dtype=torch.bool).flatten().cpu(), mask):
            raise ValueError("t2d: does not mark exactly the target ids that d2t maps the draft rows to")
        self._set_draft_ids(ids)

    def tie_embeddings(self, embedding: nn.Embedding) -> None:
        """Use the target's input embedding (the same tensor, not a copy)."""
        if tuple(embedding.weight.shape) != (self.config.vocab_size, self.config.hidden_size):
            raise ValueError(f"embedding: expected [{self.config.vocab_size}, {self.config.hidden_size}], got "
                             f"{list(embedding.weight.shape)}")
        self.embed_tokens.weight = embedding.weight

    def tie_to_target(self, target) -> None:
        """:meth:`tie_embeddings` to ``target``'s input embedding."""
        self.tie_embeddings(target.get_input_embeddings())

    @classmethod
    def from_target(cls, target, config: EagleConfig | None = None, *, draft_token_ids=None,
                    init_from_target: bool = True, **config_options) -> "EagleHead":
        """A head for ``target`` (a Llama or Gemma-3 causal LM, :meth:`EagleConfig.for_target`) with its embeddings
        tied; ``init_from_target``: the layer from the target's last layer (both halves of q/k/v ``W / 2``), ``norm``
        from its final norm and the head from its output rows of the draft vocabulary (``draft_token_ids``; all
        ``V`` when ``None``). A Gemma-3 layer gives what a Llama layer has: its projections, its pre-norms'
        gains ``1 + w`` (``post_attention_layernorm`` from its pre-MLP norm); its QK- and post-norms have no
        place in the draft layer."""
        if config is None:
            config = EagleConfig.for_target(
                target.config, draft_vocab_size=None if draft_token_ids is None else len(draft_token_ids),
                **config_options)
            config.meta.setdefault("verifier_architectures", [type(target).__name__])  # its speculators folder's
        head = cls(config)
        head.tie_embeddings(target.get_input_embeddings())
        if draft_token_ids is not None:
            head.set_draft_vocab(draft_token_ids)
        if init_from_target:
            src = target.model.layers[-1]
            dst = head.layers[0]
            gemma = hasattr(src, "pre_feedforward_layernorm")

            def gain(norm: nn.Module) -> torch.Tensor:  # Gemma's RMSNorm multiplies by 1 + w, Llama's by w
                return 1.0 + norm.weight if gemma else norm.weight

            with torch.no_grad():
                for name in ("q_proj", "k_proj", "v_proj"):
                    w = getattr(src.self_attn, name).weight
                    getattr(dst.self_attn, name).weight.copy_(torch.cat([w, w], dim=1) / 2)
                dst.self_attn.o_proj.load_state_dict(src.self_attn.o_proj.state_dict())
                if gemma:  # (its MLP is GELU: the weights only start the SiLU one)
                    for name in ("gate_proj", "up_proj", "down_proj"):
                        getattr(dst.mlp, name).weight.copy_(getattr(src.mlp, name).weight)
                else:
                    dst.mlp.load_state_dict(src.mlp.state_dict())
                dst.input_layernorm.weight.copy_(gain(src.input_layernorm))
                dst.post_attention_layernorm.weight.copy_(
                    gain(src.pre_feedforward_layernorm if gemma else src.post_attention_layernorm))
                dst.hidden_norm.weight.copy_(gain(src.input_layernorm))
                head.norm.weight.copy_(gain(target.model.norm))
                head.lm_head.weight.copy_(target.get_output_embeddings().weight[head.draft_ids.cpu()])
        return head.to(next(target.parameters()).device).eval()

    # -- the math -----------------------------------------------------------------------------------------
    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """``g = fc(features)``: ``[..., k H_target] -> [..., H]``."""
        return self.fc(features.to(self.fc.weight.dtype))

    def feedback(self, o: torch.Tensor) -> torch.Tensor:
        """The ``g`` of the next draft position from this one's output: ``o`` (``norm(o)`` with
        ``norm_output``) for EAGLE-3, ``fc(o)`` for the EAGLE-1 variant."""
        if self.config.variant == "eagle1":
            return self.fc(o)
        return self.norm(o) if self.config.norm_output else o

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """``s E x``: the target's input embedding of ``tokens`` times its scale ``s`` (``embed_scale``;
        Gemma-3 multiplies by ``sqrt(H)`` in the model's dtype, and so does this)."""
        e = self.embed_tokens(tokens)
        s = self.config.embed_scale
        return e if s == 1.0 else e * torch.tensor(s, dtype=e.dtype, device=e.device)

    def layer(self, g: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, attention_mask=None,
              cache=None) -> torch.Tensor:
        """One pass of the decoder layer: ``g [B, m, H]``, ``tokens [B, m]`` (the token after each
        feature), ``positions [B, m]`` -> ``o [B, m, H]``; appends the keys/values to ``cache``."""
        pe = self.rotary_emb(g, positions)
        return self.layers[0](self.embed(tokens), g, pe, attention_mask=attention_mask, cache=cache)

    def draft_logits(self, o: torch.Tensor) -> torch.Tensor:
        """``lm_head(norm(o))`` over the draft vocabulary: ``[..., Vd]``."""
        return self.lm_head(self.norm(o))

    def unrolled(self, features: torch.Tensor, tokens: torch.Tensor, steps: int = 3, *,
                 own_tokens: bool = False) -> tuple[list, list]:
        """The training-time test (module docstring) over right-padded batches.

        ``features [B, T, k H]`` at positions ``0 .. T-1``; ``tokens [B, T + steps - 1]`` with
        ``tokens[:, t] = x_{t+1}`` (pad past the end: those rows are never valid targets). Returns
        ``(logits, outputs)``: per step ``i``, ``[B, T, Vd]`` logits at ``t`` predicting ``x_{t+2+i}`` and the
        ``[B, T, H]`` outputs ``o``.

        ``own_tokens``: step ``i > 0`` at ``t`` is fed the head's own greedy token of step ``i - 1`` there
        (argmax over ``Vd``, as a greedy drafting chain after position ``t``) instead of the true
        ``x_{t+1+i}``; ``tokens`` then needs only its first ``T`` columns (``x_{t+1}``)."""
        if steps < 1:
            raise ValueError(f"steps: must be >= 1, got {steps}")
        b, t = features.shape[:2]
        need = t if own_tokens else t + steps - 1
        if tokens.shape[1] < need:
            raise ValueError(f"tokens: need {need} columns ({'T' if own_tokens else 'T + steps - 1'}), "
                             f"got {tokens.shape[1]}")
        cache = DynamicCache()
        g = self.fuse(features)
        dtype, dev = g.dtype, g.device
        ar = torch.arange(t, device=dev)
        causal = torch.zeros(t, t, dtype=dtype, device=dev).masked_fill(ar[None, :] > ar[:, None], float("-inf"))
        diag = torch.full((t, t), float("-inf"), dtype=dtype, device=dev).fill_diagonal_(0.0)
        positions = (ar + 1)[None].expand(b, t)
        all_logits, outputs = [], []
        for i in range(steps):
            mask = torch.cat([causal] + [diag] * i, dim=1)[None, None]
            fed = self.draft_ids[all_logits[-1].argmax(-1)] if own_tokens and i else tokens[:, i:i + t]
            o = self.layer(g, fed, positions + i, attention_mask=mask, cache=cache)
            all_logits.append(self.draft_logits(o))
            outputs.append(o)
            g = self.feedback(o)
        return all_logits, outputs

    def chain_logits(self, features: torch.Tensor, next_tokens: torch.Tensor, depth: int, *,
                     own_tokens: bool = False) -> list[torch.Tensor]:
        """:class:`DraftHead`'s chain: :meth:`unrolled` for ``depth`` steps on one sequence (true tokens
        ``x_{t+1+d}`` padded past its end, or the head's own with ``own_tokens``)."""
        dev = self.d2t.device
        tokens = next_tokens if own_tokens else F.pad(next_tokens, (0, depth - 1))
        logits, _ = self.unrolled(features[None].to(dev), tokens[None].to(dev), steps=depth, own_tokens=own_tokens)
        return [lg[0] for lg in logits]

    def drafter(self, **options) -> "EagleDrafter":
        return EagleDrafter(self, **options)

    def cost_step(self) -> "_EagleStep":
        return _EagleStep(self)

    def runner(self) -> "NativeRunner | _HFRunner":
        """The engine of its drafting passes, with its own KV cache: :class:`NativeRunner` where it runs (fp32
        on the CPU with SPADE's native kernels), else the Hugging Face modules (:class:`_HFRunner`)."""
        return NativeRunner(self) if NativeRunner.usable(self) else _HFRunner(self)


class _EagleStep:
    """The head's drafting step for the cost model (:meth:`DraftHead.cost_step`) on the engine the drafter
    runs (:meth:`EagleHead.runner`): ``fc`` of the fresh feature, one layer pass at the next position on the
    head's KV cache of the prefilled positions, ``lm_head``."""

    def __init__(self, head: EagleHead):
        self._run, self.device = head.runner(), next(head.parameters()).device

    @property
    def length(self) -> int:
        return self._run.length

    def prefill(self, features: torch.Tensor, tokens: torch.Tensor) -> None:
        n = int(tokens.numel())
        self._run.feed(self._run.fuse(features), tokens.reshape(n).to(self.device),
                       torch.arange(1, n + 1, device=self.device))

    def step(self, feature: torch.Tensor, token: torch.Tensor, position: int) -> torch.Tensor:
        o = self._run.feed(self._run.fuse(feature), token.reshape(-1)[:1].to(self.device),
                           torch.tensor([position], device=self.device))
        return self._run.draft_logits(o)

    def crop(self, length: int) -> None:
        self._run.crop(length)


class EagleDrafter(Drafter):
    """Drafts a chain (or the tree ``tree`` names) with an :class:`EagleHead` from the target's hidden
    states (module docstring)."""

    kind = HEAD_DRAFTER  # q over the target's vocabulary from its features: model shapes

    def __init__(self, head: EagleHead, tree: TreeConfig | str | None = None):
        if not isinstance(head, EagleHead):
            raise ValueError(f"head: expected an EagleHead, got {type(head).__name__}")
        self.tree = _model_tree(tree)
        self.head = head.eval()
        self.hidden_layers = tuple(head.config.feature_layers)
        self.device = next(head.parameters()).device
        self.vocab_size = head.config.vocab_size
        self._reset_state()

    def _reset_state(self) -> None:
        self._run = self.head.runner()            # the head's passes and its own KV cache
        self._committed = 0                       # draft positions whose keys/values are in the cache
        self._feats: list[torch.Tensor] = []      # pending [n, k H] features of committed positions ...
        self._toks: list[torch.Tensor] = []       # ... and the token after each ([n] long)
        self._next_position = 0                   # absolute position of the next observed token
        self._tokens: torch.Tensor | None = None

    def reset(self, prompt_ids, vocab_size: int) -> None:
        if len(prompt_ids) == 0 if not isinstance(prompt_ids, torch.Tensor) else prompt_ids.numel() == 0:
            raise ValueError("prompt_ids: empty prompt")
        self.vocab_size = int(vocab_size)
        self._reset_state()

    def observe(self, view: TargetView) -> None:
        """Keep the features of the committed positions and pair each with the token after it."""
        n = int(view.tokens.numel())
        if view.start != self._next_position:
            raise ValueError(f"view: starts at position {view.start}, expected {self._next_position} "
                             "(every committed position must be observed once, in order)")
        self._next_position += n
        if n == 0:
            return
        feats = self.head.features({k: v.to(self.device) for k, v in view.hidden.items()})
        nxt = torch.tensor([int(view.next_token)], dtype=torch.long, device=self.device)
        self._feats.append(feats.reshape(n, -1))
        self._toks.append(torch.cat([view.tokens.to(self.device, torch.long).flatten()[1:], nxt]))

    def _feed_pending(self) -> torch.Tensor | None:
        """Feed the pending committed positions into the cache; the output at the last one ``[1, 1, H]``."""
        if not self._feats:
            return None
        feats, toks = torch.cat(self._feats), torch.cat(self._toks)
        self._feats, self._toks = [], []
        m = int(toks.shape[0])
        positions = torch.arange(self._committed + 1, self._committed + 1 + m, device=self.device)
        o = self._run.feed(self._run.fuse(feats), toks, positions)
        self._committed += m
        return o[-1:]

    def _step(self, o: torch.Tensor, token: torch.Tensor, position: int) -> torch.Tensor:
        """One drafted position: ``(feedback(o), token)`` at ``position`` -> the next ``o [1, H]``."""
        pos = torch.tensor([position], device=self.device)
        return self._run.feed(self._run.feedback(o), token.reshape(1), pos)

    @torch.inference_mode()
    def propose(self, max_gamma: int, policy: Policy, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft:
        """Draft up to ``max_gamma`` tokens autoregressively over the head's own features (with a tree:
        the tree, at most ``max_gamma`` deep)."""
        if not self.tree.is_chain:
            return self._grow(self.tree, max_gamma, sampling, generator)
        o = self._feed_pending()
        if o is None or max_gamma < 1:
            self._tokens = torch.empty(0, dtype=torch.long, device=self.device)
            return Draft(self._tokens, torch.empty(0, self.vocab_size, device=self.device), None,
                         "no_match" if o is None else "max_gamma")
        tokens, logits_rows, qs = [], [], []
        stop = "max_gamma"
        for i in range(max_gamma):
            logits = self.head.target_logits(self._run.draft_logits(o), self.vocab_size)  # [1, V]
            x, q = draw_token(logits, sampling, generator)
            if q is not None:
                qs.append(q)
            tokens.append(x)
            logits_rows.append(logits)
            if i + 1 == max_gamma:
                break
            if policy.needs_signals and not policy.keep_drafting(*_signals(logits)):
                stop = "policy"
                break
            o = self._step(o, x, self._committed + 1 + i)
        self._tokens = torch.cat(tokens)
        logits = torch.cat(logits_rows)
        q = adjust(logits, sampling, validate=False) if sampling.greedy else torch.cat(qs)
        return Draft(self._tokens, q, logits, stop)

    def _grow(self, tree: TreeConfig, max_depth: int, sampling: SamplingConfig,
              generator: torch.Generator | None) -> DraftTree:
        """:func:`grow_tree` on the head: the root is the output at the last committed position; a level's
        nodes are one :meth:`EagleHead.layer` pass, node ``i`` fed ``(feedback(o at its parent), x_i)`` at
        position ``committed + 1 + depth[i]`` and seeing the committed positions and its ancestors."""
        o = self._feed_pending()
        if o is None:
            return empty_tree(self.device, "no_match")
        base, v = self._committed, self.vocab_size
        outs: list[torch.Tensor] = []  # o [1, H] of each fed tree row

        def feed(tokens: list[int], parents: list[int], depths: list[int]) -> torch.Tensor:
            n = len(tokens)
            g = self._run.feedback(torch.cat([o if p < 0 else outs[p] for p in parents[-n:]]))
            anc = ancestor_mask(torch.tensor(parents, dtype=torch.long, device=self.device))[-n:]  # [n, m]
            pos = torch.tensor([base + 1 + d for d in depths], device=self.device)
            toks = torch.tensor(tokens, dtype=torch.long, device=self.device)
            out = self._run.feed(g, toks, pos, tree_from=base, ancestors=anc.contiguous())  # [n, H]
            outs.extend(out[j:j + 1] for j in range(n))
            return self.head.target_logits(self._run.draft_logits(out), v)

        root = self.head.target_logits(self._run.draft_logits(o)[-1], v)
        self._tokens = torch.empty(0, dtype=torch.long, device=self.device)
        return grow_tree(tree, root, feed, sampling, generator, max_depth=max_depth)[0]

    @torch.inference_mode()
    def propose_tree(self, depth: int, top_k: int, sampling: SamplingConfig) -> dict[str, torch.Tensor]:
        """A draft tree as plain tensors: every node of depth ``d < depth`` gets the ``top_k`` most likely
        tokens of its ``q`` as children (``top_k ** depth`` leaves at most; keep ``top_k`` small): the
        static tree of every rank path, grown one level per pass (:meth:`_grow`).

        Returns ``tokens [N]``, ``parents [N]`` (index of the parent node, ``-1`` for the root's children;
        parents come before children), ``depth [N]`` (0 for the root's children) and ``q [N, V]``, the
        adjusted distribution each node was drafted from (the same for siblings)."""
        if depth < 1 or top_k < 1:
            raise ValueError(f"depth/top_k: must be >= 1, got {depth}, {top_k}")
        choices = [c for d in range(1, depth + 1) for c in itertools.product(range(top_k), repeat=d)]
        tree = self._grow(TreeConfig(shape="static", choices=choices, depth=depth), depth, sampling, None)
        q = adjust(tree.logits, sampling, validate=False) if tree.gamma else torch.empty(0, self.vocab_size,
                                                                                        device=self.device)
        return {"tokens": tree.tokens, "parents": tree.parents, "depth": tree.depth, "q": q}

    def accept_path(self, path: list[int], next_token: int) -> None:
        """After a tree: drop every drafted position (the committed ones come back through ``observe``)."""
        self.accept(len(path), next_token)

    def drafting_model(self) -> EagleHead:
        """Its head: a drafting step is the head's (:meth:`EagleHead.cost_step`)."""
        return self.head

    def accept(self, n_accepted: int, next_token: int) -> None:
        """Drop the drafted positions from the cache (the committed ones come back through ``observe``)."""
        self._run.crop(self._committed)
        self._tokens = None
