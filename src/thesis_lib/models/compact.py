"""The decode step of a CPU model without transformers' modules: the same operations, called directly.

A one-token step of the embedded draft spends about a third of its time between its operations: module calls,
the causal mask's construction, the KV cache's concatenation (``torch.cat`` of every layer's keys and values, every
step), views and casts (the measurement log's step profile). :class:`CompactStep` runs a forward over tokens that
follow a cache as a short list of calls per layer: the RMS norm, **one** int8 product for the queries, keys and
values together (their packed rows concatenated: each output is computed as in its own layer, so the values are
the same), the rotary embedding, the new keys and values written into a preallocated cache (:class:`Storage`), the block's
queries each over its own prefix (one call), the output product, the residual, the norm, **one** product for
the gate and up projections, SiLU and the product, the down projection.

Every call is the one the model's own modules make (the fused kernels of :mod:`thesis_lib.models.fused`, aten's
``silu``, ``mul`` and ``add``) on the same values, so the hidden states equal the modules' bit for bit (tested):
greedy output, acceptance and every committed result stay as they were, only faster. A prefill (nothing cached
yet) goes through the modules, as before. The cache stays transformers' ``DynamicCache`` (the trees, the batches
and the memory count read it): its layers hold views of the preallocated storage, and a cache the modules grew
since (a token tree's forward) is copied in again before the next step.

Where every product is int8- or int4-dynamic (the CPU default), the layers' calls run in one call of the kernel
module (``compact_layers``, ``csrc/compact_layers.cpp``): the same calls in the same order from C++, so the same
values again, without the Python and dispatch between them (:data:`NATIVE` switches it off to time both).

:func:`for_model` gives the step of a model it applies to (a Qwen2 or Qwen3 float32 CPU model with the row-exact
attention and the fused operations, as the loader gives the CPU default) and None otherwise. :data:`ENABLED`
switches it off at run time for side-by-side timing; it also stands aside while the fused operations are off.
"""

from __future__ import annotations

import sys
import weakref

import torch

from . import fused, weight_only
from .attention import NAME as ROW_EXACT

#: whether :class:`~thesis_lib.decoding.state.ModelState` uses the compact step where it applies; read every step
ENABLED = True
#: the model kinds whose decoder layers :class:`CompactStep` mirrors
KINDS = ("qwen2", "qwen3")
#: whether a model whose products are all int8- or int4-dynamic runs its layers in one kernel call
#: (:func:`_native`); off, the same calls from Python (for side-by-side timing)
NATIVE = True
#: preallocated cache positions, in steps of this many
_CHUNK = 256


def enabled(on: bool):
    """Run a block with the compact step on or off (for side-by-side timing)."""
    return fused.switched(sys.modules[__name__], on)


def native(on: bool):
    """Run a block with the layers in one kernel call (:data:`NATIVE`) on or off (for side-by-side timing)."""
    return fused.switched(sys.modules[__name__], on, "NATIVE")


def why_not(model) -> str | None:
    """Why :class:`CompactStep` does not apply to ``model`` (None where it does)."""
    cfg = model.config
    if cfg.model_type not in KINDS:
        return f"model type {cfg.model_type!r} (the compact step mirrors {', '.join(KINDS)})"
    p = next(model.parameters())
    if p.device.type != "cpu" or model.get_decoder().embed_tokens.weight.dtype != torch.float32:
        return "not a float32 CPU model"
    if cfg._attn_implementation != ROW_EXACT:
        return f"attention {cfg._attn_implementation!r}, not the row-exact attention"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return "sliding-window layers"
    layers = model.get_decoder().layers
    if not all(isinstance(m, fused.FusedRMSNorm) for layer in layers
               for m in (layer.input_layernorm, layer.post_attention_layernorm)):
        return "its norms are not the fused ones"
    if not weight_only.available():
        return "the kernel module cannot be built"
    return None


