"""The lean forward for ``B`` sequences at once: batched decoding (autoregressive, speculative chains and trees,
:func:`spade_lib.decoding.batch.batch_lm`) on the lean weights.

:class:`~spade_lib.decoding.batch.BatchLM` runs a batch through the Hugging Face forward (``DynamicCache``,
4-D masks, separate q/k/v and gate/up products). On a CPU a batch of ``B`` one-token rows is a ``B``-row
product per projection, compute-bound once ``B`` reaches a few dozen, so the kernel matters: at ``B = 32``
on SmolLM2 (2-core AMD EPYC, torch 2.13) the Hugging Face decode step ran at ~45 GFLOP/s while its prefill
ran at ~165 and the lean forward's fused products reach ~95-115 at 32 rows (``F.linear`` on its
49,152-row LM head: ~45). :class:`LeanBatch` computes the same function as the model with the weights a
:class:`~spade_lib.decoding.model.lean.LeanForward` already holds (q/k/v and gate/up fused; packed copies with the
norm gains and attention scale folded in, or the module's own tensors in place with both applied on the fly;
the kernel plan its timing chose for ``k > 1`` rows; ``F.linear`` on the raw
fused weights for more than :data:`BIG_ROWS` rows, a prefill, where MKL's GEMM is the fastest here) and
its rotary tables, for Llama-family and Gemma-3 layers alike.

The cache follows :class:`~spade_lib.decoding.batch.BatchLM`'s contract so the batched decoders can use
either (``forward``, ``forward_tree``, ``keep``, ``rollback``, ``select``, ``tidy``): slots appended for every row at
once, ``valid [R, k]`` marking holes (a left-padded prompt's pads, a shorter draft, a rejected tail);
a row's ``i``-th valid token sits at position ``i``; a query attends to its row's valid slots at
positions ``<=`` its own (and, in a sliding-window layer, ``> p - window``), and always to its own slot (a
hole sees only itself, so no row of the softmax is empty). Per layer the keys/values are one preallocated
buffer ``[2, R, KV, capacity, hd]`` that doubles when full; :meth:`select` keeps a subset of the rows.
Grouped-query heads share their KV head without a copy (the ``H / KV`` query heads of a group are stacked
as rows, as :meth:`LeanForward._attend` does). Its logits agree with the Hugging Face batched forward to
float rounding (tests/test_lean_batch.py); greedy rows equal single-sequence decoding up to near ties.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from spade_lib.decoding.model import masks
from spade_lib.decoding.model.lean import LeanForward
from spade_lib.decoding.model.slots import Slots

__all__ = ["BIG_ROWS", "LeanBatch"]

BIG_ROWS = 64  # products over more rows than this (a prefill) run F.linear on the raw fused weights


class LeanBatch(Slots):
    """``n_rows`` sequences decoded together on ``lean``'s weights (module docstring)."""

    def __init__(self, lean: LeanForward, n_rows: int):
        if not isinstance(lean, LeanForward):
            raise TypeError(f"lean: a LeanForward, got {type(lean).__name__}")
        if not lean.fused:
            raise ValueError("lean: batched decoding needs the fused projections (a model small enough to fuse)")
        if isinstance(n_rows, bool) or not isinstance(n_rows, int) or n_rows < 1:
            raise ValueError(f"n_rows: must be an integer >= 1, got {n_rows!r}")
        super().__init__(n_rows, lean.device)
        self.lean, self.dtype = lean, lean.dtype
        self._kv = [torch.zeros(2, n_rows, lean.n_kv, 0, lean.head_dim, device=self.device, dtype=self.dtype)
                    for _ in lean.layers]

    def _reserve(self, slots: int, positions: int) -> None:
        """Room for ``slots`` cache slots per row and rotary tables for ``positions`` positions."""
        have = self._kv[0].shape[3]
        if slots > have:
            size = max(slots, 2 * have, 64)
            for i, kv in enumerate(self._kv):
                new = torch.zeros(*kv.shape[:3], size, kv.shape[4], device=self.device, dtype=self.dtype)
                new[:, :, :, :self.slots] = kv[:, :, :, :self.slots]
                self._kv[i] = new
        if positions > self.lean._size:
            if positions > self.lean.capacity:
                raise ValueError(f"context limit: a row reaches position {positions - 1}, beyond the model's "
                                 f"{self.lean.capacity} positions")
            self.lean._alloc(max(positions, 2 * self.lean._size))  # the tables (the lean's own cache kept)

    def _linear(self, layer: int, name: str, x: torch.Tensor) -> torch.Tensor:
        """Product ``name`` of ``layer`` (``len(layers)``: the LM head) on ``x [M, d]``."""
        lean = self.lean
        kernel = lean.head if layer == len(lean.layers) else lean.layers[layer][name]
        if x.shape[0] > BIG_ROWS:  # the in-place forward's bulk kernel (SGEMM; narrow weights widened), else F.linear
            if lean.in_place:
                return kernel[2](x)
            w, b, _ = lean._raw[layer][name]
            return F.linear(x, w, b)
        return kernel[0 if x.shape[0] == 1 else 1](x)

    def _masks(self, q_pos: torch.Tensor, key_pos: torch.Tensor, key_valid: torch.Tensor, windows,
               boolean: bool, block: torch.Tensor | None = None) -> dict:
        """The masks per sliding window (``None``: a global layer): ``boolean`` ``[R, 1, k, S']`` (True = seen,
        for ``F.scaled_dot_product_attention``), else additive ``[R, 1, G k, S']`` with the rows stacked as the
        grouped query heads are. ``block [R, k, k]`` (a tree): which new slots each query sees, in place of the
        causal order of positions."""
        R, k = q_pos.shape
        S = key_pos.shape[1]
        own = torch.zeros(R, k, S, dtype=torch.bool, device=self.device)
        own[:, :, S - k:] = torch.eye(k, dtype=torch.bool, device=self.device)
        seen = key_valid.bool()[:, None, :] & masks.causal(q_pos, key_pos)
        if block is not None:
            seen[:, :, S - k:] = block
        groups = self.lean.n_heads // self.lean.n_kv
        out = {}
        for w in windows:
            ok = (seen & masks.in_window(q_pos, key_pos, w) if w is not None else seen) | own
            if boolean:
                out[w] = ok[:, None]
                continue
            m = masks.additive(ok[:, None], self.dtype)
            out[w] = m.repeat(1, 1, groups, 1) if groups > 1 else m
        return out

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, valid: torch.Tensor, keep: int) -> torch.Tensor:
        """Append ``ids [R, k]`` (``valid [R, k]``: False = hole); logits of the last ``keep`` columns
        (``0``: all), ``[R, keep or k, V]`` (a hole's logits are nobody's). The products run on the valid
        tokens only (a left-padded prefill of ragged prompts pays for its tokens, not for ``R`` times the
        longest); a block of ``k > 1`` attends through ``F.scaled_dot_product_attention``, one token a row
        through two batched matmuls."""
        self._check(ids, valid)
        rank = valid.to(torch.long).cumsum(dim=-1)
        return self._run(ids, valid, (self.length[:, None] + rank - 1).clamp(min=0), keep)

    @torch.inference_mode()
    def forward_tree(self, ids: torch.Tensor, valid: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
        """Append every row's tree block ``ids [R, k]`` (``valid [R, k]``: False = hole) under ``ancestors [R, k,
        k]`` (``[r, i, j]`` iff block slot ``j`` is slot ``i`` or one of its ancestors); logits of every slot,
        ``[R, k, V]``: slot ``i`` sees its row's valid cache slots and its own path, at position ``l_r + depth_i``
        (as :meth:`spade_lib.decoding.batch.BatchLM.forward_tree`); a hole sees only itself."""
        self._check(ids, valid)
        R, k = ids.shape
        if tuple(ancestors.shape) != (R, k, k) or ancestors.dtype != torch.bool:
            raise ValueError(f"ancestors: a boolean [{R}, {k}, {k}] tensor, got {ancestors.dtype} "
                             f"{tuple(ancestors.shape)}")
        see = ancestors & valid[:, None, :]
        positions = self.length[:, None] + (see.sum(dim=-1) - 1).clamp(min=0)
        return self._run(ids, valid, positions, 0, see)

    def _check(self, ids: torch.Tensor, valid: torch.Tensor) -> None:
        R = self.mask.shape[0]
        if ids.dim() != 2 or ids.shape[0] != R or tuple(valid.shape) != tuple(ids.shape):
            raise ValueError(f"ids, valid: [{R}, k] each, got {tuple(ids.shape)} and {tuple(valid.shape)}")

    def _run(self, ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor, keep: int,
             block: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`forward`'s body at the given ``positions [R, k]`` (``block``: a tree's visibility, :meth:`_masks`)."""
        lean = self.lean
        R, k = ids.shape
        valid_l = valid.to(torch.long)
        S0, S1 = self.slots, self.slots + k
        self._reserve(S1, int(positions.max()) + 1)
        key_pos, key_valid = torch.cat([self.pos, positions], dim=1), torch.cat([self.mask, valid_l], dim=1)
        masks = self._masks(positions, key_pos, key_valid, {layer["window"] for layer in lean.layers}, k > 1, block)
        H, KV, hd = lean.n_heads, lean.n_kv, lean.head_dim
        G = H // KV
        flat = valid.reshape(-1)
        idx = None if bool(flat.all()) else flat.nonzero().squeeze(1)   # the valid tokens, where there are holes

        def spread(t: torch.Tensor) -> torch.Tensor:  # [M, n] on the valid tokens -> [R k, n], holes zero
            if idx is None:
                return t
            full = t.new_zeros(R * k, t.shape[1])
            full[idx] = t
            return full

        x = lean._embed(ids.reshape(-1) if idx is None else ids.reshape(-1)[idx])   # [M, d]
        for i, (layer, kv) in enumerate(zip(lean.layers, self._kv)):
            n = lean._rms(x, layer["ln1"])
            qkv = spread(self._linear(i, "qkv", n)).view(R, k, H + 2 * KV, hd).transpose(1, 2)  # [R, H+2KV, k, hd]
            q, kk, v = qkv[:, :H], qkv[:, H:H + KV], qkv[:, H + KV:]
            if "qk_norm" in layer:  # Gemma-3: each query and key head RMS-normed before rotation
                q_gain, k_gain, eps = layer["qk_norm"]
                q, kk = lean._rms(q, (q_gain, eps)), lean._rms(kk, (k_gain, eps))
            cos, sin = lean._cos[layer["rope"]][positions][:, None], lean._sin[layer["rope"]][positions][:, None]
            q, kk = lean._rope(q, cos, sin), lean._rope(kk, cos, sin)
            kv[0, :, :, S0:S1] = kk
            kv[1, :, :, S0:S1] = v
            if k > 1:
                att = F.scaled_dot_product_attention(q, kv[0, :, :, :S1], kv[1, :, :, :S1],
                                                     attn_mask=masks[layer["window"]], scale=lean.scaling,
                                                     enable_gqa=G > 1)           # [R, H, k, hd]
            else:
                scores = torch.matmul(q.reshape(R, KV, G * k, hd), kv[0, :, :, :S1].transpose(-1, -2))
                if lean.scaling != 1.0:
                    scores = scores * lean.scaling
                scores = scores + masks[layer["window"]]
                att = torch.matmul(scores.softmax(dim=-1, dtype=torch.float32).to(self.dtype), kv[1, :, :, :S1])
            att = att.reshape(R, H, k, hd).transpose(1, 2).reshape(R * k, H * hd)
            att = self._linear(i, "o", att if idx is None else att[idx])
            x = x + (lean._rms(att, layer["post_attn"]) if "post_attn" in layer else att)
            m = lean._rms(x, layer["ln2"])
            gate, up = self._linear(i, "gate_up", m).chunk(2, dim=-1)
            y = self._linear(i, "down", lean._act(gate) * up)
            x = x + (lean._rms(y, layer["post_mlp"]) if "post_mlp" in layer else y)
        self.mask, self.pos = key_valid, key_pos
        self.length = self.length + valid_l.sum(dim=-1)
        x = spread(x).view(R, k, -1)
        if keep:
            x = x[:, -keep:]
        out = self._linear(len(lean.layers), "lm_head", lean._rms(x.reshape(-1, x.shape[-1]), lean.norm))
        return lean._logits(out).view(R, x.shape[1], -1)

    def truncate(self, slots: int) -> None:
        """Forget every slot after the first ``slots`` (a timing loop's rollback; the KV buffer keeps its capacity,
        the next :meth:`forward` overwrites the forgotten slots)."""
        if isinstance(slots, bool) or not isinstance(slots, int) or not 0 <= slots <= self.slots:
            raise ValueError(f"slots: an integer in [0, {self.slots}], got {slots!r}")
        self.mask, self.pos = self.mask[:, :slots], self.pos[:, :slots]
        self.length = self.mask.sum(dim=1)

    def _select_kv(self, rows: torch.Tensor) -> None:
        self._kv = [kv[:, rows] for kv in self._kv]

    def _crop_kv(self, last: int) -> None:
        """Nothing to move: the buffer keeps its capacity and the next forward overwrites the cropped slots."""

    def _gather_kv(self, idx: torch.Tensor) -> None:
        R, width = idx.shape
        for kv in self._kv:
            gi = idx[None, :, None, :, None].expand(2, R, kv.shape[2], width, kv.shape[4])
            kv[:, :, :, :width] = kv[:, :, :, :self.slots].gather(3, gi)
