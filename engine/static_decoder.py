"""One-token decode step of a Llama-family model with fixed shapes, over the slot KV cache.

Why our own step instead of the model's ``forward``: a CUDA graph replays fixed kernels on fixed
buffers. transformers' forward varies shapes with the attended length, builds masks with Python
logic, and costs ~450 launches per step, which is what made the eager engine ~80-100 ms a step
at any batch. This step reads the *same* weights (the model's own modules: norms, projections,
MLP, rotary embedding) and the *same* ``SlotKVCache`` buffers the eager prefill writes, with
shapes fixed by (rows, attended length), so it can be captured once per bucket and replayed.
Between the GEMMs each layer runs four fused kernels from ``kernels.decode`` (residual add +
RMSNorm, rotary + K/V cache write, attention, SiLU-times-up) instead of ~40 small torch ops: at
batch 1 the launches, not the weight reads, were what kept the step far from its floor.

The same code runs eagerly on the CPU (tests compare it with the eager ragged forward), so the
graph layer on top of it stays thin.

Supported: decoder-only models whose layers are ``input_layernorm -> self_attn(q,k,v,o_proj)
-> post_attention_layernorm -> mlp`` with rotary embeddings and no sliding window or logit
soft-capping (Llama, SmolLM2, Mistral without sliding window, Qwen2, Qwen3 with q/k norms).
``supports(model)`` says whether a model qualifies; others use the eager path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from constrain.engine.kv_cache import SlotKVCache
from constrain.kernels.decode import add_rms_norm, decode_attention, rope_store_kv, silu_mul

if TYPE_CHECKING:
    from constrain.engine.types import CausalLM

_FAMILIES = {"llama", "mistral", "qwen2", "qwen3"}


def supports(model: CausalLM) -> bool:
    """Whether ``StaticDecoder`` reproduces this model's forward."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in _FAMILIES:
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    if any(getattr(cfg, a, None) for a in ("final_logit_softcapping", "logit_scale")):
        return False
    rope = getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None) or {}
    return "dynamic" not in str(rope.get("rope_type", rope.get("type", "default")))


