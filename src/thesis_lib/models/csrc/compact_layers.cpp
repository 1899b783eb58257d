// The decoder layers of a compact step (models/compact.py) in one call, for models whose products are all
// int8- or int4-dynamic: per layer the very calls the Python loop of CompactStep.hidden makes, in its order, on
// the same tensors (the fused norm, rotary and attention of decode_ops.cpp, the products of weight_only.cpp,
// aten's add, silu and mul), so the hidden states are the Python loop's bit for bit, without Python and the
// bindings' argument handling between the two dozen calls a layer makes.
#include <torch/extension.h>
#include <vector>

#include "checks.h"
#include "kernels.h"

namespace {

// a layer's tensors in `weights`, in this order; an absent one (a bias, Qwen2's query and key norms) is empty
enum Slot { kNorm1, kQkv, kQkvScale, kQkvBias, kQNorm, kKNorm, kO, kOScale, kOBias, kNorm2, kGateUp, kGateUpScale,
            kGateUpBias, kDown, kDownScale, kDownBias, kSlots };

c10::optional<torch::Tensor> given(const torch::Tensor& t) {
  return t.numel() ? c10::optional<torch::Tensor>(t) : c10::nullopt;
}

}  // namespace

// x [1, n, D] (the embedded tokens), cos and sin [1, n, d]; keys[i], values[i] [1, Hkv, capacity, d] each layer's
// preallocated cache, holding `start` positions; weights: kSlots tensors per layer; dims: Hq, Hkv, d, the query
// and key widths' split of the joint product (q, k, v outputs), the MLP's width, and 1 for int4-dynamic products
// (0: int8-dynamic). Writes the block's keys and values at start .. start + n - 1 and returns the last layer's
// output [1, n, D] (before the final norm).
torch::Tensor compact_layers(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> keys,
                             std::vector<torch::Tensor> values, std::vector<torch::Tensor> weights,
                             std::vector<int64_t> dims, int64_t start, double eps, double scale, int64_t path) {
  const char* fn = "compact_layers";
  const int64_t layers = static_cast<int64_t>(keys.size());
  TORCH_CHECK(values.size() == keys.size() && static_cast<int64_t>(weights.size()) == layers * kSlots &&
                  dims.size() == 8, "compact_layers: one cache and ", kSlots, " tensors per layer, 8 dims");
  const int64_t h = dims[0], hkv = dims[1], d = dims[2], nq = dims[3], nk = dims[4], nv = dims[5], inter = dims[6];
  const bool int4 = dims[7] != 0;
  for (int64_t i = 0; i < 7; ++i) TORCH_CHECK(dims[i] > 0, fn, ": dims[", i, "] must be positive, not ", dims[i]);
  TORCH_CHECK(nq == h * d && nk == hkv * d && nv == nk, "compact_layers: dims' widths differ from their heads");
  checks::tensor(fn, "x", x, {torch::kFloat32}, 3);
  checks::tensor(fn, "cos", cos, {torch::kFloat32}, 3);
  checks::tensor(fn, "sin", sin, {torch::kFloat32}, 3);
  TORCH_CHECK(x.size(0) == 1, "compact_layers: x must be one sequence [1, n, D]");
  const int64_t n = x.size(1);
  checks::positive(fn, "x's block length", n);
  for (int64_t i = 0; i < layers; ++i) {
    checks::tensor(fn, {"keys", i}, keys[i], {torch::kFloat32}, 4, true);  // written in place
    checks::tensor(fn, {"values", i}, values[i], {torch::kFloat32}, 4, true);
    TORCH_CHECK(keys[i].size(0) == 1 && keys[i].size(1) == hkv && keys[i].size(3) == d &&
                    values[i].sizes() == keys[i].sizes(), fn,
                ": keys[", i, "] and values[", i, "] must be [1, Hkv, capacity, d]");
    checks::window(fn, start, n, keys[i].size(2));  // before any position of the cache is written
    for (int64_t j = 0; j < kSlots; ++j) {
      const bool norm = j == kNorm1 || j == kQNorm || j == kKNorm || j == kNorm2;
      const bool scale = j == kQkvScale || j == kOScale || j == kGateUpScale || j == kDownScale;
      const bool packed = j == kQkv || j == kO || j == kGateUp || j == kDown;
      checks::tensor(fn, {"weights", i * kSlots + j}, weights[i * kSlots + j],
                     {packed ? torch::kUInt8 : scale && int4 ? torch::kBFloat16 : torch::kFloat32}, norm || packed ? 1 : -1,
                     true);
    }
  }
  const int64_t end = start + n;
  auto product = [&](const torch::Tensor& rows, const torch::Tensor* w, int64_t N) {
    return int4 ? linear_dynamic4(rows, w[0], N, w[1], given(w[2]), path)
                : linear_dynamic(rows, w[0], N, w[1], given(w[2]), path);
  };
  for (int64_t i = 0; i < layers; ++i) {
    const torch::Tensor* w = weights.data() + i * kSlots;
    auto rows = rms_norm(x, w[kNorm1], eps).view({n, -1});
    auto qkv = product(rows, w + kQkv, nq + nk + nv).split_with_sizes({nq, nk, nv}, 1);
    auto q = qkv[0].view({1, n, h, d}), kk = qkv[1].view({1, n, hkv, d});
    if (w[kQNorm].numel()) {
      q = rms_norm(q, w[kQNorm], eps);
      kk = rms_norm(kk, w[kKNorm], eps);
    }
    auto rotated = rotary(q.transpose(1, 2), kk.transpose(1, 2), cos, sin);
    keys[i].slice(2, start, end).copy_(rotated[1]);
    values[i].slice(2, start, end).copy_(qkv[2].view({1, n, hkv, d}).transpose(1, 2));
    auto att = attend_causal(rotated[0], keys[i].slice(2, 0, end), values[i].slice(2, 0, end), scale, start);
    x = x + product(att.reshape({n, h * d}), w + kO, x.size(2)).view({1, n, -1});
    auto gate_up = product(rms_norm(x, w[kNorm2], eps).view({n, -1}), w + kGateUp, 2 * inter)
                       .split_with_sizes({inter, inter}, 1);
    auto gate = gate_up[0], up = gate_up[1];
    if (n > 1) {
      gate = gate.contiguous();
      up = up.contiguous();
    }
    x = x + product(at::silu(gate) * up, w + kDown, x.size(2)).view({1, n, -1});
  }
  return x;
}