#: each model's compact step, built once (keyed weakly: a deep copy of a model does not share its step)
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def for_model(model) -> CompactStep | None:
    """The compact step of ``model``, or None where :func:`why_not` says no (asked again at each call: a model
    converted since gets its own step)."""
    step = _STEPS.get(model)
    if step is None or step.source is not model.get_decoder().layers[0].self_attn.q_proj:
        step = CompactStep(model) if why_not(model) is None else None
        if step is not None:
            _STEPS[model] = step
    return step


def _norm(m):
    """An RMS norm as a function of its rows: the fused kernel for :class:`~thesis_lib.models.fused.FusedRMSNorm`."""
    if isinstance(m, fused.FusedRMSNorm):
        k, w, eps = weight_only.kernel(), m.stock.weight, m.eps
        return lambda x: k.rms_norm(x, w, eps)
    return m


def _product(layers):
    """One function of the rows ``[n, K]`` giving each of ``layers``' outputs (a tuple): one int8- or int4-dynamic
    product over the layers' packed rows concatenated where each is a :class:`WeightOnlyLinear` of one such format whose outputs
    fill whole packed groups (each output then computed exactly as in its own layer; the layers' buffers become
    views of the joint ones, so no byte is held twice), else each layer's own call. The function's ``joint``:
    ``(fmt, path, packed, scale, bias)`` of the one product, None where there is none."""
    sizes = [m.out_features for m in layers]
    fmt = getattr(layers[0], "fmt", None)
    if not all(isinstance(m, weight_only.WeightOnlyLinear) and m.fmt == fmt and m.out_features % 32 == 0
               and m.path == layers[0].path for m in layers) or fmt not in weight_only.DYNAMIC:
        def each(x):
            return tuple(m(x) for m in layers)

        each.joint = None
        return each
    k = weight_only.kernel()
    product = k.linear_dynamic if fmt == "int8-dynamic" else k.linear_dynamic4
    if len(layers) == 1:
        (m,) = layers
        packed, scale, bias = m.packed_weight, m.scale, m.packed_bias
    else:
        packed = torch.cat([m.packed_weight for m in layers])
        scale = torch.cat([m.scale for m in layers])
        bias = None if all(m.packed_bias is None for m in layers) else torch.cat(
            [m.packed_bias if m.packed_bias is not None else torch.zeros(m.out_features) for m in layers])
        at = 0
        for m in layers:  # the layers' own buffers: views of the joint ones
            size = m.packed_weight.numel()
            m.packed_weight = packed[at:at + size]
            at += size
        for name, joint in (("scale", scale), ("packed_bias", bias)):
            if joint is None:
                continue
            for m, part in zip(layers, joint.split([getattr(m, name).numel() if getattr(m, name) is not None
                                                    else m.out_features for m in layers])):
                if getattr(m, name) is not None:
                    setattr(m, name, part)
    n_out, path = sum(sizes), layers[0].path

    def joint(x):
        return product(x, packed, n_out, scale, bias, path).split(sizes, dim=1)

    joint.joint = (fmt, path, packed, scale, bias)
    return joint