class StaticDecoder:
    """``step(ids, pos, length)``: append one token per row, return float32 logits per row.

    Row ``i`` is KV slot ``i`` (the engines keep live sequences compacted in slots 0..n-1).
    ``pos[i]`` is the cache column the new token goes to (= the sequence's length so far);
    positions at or past ``max_len`` write to the scratch column, so padding and finished rows
    can run along in a fixed-size batch without touching live data. Attention reads columns
    ``[0, length)`` of each slot, masked to ``<= pos``: ``length`` is a bucket, fixed per graph.
    """

    def __init__(self, model: CausalLM, cache: SlotKVCache) -> None:
        if not supports(model):
            raise ValueError(f"{type(model).__name__} is not a supported Llama-family model")
        dec = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.embed = dec.embed_tokens
        self.layers = list(dec.layers)
        self.final_norm = _norm_args(dec.norm)
        self.rotary = dec.rotary_emb
        self.head = model.get_output_embeddings()
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scale = self.head_dim ** -0.5
        self.cache = cache
        self.dtype = cache.keys[0].dtype
        self.qkv = [_fuse(l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj) for l in self.layers]
        self.gate_up = [_fuse(l.mlp.gate_proj, l.mlp.up_proj) if _plain_mlp(l.mlp) else None for l in self.layers]
        self.norms = [(_norm_args(l.input_layernorm), _norm_args(l.post_attention_layernorm)) for l in self.layers]
        self.silu = getattr(cfg, "hidden_act", None) == "silu"

    @torch.inference_mode()
    def step(self, ids: torch.Tensor, pos: torch.Tensor, length: int,
             slots: torch.Tensor | None = None, width: int = 1) -> torch.Tensor:
        """ids (B,) int64 (negative ids are read as 0), pos (B,) int64 -> logits (B, V) float32.

        ``slots`` (B,) maps row i to a KV slot (default: slot i). Several rows of one slot at
        consecutive positions append several tokens in one pass (forced text): every row's keys
        are stored before any row attends, and attention is masked to ``<= pos``. That path
        gathers the slots' cache columns for attention, so it runs eagerly, off the graphs.
        ``width`` > 1 (speculative verification) is that without the gather, in fixed shapes:
        row ``j * R + r`` (R = B // width) is the j-th token of slot r, and attention runs once
        per j over the slots' own cache (capturable).
        """
        b = ids.shape[0]
        cache = self.cache
        nh, nkv, hd = self.heads, self.kv_heads, self.head_dim
        write = pos.clamp(max=cache.scratch)  # past the end -> scratch column
        h = self.embed(ids.clamp(min=0))  # (B, hidden)
        cos, sin = self.rotary(h, pos.unsqueeze(1))  # (B, 1, hd)
        cos, sin = cos[:, 0], sin[:, 0]
        # Flat row index of (slot b, head j, column write[b]) in a (slots*kv, cols, hd) view.
        cols = cache.max_len + 1
        slot = torch.arange(b, device=ids.device) if slots is None else slots
        if width > 1:
            slot = slot % (b // width)
        slot_head = slot.view(b, 1) * nkv + torch.arange(nkv, device=ids.device)
        flat = (slot_head * cols + write.view(b, 1)).reshape(-1)
        delta = None  # what the last block adds to the residual stream h, folded into the next norm
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x, h = add_rms_norm(h, delta, *self.norms[i][0])
            qkv = F.linear(x, *self.qkv[i])
            if hasattr(attn, "q_norm"):  # Qwen3: per-head norms of q and k before rotary
                q, k, v = qkv.split((nh * hd, nkv * hd, nkv * hd), dim=-1)
                q, k = attn.q_norm(q.view(b, nh, hd)), attn.k_norm(k.reshape(b, nkv, hd))
                qkv = torch.cat((q.reshape(b, -1), k.reshape(b, -1), v), dim=-1)
            kb, vb = cache.keys[i], cache.values[i]
            q = rope_store_kv(qkv, cos, sin, kb.view(-1, hd), vb.view(-1, hd), flat, nh, nkv)
            if slots is not None:
                kb, vb = kb[slots, :, :length], vb[slots, :, :length]
            if width > 1:
                r = b // width
                delta = attn.o_proj(torch.cat([decode_attention(q[j * r:(j + 1) * r], kb, vb, pos[j * r:(j + 1) * r],
                                                                length, self.scale) for j in range(width)]))
            else:
                delta = attn.o_proj(decode_attention(q, kb, vb, pos, length, self.scale))
            x, h = add_rms_norm(h, delta, *self.norms[i][1])
            mlp, gate_up = layer.mlp, self.gate_up[i]
            if gate_up is None:
                delta = mlp(x)
            elif self.silu:
                delta = mlp.down_proj(silu_mul(F.linear(x, *gate_up)))
            else:
                gate, up = F.linear(x, *gate_up).chunk(2, dim=-1)
                delta = mlp.down_proj(mlp.act_fn(gate) * up)
        x, _ = add_rms_norm(h, delta, *self.final_norm)
        return self.head(x).float()


def _fuse(*linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight for several projections of the same input (one GEMM instead of 2-3: fewer
    launches, better bandwidth at small batch). The modules' own weights become views of the
    fused tensor, so no memory is duplicated and the eager path reads the same numbers."""
    weight = torch.cat([m.weight.data for m in linears])
    start = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight.data = weight[start:start + n]
        start += n
    if all(m.bias is None for m in linears):
        return weight, None
    bias = torch.cat([m.bias.data if m.bias is not None else weight.new_zeros(m.weight.shape[0]) for m in linears])
    return weight, bias


def _norm_args(norm: Any) -> tuple[torch.Tensor, float]:
    """(weight, eps) of a transformers RMSNorm (``weight * x / rms(x)``, as every family here)."""
    return norm.weight, float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _plain_mlp(mlp: Any) -> bool:
    """A gated MLP ``down(act(gate(x)) * up(x))`` with bias-free gate/up (Llama, Qwen, Mistral)."""
    return all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn"))
