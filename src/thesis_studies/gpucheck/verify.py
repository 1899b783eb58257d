"""The target's verify cost on a GPU for ``thesis-lib studies gpu-check``: the forward over a block of n tokens against
one token's, at Qwen3-32B's shapes with random weights.

:func:`verify_check`: a stack with fewer layers in bfloat16, two curves: eager transformers timed by the wall
clock (bound by the host's kernel launches at these sizes, and noisy), and, on a GPU, each block length's
forward captured in a CUDA graph over a static KV cache and timed by CUDA events. :func:`verify_int4_check`: all
64 layers with 4-bit weights (:class:`Int4Linear`: torch's tinygemm kernel ``torch._weight_int4pack_mm``,
group-wise scales and zero points; not the thesis' AWQ kernels), the bfloat16 head and its argmax included: the
whole target step and its verify blocks, captured and timed likewise (what the speedup model's ``v`` and the
draft's cost ratio need).
"""

from __future__ import annotations


import torch

from thesis_lib.decoding.costs import forward_curves
from thesis_lib.decoding.state import ModelState
from thesis_lib.models.specs import QWEN3_CONFIGS
from thesis_studies.gpucheck.graphs import capture
from thesis_lib.bench.timing import interleaved, stats_ms


def qwen3_config(shape: dict, layers: int):
    """The transformers ``Qwen3Config`` of ``shape`` (a :data:`~thesis_lib.models.specs.QWEN3_CONFIGS` entry) with
    ``layers`` layers."""
    from transformers import Qwen3Config

    # the layer count goes in at construction: transformers derives per-layer fields (layer_types, which sizes the
    # KV cache) from it there, and some versions do not follow a later assignment
    return Qwen3Config(**{**{k: v for k, v in shape.items() if k != "model_type"}, "num_hidden_layers": layers})


def qwen3(shape: dict, layers: int, device: str, dtype=torch.bfloat16, seed: int = 0):
    """A random Qwen3 causal LM of ``shape`` with ``layers`` layers, built on ``device`` directly in ``dtype``.

    Built without transformers' and torch's initialisation (on a CPU, drawing the ~2e9 normal values of a
    Qwen3-32B-shaped embedding, head and layer took 34 s of gpu-check's quick run): norms get ones, every
    other weight a seeded normal block of 2**22 values at the config's ``initializer_range``, repeated over the
    tensor from an offset of its own. The values are at the scale transformers would draw; they only feed
    latency measurements. The rotary frequencies stay float32, as in a checkpoint loaded in ``dtype``."""
    from transformers import Qwen3ForCausalLM
    from transformers.initialization import no_init_weights

    cfg = qwen3_config(shape, layers)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), no_init_weights():
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    model.tie_weights()  # init_weights, skipped above, also ties the embedding and head where the config says so
    size = 1 << 22
    block = torch.randn(size, generator=torch.Generator().manual_seed(seed)) * cfg.initializer_range
    block = block.to(device=device, dtype=dtype).repeat(2)
    with torch.no_grad():
        for i, (name, param) in enumerate(model.named_parameters()):  # a tied weight once
            flat = param.view(-1)
            if name.endswith("norm.weight"):
                flat.fill_(1.0)
                continue
            offset = (i * 1_000_003) % size  # each tensor starts elsewhere in the block
            for start in range(0, flat.numel(), size):
                part = flat[start:start + size]
                part.copy_(block[offset:offset + part.numel()])
    return model.eval()