def _native(body, layers, cfg) -> tuple | None:
    """``(weights, dims, eps, path)`` for the kernel's ``compact_layers`` (one call for all decoder layers, the same
    calls as :meth:`CompactStep.hidden`'s loop) where every product is joint and of one dynamic format, every norm
    fused with one epsilon and the activation SiLU; None otherwise (the loop runs)."""
    products = [layer[j].joint for layer in layers for j in (1, 4, 6, 8)]
    if any(p is None for p in products) or len({(p[0], p[1]) for p in products}) != 1 or any(
            layer[7] is not torch.nn.functional.silu for layer in layers):
        return None
    owners = [m for layer in body.layers for m in (layer.input_layernorm, getattr(layer.self_attn, "q_norm", None),
                                                    getattr(layer.self_attn, "k_norm", None),
                                                    layer.post_attention_layernorm) if m is not None]
    if not all(isinstance(m, fused.FusedRMSNorm) for m in owners) or len({m.eps for m in owners}) != 1:
        return None
    none = torch.empty(0)
    weights = []
    for layer, joints in zip(body.layers, (products[i:i + 4] for i in range(0, len(products), 4))):
        a = layer.self_attn
        (_, _, *qkv), (_, _, *o), (_, _, *gate_up), (_, _, *down) = joints
        qkv_norms = [a.q_norm.stock.weight, a.k_norm.stock.weight] if hasattr(a, "q_norm") else [none, none]
        weights += [layer.input_layernorm.stock.weight, *qkv[:2], _or(qkv[2], none), *qkv_norms, *o[:2], _or(o[2], none),
                    layer.post_attention_layernorm.stock.weight, *gate_up[:2], _or(gate_up[2], none), *down[:2],
                    _or(down[2], none)]
    first = body.layers[0]
    dims = [cfg.num_attention_heads, cfg.num_key_value_heads, first.self_attn.head_dim,
            first.self_attn.q_proj.out_features, first.self_attn.k_proj.out_features,
            first.self_attn.v_proj.out_features, first.mlp.gate_proj.out_features,
            int(products[0][0] == "int4-dynamic")]
    return weights, dims, float(owners[0].eps), products[0][1]


def _or(t, default):
    return default if t is None else t


def _act(m):
    """The MLP's activation as a function: aten's ``silu`` for transformers' SiLU (what its forward calls)."""
    return torch.nn.functional.silu if type(m).__name__ in ("SiLUActivation", "SiLU") else m


