"""A lean decoding forward for Llama-family and Gemma-3 models, with a preallocated KV cache.

:class:`LeanForward` computes a Hugging Face model's function with its own weights and none of its per-call work:

- per layer ``h = x + W_o attn(rope(W_q n), rope(W_k n), W_v n)``, ``n = rmsnorm(x)``, then ``x' = h + W_down
  (silu(W_gate m) * W_up m)``, ``m = rmsnorm(h)``; ``W_q, W_k, W_v`` fused into one matrix, ``W_gate, W_up`` into one:
  copies with the norm gains and attention scale folded in, or (in place) the module's weights made row blocks of
  one tensor, the gains applied by the products; rotary ``cos``/``sin`` computed once per position and indexed;
- KV cache: one buffer per layer ``[2, kv_heads, capacity, head_dim]``, written in place; rollback sets an integer;
- attention ``softmax(q K^T / sqrt(d) + mask) V``, two batched matmuls over the first ``length + k`` positions: no
  mask for one token, causal ``j <= length + i`` for ``k > 1``, or a draft tree's (row ``i``: the cache and its path, at
  position ``length + depth[i]``; :mod:`spade_lib.decoding.drafts.tree`); ``keep`` copies an accepted path's keys/values down;
  one new token takes as few kernel calls as the math allows (rotation, cache write and attention one call where
  :mod:`spade_lib.decoding.model.native` builds); final norm and LM head on the last position only when that suffices;
- projections on the linear kernel :mod:`spade_lib.decoding.model.kernels` timed fastest here, for one row and
  ``k > 1`` rows apart (``kernels=`` forces one); bf16 or int8 weights (a draft in fewer bytes, :mod:`spade_lib.zoo.narrow`;
  activations and sums fp32) on the native kernel, which widens them exactly; an FR-Spec draft scatters its
  ``head_vocab`` logits into ``-inf`` full-vocabulary rows (:class:`spade_lib.zoo.frspec.FRSpecLlamaForCausalLM`).

Gemma-3: embedding times ``sqrt(d)``; RMSNorm gain ``1 + w``; ``h = x + norm_2(W_o attn(..))``, ``x' = h +
norm_4(W_down (gelu_tanh(W_gate m) * W_up m))``, ``n = norm_1(x)``, ``m = norm_3(h)``; per-head QK-norm before rotation
(``query_pre_attn_scalar^-1/2`` folded in); local and global rotary tables; sliding layers see ``> p - window`` only.
Logits equal Hugging Face's to float rounding (fp32: ~1e-6). :func:`lean_forward` returns ``None`` for a model it does
not cover (other architectures, ``device_map``, Qwen2/Mistral sliding windows, length-dependent RoPE, Llama QK-norm, MLP
bias, ...) and checks each model against one Hugging Face forward, falling back to it on any disagreement.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings

import torch
import torch.nn.functional as F
from filelock import FileLock

from spade_lib import devices, paths
from spade_lib.decoding.model import kernels as _kernels
from spade_lib.decoding.model import masks
from spade_lib.decoding.model import native as _native
from spade_lib.decoding.model.heads import scatter_vocab
from spade_lib.io import write_json

__all__ = ["LeanForward", "lean_forward", "prepare", "SUPPORTED"]

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "FRSpecLlamaForCausalLM",
             "Gemma3ForCausalLM")
_LAYER_TYPES = {"llama": ("full_attention",), "gemma3": ("full_attention", "sliding_attention")}
_ACTIVATIONS = {"llama": "silu", "gemma3": "gelu_pytorch_tanh"}
_STATIC_ROPE = ("default", "linear", "llama3")
_COPY_MAX_PARAMS = 200_000_000  # layers above this hold their weights once whatever SPADE_WEIGHTS_ONCE says
NARROW_DTYPES = (torch.bfloat16, torch.int8)  # weight dtypes read by the native kernel beside fp32 activations
BULK_ROWS = 32  # an in-place forward of this many rows or more (a prompt's prefill) runs on MKL's SGEMM
PREFILL_ATTR = "spade_prefill"  # a draft model's prefill precision ("bf16" where prepare(draft=True) found it faster)
DRAFT_PREFILL = ("fp32", "auto")  # SPADE_DRAFT_PREFILL: drafts prefill in fp32 (default), or bf16 where timed faster


def _family(model: torch.nn.Module) -> str:
    """``"gemma3"`` for Gemma-3, else ``"llama"`` (Llama, Qwen2, Mistral, FR-Spec: the same layer)."""
    return "gemma3" if type(model).__name__ == "Gemma3ForCausalLM" else "llama"


def _rope_types(cfg) -> dict[str, str]:
    """``{layer type: rope type}``; Gemma-3's ``rope_parameters`` hold one entry per layer type."""
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if not isinstance(rope, dict):
        return {"full_attention": "default"}
    if rope and all(isinstance(v, dict) for v in rope.values()):
        return {t: v.get("rope_type", v.get("type", "default")) for t, v in rope.items()}
    return {"full_attention": rope.get("rope_type", rope.get("type", "default"))}


def _unsupported(model: torch.nn.Module) -> str | None:
    """Why :class:`LeanForward` cannot run ``model`` (``None`` when it can)."""
    name = type(model).__name__
    if name not in SUPPORTED:
        return f"architecture {name}"
    if getattr(model, "hf_device_map", None):
        return "a device_map (accelerate places, offloads and moves the weights)"
    cfg = model.config
    family = _family(model)
    act = getattr(cfg, "hidden_activation", None) if family == "gemma3" else getattr(cfg, "hidden_act", "silu")
    if act != _ACTIVATIONS[family]:
        return f"hidden activation {act!r}"
    if family == "gemma3" and getattr(cfg, "attn_logit_softcapping", None) is not None:
        return "attention logit soft-capping"
    if family == "gemma3" and getattr(cfg, "use_bidirectional_attention", False):
        return "bidirectional attention"
    if getattr(cfg, "mlp_bias", False):
        return "mlp_bias"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp"
    if name == "Qwen2ForCausalLM" and getattr(cfg, "use_sliding_window", False):
        return "sliding window"
    if name == "MistralForCausalLM" and getattr(cfg, "sliding_window", None) is not None:
        return "sliding window"
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types and any(t not in _LAYER_TYPES[family] for t in layer_types):
        return f"layer types {sorted(set(layer_types))}"
    bad = sorted(r for r in _rope_types(cfg).values() if r not in _STATIC_ROPE)
    if bad:
        return f"rope_type {bad[0]!r}"
    attn = model.model.layers[0].self_attn
    if family == "llama" and any(hasattr(attn, n) for n in ("q_norm", "k_norm")):
        return "QK-norm"
    stored, dtype = _weight_dtype(model), model.model.embed_tokens.weight.dtype
    if stored is None:
        return "linear weights of more than one dtype"
    if stored != dtype and not (stored in NARROW_DTYPES and dtype == torch.float32 and family == "llama"
                                and model.model.embed_tokens.weight.device.type == "cpu" and _native.available()):
        return (f"{stored} weights with {dtype} activations (bf16 and int8 weights run on SPADE's native kernels "
                "only: fp32 activations, Llama family, CPU)")
    return None