class Int4Linear(torch.nn.Module):
    """A bias-free linear layer with 4-bit weights: ``torch._weight_int4pack_mm`` (tinygemm, CUDA, bfloat16
    activations) over packed weights with one bfloat16 scale and zero point per ``group`` inputs."""

    def __init__(self, in_features: int, out_features: int, *, group: int = 128, inner_k_tiles: int = 8,
                 device=None):
        super().__init__()
        if in_features % (inner_k_tiles * 16) or out_features % 8 or in_features % group:
            raise ValueError(f"a {in_features} -> {out_features} layer has no int4 packing with groups of {group}")
        self.in_features, self.out_features, self.group = in_features, out_features, group
        packed = (out_features // 8, in_features // (inner_k_tiles * 16), 32, inner_k_tiles // 2)
        self.register_buffer("weight", torch.empty(packed, dtype=torch.int32, device=device))
        self.register_buffer("scales_and_zeros", torch.empty(in_features // group, out_features, 2,
                                                             dtype=torch.bfloat16, device=device))

    def fill(self, generator: torch.Generator, scale: float) -> None:
        """Random 4-bit weights of about ``scale`` around zero (the kernel reads ``(q - 8) * scale + zero``, q in
        0..15): latency work only."""
        raw = torch.randint(0, 256, (self.out_features, self.in_features // 2), dtype=torch.uint8,
                            device=self.weight.device, generator=generator)
        self.weight.copy_(torch._convert_weight_to_int4pack(raw, self.weight.shape[-1] * 2))
        self.scales_and_zeros[..., 0].fill_(scale / 4)
        self.scales_and_zeros[..., 1].fill_(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        out = torch._weight_int4pack_mm(flat, self.weight, self.group, self.scales_and_zeros)
        return out.reshape(*x.shape[:-1], self.out_features)


def qwen3_int4(shape: dict, layers: int, device: str, seed: int = 0):
    """A random Qwen3 causal LM of ``shape`` whose decoder layers' linear layers are :class:`Int4Linear`
    (embedding, norms and head in bfloat16, as an AWQ checkpoint keeps them), built on the meta device and
    materialised on ``device`` at 4 bits (a Qwen3-32B-shaped stack needs about 19 GB, not 65)."""
    from transformers import Qwen3ForCausalLM

    cfg = qwen3_config(shape, layers)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = Qwen3ForCausalLM(cfg)
            for layer in model.model.layers:
                for parent in (layer.self_attn, layer.mlp):
                    for name, child in list(parent.named_children()):
                        if isinstance(child, torch.nn.Linear):
                            setattr(parent, name, Int4Linear(child.in_features, child.out_features))
    finally:
        torch.set_default_dtype(default)
    model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, cfg.initializer_range, generator=g)
        for module in model.modules():
            if isinstance(module, Int4Linear):
                module.fill(g, cfg.initializer_range)
    rotary = model.model.rotary_emb  # its frequencies were on the meta device: computed again, in float32
    with torch.device(device):
        model.model.rotary_emb = type(rotary)(config=cfg)
    return model.eval()


@torch.inference_mode()
def verify_check(device: str, *, layers: int, reps: int, context: int, max_block: int = 13,
                 shape: dict = QWEN3_CONFIGS["Qwen3-32B"]) -> dict:
    """The forward over a block of n tokens over one step's, n = 1..max_block, on a Qwen3-32B-shaped stack."""
    model = qwen3(shape, layers, device)
    curve = forward_curves({"target": ModelState(model, buckets={})}, list(range(200, 200 + context)),
                           range(1, max_block + 1), reps=reps, warmup=1, head=False)["target"]
    ms = {n: 1000 * s for n, s in curve.items()}
    out = {"layers": layers, "context": context, "how": "eager transformers, wall clock around each call",
           "ms": ms, "over_step": {n: v / ms[1] for n, v in ms.items()}}
    if device.startswith("cuda"):
        captured = verify_captured(model, device, reps=reps, context=context, max_block=max_block)
        out = {**out, "captured_error": captured["error"]} if "error" in captured else {**captured, "eager": out}
    return out


@torch.inference_mode()
def verify_captured(model, device: str, *, reps: int, context: int, max_block: int, then=None) -> dict:
    """The verify curve with each block length's forward captured by hand in a CUDA graph over a static KV cache
    and timed by CUDA events: the device's cost of a block, without the host's launches (which bind the eager
    curve); ``then`` (the head, say) applied to the final-layer hidden states of every position of the block
    inside the graph. Returns the
    eager-shaped document with ``how``, or ``{"error": ...}``."""
    from transformers import StaticCache

    layers = model.config.num_hidden_layers
    try:
        cache = StaticCache(config=model.config, max_cache_len=context + max_block)
        ids = torch.arange(200, 200 + context + max_block, device=device)[None]
        model.model(input_ids=ids[:, :context], past_key_values=cache,
                    cache_position=torch.arange(context, device=device), use_cache=True)
        counters = [layer.cumulative_length for layer in getattr(cache, "layers", ())
                    if hasattr(layer, "cumulative_length")]

        def block(n: int):
            position = torch.arange(context, context + n, device=device)
            tokens = ids[:, context:context + n].clone()

            def forward():
                for counter in counters:  # every replay writes the same n cache slots after the context
                    counter.fill_(context)
                hidden = model.model(input_ids=tokens, past_key_values=cache, cache_position=position,
                                     use_cache=True).last_hidden_state
                return hidden if then is None else then(hidden)

            return capture(forward)

        fns = {n: block(n) for n in range(1, max_block + 1)}
    except Exception as exc:  # noqa: BLE001 - recorded; the eager curve stays the document's
        return {"error": f"{type(exc).__name__}: {str(exc)[:1000]}"}
    times = interleaved({str(n): f for n, f in fns.items()}, 1, reps=reps * 3, warmup=3, desc="verify (captured)",
                        progress=False, device=device)
    ms = {int(n): stats_ms(t)["p50_ms"] for n, t in times.items()}
    return {"layers": layers, "context": context, "how": "each block's forward captured in a CUDA graph, CUDA events",
            "ms": ms, "over_step": {n: v / ms[1] for n, v in ms.items()}}


@torch.inference_mode()
def verify_int4_check(device: str, *, layers: int = 64, reps: int, context: int, max_block: int = 16,
                      shape: dict = QWEN3_CONFIGS["Qwen3-32B"]) -> dict:
    """The whole target step of a random Qwen3-32B-shaped model with 4-bit weights (:func:`qwen3_int4`), its head
    and argmax included, over a block of n = 1..max_block tokens: each length captured in a CUDA graph, timed by
    CUDA events. Returns the curve (``ms``, ``over_step``) or ``{"error": ...}``."""
    try:
        model = qwen3_int4(shape, layers, device)
        weights_gb = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())) / 1e9
        head = model.get_output_embeddings()
        out = verify_captured(model, device, reps=reps, context=context, max_block=max_block,
                              then=lambda hidden: head(hidden).argmax(-1))
    except Exception as exc:  # noqa: BLE001 - recorded in the document and printed by the command
        return {"error": f"{type(exc).__name__}: {str(exc)[:1000]}"}
    return {**out, "weights_gb": weights_gb, "bits": 4, "group": 128,
            "how": f"{layers} layers with 4-bit weights (torch's tinygemm int4 kernel), head and argmax included; "
                   "each block's forward captured in a CUDA graph, CUDA events"}