class Storage:
    """One cache's preallocated keys and values, ``[1, Hkv, capacity, d]`` per layer; the cache's layers hold
    views of it."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def adopt(self, layer, i: int, start: int, need: int, shape: tuple[int, int]) -> None:
        """Make cache ``layer`` (index ``i``) a view of this storage over its ``start`` positions, with room for
        ``need``: copied in where the layer holds a tensor of its own (a forward through the modules made it)."""
        if len(self.keys) <= i:
            self.keys.append(torch.empty(0))
            self.values.append(torch.empty(0))
        store_k = self.keys[i]
        fits = store_k.dim() == 4 and store_k.shape[2] >= need
        if fits and layer.keys.data_ptr() == store_k.data_ptr() and layer.keys.shape[2] == start:
            return
        if not fits:
            cap = -(-need // _CHUNK) * _CHUNK * (2 if store_k.dim() == 4 else 1)
            self.keys[i] = torch.empty(1, shape[0], cap, shape[1])
            self.values[i] = torch.empty(1, shape[0], cap, shape[1])
        self.keys[i][:, :, :start] = layer.keys
        self.values[i][:, :, :start] = layer.values
        layer.keys, layer.values = self.keys[i][:, :, :start], self.values[i][:, :, :start]


class CompactStep:
    """A Qwen2 or Qwen3 CPU model's forward over tokens that follow a cache, as direct calls (module docstring)."""

    def __init__(self, model):
        self.source = model.get_decoder().layers[0].self_attn.q_proj  # the layer it was built from
        body = model.get_decoder()
        cfg = model.config
        self.embed, self.rotary_emb, self.final_norm = body.embed_tokens, body.rotary_emb, _norm(body.norm)
        self.kernel = weight_only.kernel()
        first = body.layers[0].self_attn
        self.d = first.head_dim
        self.h = cfg.num_attention_heads
        self.hkv = cfg.num_key_value_heads
        self.scale = float(first.scaling)
        self.layers = []
        for layer in body.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((_norm(layer.input_layernorm), _product([a.q_proj, a.k_proj, a.v_proj]),
                                _norm(a.q_norm) if hasattr(a, "q_norm") else None,
                                _norm(a.k_norm) if hasattr(a, "k_norm") else None,
                                _product([a.o_proj]), _norm(layer.post_attention_layernorm),
                                _product([m.gate_proj, m.up_proj]), _act(m.act_fn), _product([m.down_proj])))
        self.native = _native(body, self.layers, cfg)
        # the rotary embedding's cos and sin of every position up to a capacity, computed by the module itself
        # (elementwise in the position, so a slice equals the module's output for those positions); only for the
        # default rotary kind, whose frequencies do not change with the length
        self.table = getattr(self.rotary_emb, "rope_type", None) == "default"
        self._cos = self._sin = None

    def rotary(self, x, start: int, n: int):
        """The rotary embedding's ``cos, sin [1, n, d]`` for positions ``start .. start + n - 1``."""
        if not self.table:
            return self.rotary_emb(x, torch.arange(start, start + n).unsqueeze(0))
        if self._cos is None or self._cos.shape[1] < start + n:
            cap = -(-(start + n) // _CHUNK) * _CHUNK * 2
            self._cos, self._sin = self.rotary_emb(x, torch.arange(cap).unsqueeze(0))
        return self._cos[:, start:start + n], self._sin[:, start:start + n]

    def _native_layers(self, x, cos, sin, cache, store: Storage, start: int, n: int):
        """The decoder layers as one call of the kernel's ``compact_layers`` (:func:`_native`)."""
        for i, layer in enumerate(cache.layers[:len(self.layers)]):
            store.adopt(layer, i, start, start + n, (self.hkv, self.d))
        weights, dims, eps, path = self.native
        x = self.kernel.compact_layers(x, cos, sin, store.keys, store.values, weights, dims, start, eps, self.scale,
                                       path)
        for i, layer in enumerate(cache.layers[:len(self.layers)]):
            layer.keys, layer.values = store.keys[i].narrow(2, 0, start + n), store.values[i].narrow(2, 0, start + n)
        return x

    def hidden(self, ids: torch.Tensor, cache, store: Storage) -> torch.Tensor:
        """Final hidden states ``[n, D]`` of ``ids [1, n]`` after the ``cache``'s positions (at least one), whose
        keys and values are appended to it (in ``store``)."""
        n = ids.shape[1]
        start = cache.get_seq_length()
        k = self.kernel
        x = self.embed(ids)  # [1, n, D]
        cos, sin = self.rotary(x, start, n)
        if self.native is not None and NATIVE:
            return self.final_norm(self._native_layers(x, cos, sin, cache, store, start, n))[0]
        h, hkv, d, scale = self.h, self.hkv, self.d, self.scale
        for i, (norm1, qkv, q_norm, k_norm, o_proj, norm2, gate_up, act, down) in enumerate(self.layers):
            layer = cache.layers[i]
            store.adopt(layer, i, start, start + n, (hkv, d))
            rows = norm1(x).view(n, -1)
            q, kk, v = qkv(rows)
            q, kk = q.view(1, n, h, d), kk.view(1, n, hkv, d)
            if q_norm is not None:
                q, kk = q_norm(q), k_norm(kk)
            q, kk = k.rotary(q.transpose(1, 2), kk.transpose(1, 2), cos, sin)
            keys, values = store.keys[i], store.values[i]
            keys[:, :, start:start + n] = kk
            values[:, :, start:start + n] = v.view(1, n, hkv, d).transpose(1, 2)
            # each query over its own prefix, as a one-token step attends (one call for the block)
            att = k.attend_causal(q, keys[:, :, :start + n], values[:, :, :start + n], scale, start)
            layer.keys, layer.values = keys[:, :, :start + n], values[:, :, :start + n]
            x = x + o_proj(att.reshape(n, h * d))[0].view(1, n, -1)
            gate, up = gate_up(norm2(x).view(n, -1))
            if n > 1:  # as the modules' separate products give them
                gate, up = gate.contiguous(), up.contiguous()
            x = x + down(act(gate) * up)[0].view(1, n, -1)
        return self.final_norm(x)[0]