def _weight_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The one dtype the layers' and head's linear weights are stored in (``None`` if they mix dtypes): the
    activations' (the embedding's), or one of :data:`NARROW_DTYPES` for a draft held in fewer bytes
    (:func:`spade_lib.zoo.narrow.narrow_twin`: every product widens them exactly, int8 with a scale per row)."""
    found = {m.weight.dtype for m in (*model.model.layers.modules(), model.lm_head) if isinstance(m, torch.nn.Linear)}
    return found.pop() if len(found) == 1 else None


class LeanForward:
    """The decoding forward of a Llama-family ``model`` with its own KV cache (batch size 1).

    ``capacity`` is the context limit (positions); the buffers start small and double up to it.
    ``kernels``: ``"auto"`` (for one row and for many, the candidate whose whole forward is fastest
    here: :mod:`spade_lib.decoding.model.kernels`), ``"legacy"`` (the rule before timing) or one candidate
    for every product (``"mkl"`` is plain ``F.linear``); ``None`` reads ``SPADE_LINEAR_KERNELS``
    (default ``"auto"``). ``self.kernel_names`` says what was installed: ``{"one": ..., "many": ...}`` (a
    candidate, or ``"product=candidate,..."``), ``self.kernel_plan`` the candidate of every product;
    ``self.native_attention`` whether the forward runs on SPADE's native kernels' attention
    (:meth:`_forward_native`, every row count: the products on whatever the plan chose).

    ``in_place`` (default: yes, unless ``SPADE_WEIGHTS_ONCE=0`` or ``kernels`` forces a copying kernel, for
    layers of at most 200 M parameters; larger ones always) holds the weights once: no
    copies (q/k/v and gate/up joined by making the module's weights row blocks of one tensor, the norm gains
    applied by the products, nothing folded), every product on a kernel that reads those tensors
    (``kernels.IN_PLACE``), a block of :data:`BULK_ROWS` rows or more (a prefill) on MKL's SGEMM; the Hugging
    Face module keeps working on the same tensors. A model whose matrices are stored narrow (``weight_dtype`` bf16
    or int8 with a scale per row, :mod:`spade_lib.zoo.narrow`) always runs so, on ``"native_rows"`` (one and many
    rows) and widened SGEMM (a prefill): ``kernels`` other than ``"auto"``/``"native_rows"`` or ``in_place=False``
    are refused.
    """

    def __init__(self, model: torch.nn.Module, capacity: int, *, fuse: bool | None = None,
                 kernels: str | None = None, in_place: bool | None = None):
        why = _unsupported(model)
        if why is not None:
            raise ValueError(f"model: the lean forward does not cover {why}")
        if capacity < 1:
            raise ValueError(f"capacity: must be >= 1, got {capacity}")
        cfg = model.config
        first = model.model.embed_tokens.weight
        self.device, self.dtype = first.device, first.dtype
        self.weight_dtype = _weight_dtype(model)  # the activations' dtype, or bf16 / int8 (a draft in fewer bytes)
        widened = self.weight_dtype != self.dtype
        self.capacity = int(capacity)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads)
        self.gqa = self.n_kv != self.n_heads
        inner = model.model
        # the linear kernels (spade_lib.decoding.model.kernels): timed on the whole forward, or as forced
        policy = kernels if kernels is not None else os.environ.get("SPADE_LINEAR_KERNELS", "auto")
        if policy not in _kernels.POLICIES:
            raise ValueError(f"kernels: must be one of {list(_kernels.POLICIES)}, got {policy!r}")
        if widened:  # narrow weights: read in place by the native kernel, a prefill widened for SGEMM
            if in_place is False or kernels not in (None, "auto", "native_rows"):
                raise ValueError(f"kernels, in_place: {self.weight_dtype} weights run in place on 'native_rows' only")
            policy, in_place = "native_rows", True
        if in_place is None:  # weights held once (the products read the module's tensors) unless asked otherwise
            once = os.environ.get("SPADE_WEIGHTS_ONCE", "1")
            if once not in ("0", "1"):
                raise ValueError(f"SPADE_WEIGHTS_ONCE: must be '0' or '1', got {once!r}")
            copies = policy not in ("auto", *_kernels.IN_PLACE)  # a forced kernel that reads a copy of the weights
            large = sum(p.numel() for p in inner.layers.parameters()) > _COPY_MAX_PARAMS
            in_place = large or (once == "1" and not copies)
        self.in_place = bool(in_place)
        # a prefill's precision: "bf16" only on a draft that prepare(draft=True) timed faster so (never a target's:
        # its logits are the output distribution); read by the bulk kernel of an in-place forward
        self.prefill = getattr(model, PREFILL_ATTR, "fp32")
        if self.prefill not in _kernels.PREFILLS:
            raise ValueError(f"model.{PREFILL_ATTR}: must be one of {list(_kernels.PREFILLS)}, got {self.prefill!r}")
        if self.prefill == "bf16" and (self.dtype != torch.float32 or self.device.type != "cpu"):
            raise ValueError(f"model.{PREFILL_ATTR}: 'bf16' rounds an fp32 model's prefill on CPU, not a "
                             f"{self.dtype} model on {self.device}")
        if fuse is None:  # q/k/v into one product, gate/up into one: copies, or (in place) the module's own rows
            fuse = True
        self.family = _family(model)
        gemma = self.family == "gemma3"
        self.embed = inner.embed_tokens.weight
        # Gemma-3 scales the embedding by sqrt(d) (a buffer in the model's dtype, as its forward multiplies)
        self.embed_scale = inner.embed_tokens.embed_scale.to(self.dtype) if gemma else None
        self.softcap = getattr(cfg, "final_logit_softcapping", None) if gemma else None
        layer_types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * len(inner.layers))
        window = getattr(cfg, "sliding_window", None)

        def norm(module) -> tuple[torch.Tensor, float]:  # (gain, eps): Gemma's RMSNorm multiplies by 1 + w
            if gemma:
                return (1.0 + module.weight.float()).to(self.dtype), float(module.eps)
            return module.weight, module.variance_epsilon
        # raw (weight, bias) per projection and layer; planned into kernels below
        raw: list[dict[str, tuple[torch.Tensor, torch.Tensor | None]]] = []
        self.layers = []
        with torch.inference_mode():
            for layer in inner.layers:
                a, m = layer.self_attn, layer.mlp
                if fuse:
                    join = _join_in_place if self.in_place else _join
                    proj = {"qkv": join([a.q_proj, a.k_proj, a.v_proj]), "gate_up": join([m.gate_proj, m.up_proj])}
                else:
                    proj = {"q": _parts(a.q_proj), "k": _parts(a.k_proj), "v": _parts(a.v_proj),
                            "gate": _parts(m.gate_proj, bias=False), "up": _parts(m.up_proj, bias=False)}
                raw.append({**proj, "o": _parts(a.o_proj), "down": _parts(m.down_proj, bias=False)})
                kind = layer_types[len(self.layers)]
                if gemma:  # ln1, ln2: the norms before attention and the MLP (folded below); post_*: after them
                    q_gain, eps = norm(a.q_norm)
                    self.layers.append({
                        "ln1": norm(layer.input_layernorm), "ln2": norm(layer.pre_feedforward_layernorm),
                        "post_attn": norm(layer.post_attention_layernorm),
                        "post_mlp": norm(layer.post_feedforward_layernorm),
                        # the query scale folded into the query heads' gain (rotation is linear)
                        "qk_norm": (q_gain * float(cfg.query_pre_attn_scalar) ** -0.5, norm(a.k_norm)[0], eps),
                        "rope": kind, "window": window if kind == "sliding_attention" else None,
                    })
                else:
                    self.layers.append({"ln1": norm(layer.input_layernorm), "ln2": norm(layer.post_attention_layernorm),
                                        "rope": kind, "window": None})
        self.fused = fuse
        self._qkv_names = ("qkv",) if fuse else ("q", "k", "v")  # the products after each norm
        self._mlp_names = ("gate_up",) if fuse else ("gate", "up")
        # fused copies (not in place) also fold in what would be a per-call multiply: the RMSNorm gains
        # (W diag(g) x = W (g * x)) and the attention scale 1/sqrt(d) (into the query rows). Same function,
        # one rounding apart; the norms then run without a weight. In place the gains are the products' prologue.
        self.folded = fuse and not self.in_place
        if self.folded:
            with torch.inference_mode():
                for proj, norms in zip(raw, self.layers):
                    (wq, bq, _), (wg, _, _) = proj["qkv"], proj["gate_up"]
                    wq = wq * norms["ln1"][0][None, :]
                    if not gemma:  # (Gemma's query scale is in its QK-norm gain)
                        wq[: self.n_heads * self.head_dim] *= self.head_dim ** -0.5
                    if bq is not None and not gemma:
                        bq = bq.clone()
                        bq[: self.n_heads * self.head_dim] *= self.head_dim ** -0.5
                    proj["qkv"] = (wq, bq, None)
                    proj["gate_up"] = (wg * norms["ln2"][0][None, :], None, None)
                    norms["ln1"] = (None, norms["ln1"][1])
                    norms["ln2"] = (None, norms["ln2"][1])
        self.norm = norm(inner.norm)
        # FR-Spec drafts score a subset of the vocabulary and scatter it into -inf-filled full rows
        self.head_token_ids = getattr(model, "head_token_ids", None)
        self.vocab_size = int(cfg.vocab_size) if self.head_token_ids is not None else int(model.lm_head.weight.shape[0])
        self._raw = raw + [{"lm_head": _parts(model.lm_head, bias=False)}]  # the head: a last pseudo-layer
        self.scaling = 1.0 if self.folded or gemma else self.head_dim ** -0.5
        self.q_size, self.kv_size = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        self._rotary = inner.rotary_emb
        self._rope_kinds = sorted(set(layer_types))
        self._cos: dict[str, torch.Tensor] = {}  # {layer type: [size, head_dim]}
        self._sin: dict[str, torch.Tensor] = {}
        self._alloc(min(self.capacity, 256))
        self.length = 0
        packable = _kernels.packing_available(self.device, self.dtype)
        # the one-token path's attention in one native call (spade_lib.decoding.model.native), except for "legacy"
        self.native_attention = (policy != "legacy" and self.device.type == "cpu"
                                  and self.dtype == torch.float32 and _native.available())
        self._prepared: dict[str, list[dict]] = {}
        self._plan_facts: dict | None = None  # what keys this model's timed plan ("auto" only): prepare() times it
        if policy == "auto" and packable:
            self._plan_facts = {"dtype": str(self.dtype), "layers": len(raw), "fused": fuse, "in_place": self.in_place,
                                "shapes": {n: list(w.shape) for n, (w, *_) in {**raw[0], **self._raw[-1]}.items()}}
            # a constructor times nothing: the plan prepare() recorded on this machine, else an untimed default
            hit = _kernels.recorded(self._plan_facts, self._products())
            plan = hit["plan"] if hit is not None else _kernels.untimed(self.in_place)
            self.plan_source = "recorded" if hit is not None else "untimed"
        else:
            plan = {"one": "mkl", "many": "mkl"} if policy == "auto" else _kernels.fixed(policy, packable)
            if self.in_place and any(_kernels.CANDIDATES[n][0] != "raw" for n in plan.values()):
                raise ValueError(f"kernels: {policy!r} packs a copy of the weights; in_place=True takes "
                                 f"{list(_kernels.IN_PLACE)}")
            self.plan_source = "fixed"
        self._install(plan)
        self._prepared = {}  # only what the installed kernels reference stays in memory

    def prepare(self) -> str:
        """Time this model's kernel plan now, unless one is recorded (:func:`spade_lib.decoding.model.kernels.choose`:
        every candidate on the whole forward, recorded on disk per model and machine), and install it; a
        forward built afterwards on this machine takes the recorded plan without timing. Returns
        :attr:`plan_source` (``"recorded"``, or ``"fixed"`` for a forced policy, which is never timed)."""
        if self._plan_facts is None or self.plan_source == "recorded":
            return self.plan_source
        names = [n for n in (_kernels.IN_PLACE if self.in_place else _kernels.COPYING) if _kernels.usable(n)]
        hit = _kernels.choose(self._plan_facts, self._time_plan, self._products(),
                              candidates={rows: [n for n in names if rows in _kernels.CANDIDATES[n][2]]
                                          for rows in _kernels.ROW_CLASSES})
        self._install(hit["plan"])
        self._prepared = {}
        self.plan_source = "recorded"
        return self.plan_source

    def prepare_prefill(self) -> dict:
        """Time this **draft**'s prefill with its products in fp32 against bf16 and take the faster
        (:func:`spade_lib.decoding.model.kernels.choose_prefill`: recorded per model and machine); returns that
        record. Only an in-place forward on CPU in fp32 has a prefill kernel of its own; others stay fp32."""
        if not (self.in_place and self.device.type == "cpu" and self.dtype == torch.float32
                and self.capacity >= BULK_ROWS):
            return {"prefill": "fp32", "seconds": {}, "why": "only an in-place fp32 forward on CPU has a prefill kernel"}
        facts = {"dtype": str(self.dtype), "weight_dtype": str(self.weight_dtype), "layers": len(self.layers),
                 "shapes": {n: list(w.shape) for n, (w, *_) in {**self._raw[0], **self._raw[-1]}.items()}}
        hit = _kernels.choose_prefill(facts, self._time_prefill)
        self.prefill = hit["prefill"]
        self._install(self.kernel_plan)
        return hit

    @torch.inference_mode()
    def _time_prefill(self, prefill: str, reps: int = 3) -> float:
        """Median seconds of a prefill of ``kernels.PREFILL_ROWS`` rows (capacity permitting) with its products in
        ``prefill`` precision, after one untimed."""
        self.prefill = prefill
        self._install(self.kernel_plan)
        k = max(BULK_ROWS, min(_kernels.PREFILL_ROWS, self.capacity))
        ids = torch.randint(0, int(self.embed.shape[0]), (k,), generator=torch.Generator().manual_seed(0)).to(self.device)

        def run() -> None:  # a prompt's prefill on an empty cache
            self.reset()
            self.forward(ids, last_only=True)

        times = devices.time_in_turns({"prefill": run}, reps=reps, warmup=1, device=self.device)["prefill"]
        self.reset()
        return float(sorted(times)[reps // 2])

    def weight_bytes(self) -> int:
        """Bytes of weights one decoding step reads: every product's matrix, bias and per-row scale, the LM head
        included, each tensor once. The embedding table is not counted: a step gathers one row of it a token (a
        head tied to it is counted as the head). Norm gains (kilobytes) and the KV cache (it grows with the
        context) are left out. The numerator of a step's streaming rate, ``weight_bytes / t_step``, and of a
        draft's cost ratio by bytes, ``draft.weight_bytes() / target.weight_bytes()``."""
        seen = {(t.data_ptr(), t.numel(), t.dtype): t.numel() * t.element_size()
                for layer in self._raw for parts in layer.values() for t in parts if isinstance(t, torch.Tensor)}
        return sum(seen.values())

    def _products(self) -> list[str]:
        """The products of one forward, largest weight first (the order :func:`kernels.choose` refines them)."""
        sizes = {n: w.numel() for n, (w, *_) in {**self._raw[0], **self._raw[-1]}.items()}
        return sorted(sizes, key=lambda n: -sizes[n])

    def _weights(self, family: str) -> list[dict]:
        """Every layer's ``{name: (weight as the family reads it, bias, int8 scale or None)}`` (copies made once per
        family; an ``in_place`` forward reads the raw family only: the module's own tensors)."""
        if family not in self._prepared:
            self._prepared[family] = [{n: (_kernels.prepare(family, w), b, sc) for n, (w, b, sc) in layer.items()}
                                      for layer in self._raw]
        return self._prepared[family]

    def _install(self, plan: dict[str, str | dict[str, str]]) -> None:
        """Build every layer's ``(one-row kernel, many-row kernel)`` per product, and the head's; ``plan[row
        class]`` is one candidate for every product or ``{product: candidate}``."""
        plan = {rows: p if isinstance(p, dict) else {n: p for n in self._products()} for rows, p in plan.items()}
        # a prefill's SGEMM (narrow weights widened), or a draft's in bf16 (prepare_prefill)
        bulk = "mkl_bf16" if self.prefill == "bf16" else "mkl_widened" if self.weight_dtype != self.dtype else "mkl"
        for i, layer in enumerate(self.layers + [None]):
            for name in self._raw[i]:
                pair = tuple(_kernels.Kernel(plan[rows][name], *self._weights(
                    _kernels.CANDIDATES[plan[rows][name]][0])[i][name]) for rows in ("one", "many"))
                if self.in_place:  # a prefill's block: SGEMM on the same tensors (compute-bound, no copy)
                    pair = (*pair, _kernels.Kernel(bulk, *self._raw[i][name]))
                if layer is None:
                    self.head = pair
                else:
                    layer[name] = pair
        self.kernel_plan = plan
        self.kernel_names = {rows: _kernels.summary(p) for rows, p in plan.items()}

    @torch.inference_mode()
    def _time_plan(self, rows: str, plan: dict[str, str], reps: int = 3, warmup: int = 1, steps: int = 4,
                   context: int = 128) -> float:
        """Median seconds of one forward with the ``rows``-class products on ``plan`` (``{product: candidate}``),
        timed as decoding runs it: ``steps`` forwards in a row (1 new token each, or MANY_ROWS) on a cache of
        ``context`` tokens that grows as they go, then rolled back; the median over ``reps`` such loops."""
        self._install({"one": "mkl", "many": "mkl", rows: plan})
        k = 1 if rows == "one" else _kernels.MANY_ROWS
        ctx = min(context, max(1, self.capacity - steps * k))
        steps = max(1, min(steps, (self.capacity - ctx) // k))
        ids = torch.randint(0, int(self.embed.shape[0]), (ctx + steps * k,),
                            generator=torch.Generator().manual_seed(0)).to(self.device)
        self.reset()
        self.forward(ids[:ctx])

        def run() -> None:  # the decoding loop's steps, then back to the context
            for i in range(steps):
                self.forward(ids[ctx + i * k:ctx + (i + 1) * k], last_only=k == 1)
            self.rollback(ctx)

        times = devices.time_in_turns({"steps": run}, reps=reps, warmup=warmup, device=self.device)["steps"] / steps
        self.reset()
        return float(sorted(times)[reps // 2])

    # -- buffers ---------------------------------------------------------------------------
    def _alloc(self, size: int) -> None:
        size = min(max(size, 1), self.capacity)
        old = getattr(self, "_kv", None)
        self._kv = [torch.zeros(2, self.n_kv, size, self.head_dim, device=self.device, dtype=self.dtype)
                    for _ in self.layers]
        if old is not None:
            for new, prev in zip(self._kv, old):
                new[:, :, :self.length] = prev[:, :, :self.length]
        pos = torch.arange(size, device=self.device)[None]
        x = self.embed[:1][None].to(self.dtype)
        with torch.inference_mode():  # one table per layer type (Gemma-3: local and global bases)
            for kind in self._rope_kinds:
                cos, sin = self._rotary(x, pos, kind) if self.family == "gemma3" else self._rotary(x, pos)
                self._cos[kind], self._sin[kind] = cos[0], sin[0]  # [size, head_dim], in the model's dtype
        self._size = size

    def reset(self) -> None:
        self.length = 0

    def rollback(self, length: int) -> None:
        self.length = length

    # -- the forward -----------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, w: tuple[torch.Tensor, float]) -> torch.Tensor:
        """``w * x / sqrt(mean(x^2) + eps)``, the statistics in fp32 (one fused kernel for fp32 models)."""
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), w[0], w[1])
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + w[1])).to(x.dtype)
        return h if w[0] is None else w[0] * h

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x cos + rotate_half(x) sin`` with ``rotate_half(x) = [-x_2, x_1]`` (halves of the head dim)."""
        half = self.head_dim // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
                ) -> torch.Tensor:
        """``softmax(q K^T / sqrt(d) + mask) V`` per head with batched matmuls (cheaper per call than the
        fused CPU attention kernel at these sizes). Grouped-query heads share their KV head without copying
        it: the ``H / KV`` query heads of a group are stacked as rows. ``q [H, k, hd]``, ``keys [KV, n, hd]``."""
        H, KV = self.n_heads, self.n_kv
        k = q.shape[1]
        if self.gqa:
            q = q.reshape(KV, (H // KV) * k, self.head_dim)
        scores = torch.matmul(q, keys.transpose(-1, -2))
        if self.scaling != 1.0:
            scores = scores * self.scaling
        if mask is not None:
            scores = scores + mask
        out = torch.matmul(scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype), values)
        return out.reshape(H, k, self.head_dim) if self.gqa else out

    def forward(self, ids: torch.Tensor, last_only: bool = False, *, ancestors: torch.Tensor | None = None,
                tree_from: int | None = None, hidden_layers: tuple[int, ...] = ()
                ) -> torch.Tensor | tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Feed 1-D ``ids`` at positions ``length ..``; return logits ``[k, V]`` (``[1, V]`` if ``last_only``).

        ``ancestors [k, M]`` bool feeds the rows as a tree (:mod:`spade_lib.decoding.drafts.tree`) whose ``M``
        rows start at cache position ``S = tree_from`` (default ``length``, ``M = k``): row ``i`` sees the
        cache before ``S`` and the tree rows ``j`` with ``ancestors[i, j]``, at position ``S + depth[i]``.
        ``hidden_layers`` also returns ``{layer: [k, d]}``, indexed as Hugging Face's
        ``output_hidden_states`` (0: embeddings, ``i``: after layer ``i``, the last after the final norm).
        Call it under ``torch.inference_mode()`` (the adapter does): it writes the KV buffers in place."""
        k = int(ids.shape[0])
        start, end = self.length, self.length + k
        if end > self.capacity:
            raise ValueError(f"context limit: {start} cached + {k} new tokens exceed {self.capacity} positions")
        if end > self._size:
            self._alloc(max(2 * self._size, end))
        tree_from = start if tree_from is None or ancestors is None else tree_from
        if ancestors is None:
            rot = {t: (c[start:end], self._sin[t][start:end]) for t, c in self._cos.items()}  # [k, hd] each
        else:  # a tree: row i at position tree_from + depth[i]
            depth = ancestors.sum(dim=-1)
            windows = [w for w in (layer["window"] for layer in self.layers) if w is not None]
            if windows and int(depth.max()) > min(windows):  # a path longer than the window would lose its root
                raise ValueError(f"ancestors: a tree path of {int(depth.max())} rows is longer than the sliding "
                                 f"window of {min(windows)} positions")
            pos = tree_from - 1 + depth
            rot = {t: (c[pos], self._sin[t][pos]) for t, c in self._cos.items()}
        if self.native_attention:
            return self._forward_native(ids, start, rot, tree_from, ancestors, last_only, hidden_layers)
        if (k == 1 and tree_from == start and self.folded and self.dtype == torch.float32 and not hidden_layers
                and self.family == "llama"):
            return self._forward_one(ids, start)
        masks: dict[int | None, torch.Tensor | None] = {}  # per sliding window (None: a global layer)
        x = self._embed(ids)  # [k, d]
        states = [x] if hidden_layers else None  # the hidden states: embeddings, then each layer's output
        H, KV, hd = self.n_heads, self.n_kv, self.head_dim
        sel = self._row_class(k)  # which planned kernel: one row, many, or (in place) a prefill's bulk
        for layer, kv in zip(self.layers, self._kv):
            cos, sin = (r[None] for r in rot[layer["rope"]])  # [1, k, hd]
            n = self._rms(x, layer["ln1"])
            if self.fused:
                qkv = layer["qkv"][sel](n).view(k, H + 2 * KV, hd).transpose(0, 1)  # [H + 2KV, k, hd]
                q, kk, v = qkv[:H], qkv[H:H + KV], qkv[H + KV:]
            else:
                q, kk, v = (layer[name][sel](n) for name in ("q", "k", "v"))
                q, kk, v = (t.view(k, -1, hd).transpose(0, 1) for t in (q, kk, v))  # [heads, k, hd]
            if "qk_norm" in layer:  # Gemma-3: each query and key head RMS-normed before rotation
                q_gain, k_gain, eps = layer["qk_norm"]
                q, kk = self._rms(q, (q_gain, eps)), self._rms(kk, (k_gain, eps))
            if self.fused and "qk_norm" not in layer:
                qk = self._rope(qkv[:H + KV], cos, sin)  # q and k heads rotated together
                q, kk = qk[:H], qk[H:]
            else:
                q, kk = self._rope(q, cos, sin), self._rope(kk, cos, sin)
            kv[0, :, start:end] = kk
            kv[1, :, start:end] = v
            if layer["window"] not in masks:
                masks[layer["window"]] = self._mask(k, start, tree_from, ancestors, layer["window"])
            att = self._attend(q, kv[0, :, :end], kv[1, :, :end], masks[layer["window"]])  # [H, k, hd]
            att = layer["o"][sel](att.transpose(0, 1).reshape(k, H * hd))
            x = x + (self._rms(att, layer["post_attn"]) if "post_attn" in layer else att)
            m = self._rms(x, layer["ln2"])
            if self.fused:
                gate, up = layer["gate_up"][sel](m).chunk(2, dim=-1)
            else:
                gate, up = layer["gate"][sel](m), layer["up"][sel](m)
            y = layer["down"][sel](self._act(gate) * up)
            x = x + (self._rms(y, layer["post_mlp"]) if "post_mlp" in layer else y)
            if states is not None:
                states.append(x)
        if states is not None:  # the last hidden state is after the final norm, as in Hugging Face's output
            states[-1] = self._rms(x, self.norm)
            x = states[-1][-1:] if last_only else states[-1]
        elif last_only:
            x = x[-1:]
        self.length = end
        logits = self._logits(self.head[self._row_class(int(x.shape[0]))](
            x if states is not None else self._rms(x, self.norm)))
        if states is not None:
            return logits, {i: states[i] for i in hidden_layers}
        return logits

    def _row_class(self, k: int) -> int:
        """The kernel of a ``k``-row product: 0 one row, 1 a verification block (the plan's), 2 a block of
        :data:`BULK_ROWS` rows or more on an in-place forward (a prefill: MKL's SGEMM, compute-bound there)."""
        return 0 if k == 1 else (2 if self.in_place and k >= BULK_ROWS else 1)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The input embeddings ``[k, d]`` (Gemma-3's scaled by ``sqrt(d)``, as its forward does)."""
        x = F.embedding(ids, self.embed)
        return x if self.embed_scale is None else x * self.embed_scale

    def _act(self, gate: torch.Tensor) -> torch.Tensor:
        """The MLP's gate activation: SiLU (Llama family) or tanh-approximated GELU (Gemma-3)."""
        return F.gelu(gate, approximate="tanh") if self.family == "gemma3" else F.silu(gate)

    def _mask(self, k: int, start: int, tree_from: int, ancestors: torch.Tensor | None, window: int | None
              ) -> torch.Tensor | None:
        """The additive attention mask ``[k, end]`` (``[H k, end]`` rows for grouped-query heads): causal (query
        ``i`` sees keys ``j <= start + i``) or a tree's (the cache before ``tree_from`` and its own path), and
        within a sliding ``window`` the keys at positions ``> p_i - window`` only; ``None`` where nothing is
        masked (one new token, no tree, the window covering the cache)."""
        end = start + k
        if k == 1 and tree_from == start and (window is None or end <= window):
            return None
        keys = torch.arange(end, device=self.device)
        if ancestors is None:
            query = torch.arange(start, end, device=self.device)
            seen = masks.causal(query, keys)
        else:  # a tree's: query i (at position tree_from - 1 + depth) sees the cache before the tree and its path
            query = tree_from - 1 + ancestors.sum(dim=-1)
            seen = torch.cat([torch.ones(k, tree_from, dtype=torch.bool, device=self.device), ancestors], dim=1)
        if window is not None:  # tree rows are within the window (forward checks), cached slots are positions
            seen &= masks.in_window(query, keys, window)
        mask = masks.additive(seen, self.dtype)
        return mask.repeat(self.n_heads // self.n_kv, 1) if self.gqa else mask

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's output as the model returns it: Gemma's final soft-capping where its config sets one,
        and an FR-Spec draft's subset scattered into full-vocabulary rows (:meth:`_full_vocab`)."""
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return self._full_vocab(logits)

    def keep(self, start: int, rows: torch.Tensor) -> None:
        """Keep the first ``start`` cached positions and the cached ``rows [m]`` (absolute, increasing,
        ``>= start``), moved to ``start .. start + m - 1``: each layer's keys/values rows are copied."""
        m = int(rows.shape[0])
        for kv in self._kv:
            kv[:, :, start:start + m] = kv[:, :, rows]
        self.length = start + m

    def _forward_native(self, ids: torch.Tensor, start: int, rot: dict[str, tuple[torch.Tensor, torch.Tensor]],
                        tree_from: int, ancestors: torch.Tensor | None, last_only: bool,
                        hidden_layers: tuple[int, ...]) -> torch.Tensor | tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """:meth:`forward` of ``k >= 1`` tokens on SPADE's native kernels (:mod:`spade_lib.decoding.model.native`), in
        four calls a layer (in place: the products' norm gain as their prologue, the attention scaling the
        queries): the normed fused QKV product; one :func:`native.attend` (rotation, cache write and
        attention under the causal or the tree's ancestor mask); the output projection with the residual
        added; the normed gate/up product and the gated down projection with the residual added. The final
        norm (its gain as the product's prologue) and the LM head are one more call. On the native product
        kernel a row's result does not depend on the rows beside it, so a verification block or a tree
        level computes bit for bit the logits the one-token path computes for the same prefix.

        Gemma-3's layer takes a few more calls: the QK-norm and the sliding window are in the attention
        call, the two post-norms are torch's fused RMSNorm on the products' outputs, and the GELU gate is
        applied before a plain down projection."""
        k = int(ids.shape[0])
        sel = self._row_class(k)
        H = self.n_heads
        x = self._embed(ids)  # [k, d]
        states = [x] if hidden_layers else None
        for layer, kv in zip(self.layers, self._kv):
            cos, sin = rot[layer["rope"]]
            qkv = self._normed(layer, self._qkv_names, "ln1", x, sel)
            att = _native.attend(qkv, kv, start, cos, sin, H, tree_from, ancestors, window=layer["window"],
                                 qk_norm=layer.get("qk_norm"), q_scale=self.scaling)
            if self.family == "gemma3":
                x = x + self._rms(layer["o"][sel](att), layer["post_attn"])
                gate, up = self._normed(layer, self._mlp_names, "ln2", x, sel).chunk(2, dim=-1)
                x = x + self._rms(layer["down"][sel](self._act(gate) * up), layer["post_mlp"])
            else:
                x = layer["o"][sel].add_to(x, att)
                x = layer["down"][sel].add_to(x, self._normed(layer, self._mlp_names, "ln2", x, sel), gated=True)
            if states is not None:
                states.append(x)
        self.length = start + k
        h = x[-1:] if last_only else x
        logits = self._logits(self.head[1 if h.shape[0] > 1 else 0].normed(h, self.norm[1], gain=self.norm[0]))
        if states is not None:  # the last hidden state is after the final norm, as in Hugging Face's output
            states[-1] = self._rms(x, self.norm)
            return logits, {i: states[i] for i in hidden_layers}
        return logits

    def _normed(self, layer: dict, names: tuple[str, ...], norm: str, x: torch.Tensor, sel: int) -> torch.Tensor:
        """``rmsnorm(x)`` (the layer's ``norm``, its gain folded into the weights or passed) times the products
        ``names``, concatenated ``[k, sum of their outputs]``: one call on fused weights, else one a product."""
        gain, eps = layer[norm]
        if len(names) == 1:
            return layer[names[0]][sel].normed(x, eps, gain)
        return torch.cat([layer[n][sel].normed(x, eps, gain) for n in names], dim=-1)

    def _forward_one(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """:meth:`forward` of one token on folded weights where SPADE's native kernels do not run (the AR step
        and every draft step), in as few library calls as the math allows: each RMSNorm is done by the
        product that reads it and each residual add by the product that writes it where the kernel allows
        (``Kernel.normed``, ``Kernel.add_to``); the rotation of the ``H + KV`` query and key heads is one
        product with the position's rotation matrix ``R`` (``x R = x cos + rotate_half(x) sin``, built once
        per call) and attention :meth:`_attend` (two batched products over the cache)."""
        H, KV, hd = self.n_heads, self.n_kv, self.head_dim
        end = start + 1
        cos, sin = self._cos["full_attention"][start], self._sin["full_attention"][start]
        x = F.embedding(ids, self.embed)  # [1, d]
        half = hd // 2
        rot = torch.diag(cos)
        rot[half:, :half] -= torch.diag(sin[:half])   # (x R)_i gets -x_{i+half} sin_i for i < half
        rot[:half, half:] += torch.diag(sin[half:])   # and +x_{i-half} sin_i for i >= half
        for layer, kv in zip(self.layers, self._kv):
            qkv = layer["qkv"][0].normed(x, layer["ln1"][1]).view(H + 2 * KV, hd)
            qk = torch.mm(qkv[:H + KV], rot)
            kv[0, :, start] = qk[H:]
            kv[1, :, start] = qkv[H + KV:]
            att = self._attend(qk[:H].view(H, 1, hd), kv[0, :, :end], kv[1, :, :end], None).view(1, H * hd)
            x = layer["o"][0].add_to(x, att)
            x = layer["down"][0].add_to(x, layer["gate_up"][0].normed(x, layer["ln2"][1]), gated=True)
        self.length = end
        return self._logits(self.head[0](self._rms(x, self.norm)))

    def _full_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """An FR-Spec draft's ``head_vocab`` logits scattered into ``-inf``-filled full-vocabulary rows, exactly
        as its Hugging Face forward does (other models' logits unchanged)."""
        if self.head_token_ids is None:
            return logits
        return scatter_vocab(logits, self.head_token_ids, self.vocab_size)


Parts = tuple[torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"]  # (weight, bias, int8 scale per row)


def _parts(linear: torch.nn.Linear, *, bias: bool = True) -> Parts:
    """``linear``'s ``(weight, bias, scale)``: its bias (``None`` if it has none or ``bias`` is false) and, for an
    int8 weight, its fp32 scale per weight row (``kernels.SCALE``; ``None`` otherwise)."""
    return linear.weight, linear.bias if bias else None, getattr(linear, _kernels.SCALE, None)


def _join(linears: list[torch.nn.Linear]) -> Parts:
    """The products of ``linears`` (one input) as one: their weights stacked ``[sum N_i, K]`` (a copy) and biases
    (``None`` if they have none); never narrow weights, which run in place (:func:`_join_in_place`)."""
    bias = None if linears[0].bias is None else torch.cat([m.bias for m in linears])
    return torch.cat([m.weight for m in linears]), bias, None


def _join_in_place(linears: list[torch.nn.Linear]) -> Parts:
    """:func:`_join` holding the weights once: the modules' weights (and biases, and an int8 weight's scales)
    become consecutive row blocks of one tensor, which is returned; the modules keep working on their blocks
    (views), and a second call finds them joined and copies nothing."""
    with torch.inference_mode(False), torch.no_grad():  # normal tensors: the modules may run under autograd
        return tuple(_join_param(linears, name) for name in ("weight", "bias", _kernels.SCALE))


def _join_param(linears: list[torch.nn.Linear], name: str) -> torch.Tensor | None:
    """:func:`_join_in_place` of one parameter or buffer (``"weight"``, ``"bias"`` or ``kernels.SCALE``)."""
    ts = [getattr(m, name, None) for m in linears]
    if ts[0] is None:
        return None
    size = (sum(int(t.shape[0]) for t in ts), *ts[0].shape[1:])
    if all(t.is_contiguous() and t.untyped_storage().data_ptr() == ts[0].untyped_storage().data_ptr() for t in ts) \
            and all(b.data_ptr() == a.data_ptr() + a.numel() * a.element_size() for a, b in zip(ts, ts[1:])):
        return ts[0].detach().as_strided(size, ts[0].stride(), ts[0].storage_offset())
    joined = torch.cat([t.detach() for t in ts])
    row = 0
    for m, t in zip(linears, ts):
        n = int(t.shape[0])
        if name in m._buffers:
            m._buffers[name] = joined[row:row + n]
        else:
            setattr(m, name, torch.nn.Parameter(joined[row:row + n], requires_grad=t.requires_grad))
        row += n
    return joined


def lean_forward(model: torch.nn.Module, capacity: int, *, check: bool = True) -> LeanForward | None:
    """A :class:`LeanForward` for ``model``, or ``None`` when it is not covered or (``check``) its logits
    differ from one Hugging Face forward of a short random sequence beyond float rounding. Times nothing: the
    kernel plan is the one :func:`prepare` recorded (else an untimed default), and the agreement is read from
    the record :func:`prepare` (or an earlier check of the same model, plan and machine) left."""
    if _unsupported(model) is not None or capacity < 2:
        return None
    try:
        lean = LeanForward(model, capacity)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None
    if check and not _checked_agreement(model, lean):
        warnings.warn(f"lean forward of {type(model).__name__} disagrees with its Hugging Face forward; "
                      "using the Hugging Face forward", RuntimeWarning, stacklevel=2)
        return None
    return lean


def prepare(*models: torch.nn.Module, capacity: int = 256, draft: bool = False) -> list[dict]:
    """The explicit step before decoding on a machine: for each model the lean forward covers, time its kernel
    plan (:meth:`LeanForward.prepare`) and check it against the Hugging Face forward, both recorded on disk
    (``CACHE_DIR/kernels/``), so every decoder built afterwards on this machine takes that plan and that
    verdict without timing or checking. One record per model: ``{"model", "covered", "plan" ({row class:
    kernel}), "plan_source", "agrees", "prefill"}`` (``covered`` False: the HF forward runs it; ``agrees`` None then).

    ``draft``: the models are drafts; with ``SPADE_DRAFT_PREFILL=auto`` (opt-in; default ``fp32``) their prefill
    runs in bf16 where that is faster here (:meth:`LeanForward.prepare_prefill`). The choice is set on the model as
    ``spade_prefill``, which every lean forward built on it reads. It changes the draft's proposals, never the output,
    but the draft then decodes from a prompt rounded to bf16, so teacher-forced scores of the fp32 draft
    (:mod:`spade_lib.whatif.align`) match its traces to ~1e-2 instead of float rounding: hence opt-in. A target's
    prefill is always fp32 (its logits are the output distribution)."""
    mode = os.environ.get("SPADE_DRAFT_PREFILL", "fp32")
    if draft and mode not in DRAFT_PREFILL:
        raise ValueError(f"SPADE_DRAFT_PREFILL: must be one of {list(DRAFT_PREFILL)}, got {mode!r}")
    out = []
    for model in models:
        why = _unsupported(model)
        if why is not None:
            out.append({"model": type(model).__name__, "covered": False, "why": why, "plan": None,
                        "plan_source": None, "agrees": None})
            continue
        lean = LeanForward(model, max(int(capacity), 2))
        source = lean.prepare()
        prefill = {"prefill": lean.prefill}
        if draft:
            prefill = lean.prepare_prefill() if mode == "auto" else {"prefill": "fp32"}
            setattr(model, PREFILL_ATTR, prefill["prefill"])
        out.append({"model": type(model).__name__, "covered": True, "plan": dict(lean.kernel_names),
                    "plan_source": source, "agrees": _checked_agreement(model, lean),
                    "prefill": prefill["prefill"], "prefill_seconds": prefill.get("seconds", {})})
        del lean
    return out


_AGREED: dict[str, bool] = {}  # this process: agreement key -> verdict (the disk record's copy)


def _agreement_path():
    return paths.CACHE_DIR / "kernels" / "agreement.json"


def _agreement_key(model: torch.nn.Module, lean: LeanForward) -> str:
    """What the lean-vs-HF verdict depends on: the model's class and configuration (its path left out), its
    weights (every product's shape and a strided sample's sum of the embedding, the first layer and the head:
    another checkpoint or a trimmed head of the same configuration gets its own verdict), the lean forward's
    dtype, placement, kernel plan and attention path, torch, the native build and the CPU."""
    config = {k: v for k, v in model.config.to_dict().items() if k not in ("_name_or_path", "transformers_version")}
    named = {**{n: w for n, (w, *_) in {**lean._raw[0], **lean._raw[-1]}.items()}, "embed": lean.embed}
    weights = {n: [list(w.shape), repr(float(w.detach().flatten()[:: max(1, w.numel() // 4096)].double().sum()))]
               for n, w in sorted(named.items())}
    facts = {"class": type(model).__name__, "config": config, "weights": weights, "dtype": str(lean.dtype),
             "in_place": lean.in_place,
             "plan": lean.kernel_plan, "native_attention": lean.native_attention, "torch": torch.__version__,
             "native": _native.available() and _native.isa(), "cpu": devices.cpu().label()}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _checked_agreement(model: torch.nn.Module, lean: LeanForward) -> bool:
    """:func:`_agrees`, once per agreement key: read from this process or the disk record, else run and
    recorded (a disagreement too, so it is reported the same way every time)."""
    key = _agreement_key(model, lean)
    if key in _AGREED:
        return _AGREED[key]
    path = _agreement_path()
    paths.ensure_dir(path.parent)
    with FileLock(str(path) + ".lock"):
        try:
            disk = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            disk = {}
        if not isinstance(disk.get(key), bool):
            disk[key] = bool(_agrees(model, lean))
            try:
                write_json(path, disk)
            except OSError:
                pass
    _AGREED[key] = disk[key]
    return disk[key]


@torch.inference_mode()
def _agrees(model: torch.nn.Module, lean: LeanForward) -> bool:
    vocab = int(lean.embed.shape[0])
    n = min(6, lean.capacity)
    ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(0)).to(lean.device)
    ref = model(ids[None], use_cache=False).logits[0].float()
    lean.reset()
    first = lean.forward(ids[: n // 2])  # a block of tokens, then one token at a time (the AR step's own path)
    rest = [lean.forward(ids[i:i + 1]) for i in range(n // 2, n)]
    lean.reset()
    got = torch.cat([first, *rest]).float()
    finite = torch.isfinite(ref)  # an FR-Spec head's logits are -inf off its tokens, in both forwards
    if got.shape != ref.shape or not torch.equal(finite, torch.isfinite(got)) or not bool(finite.any()):
        return False
    tol = 1e-4 if lean.dtype == torch.float32 else 5e-2
    scale = max(1.0, float(ref[finite].abs().max()))
    return float((got[finite] - ref[finite]).abs().max()) <= tol * scale and not math.isnan(scale)
