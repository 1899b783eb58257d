// The kernel module's functions, as each source defines them and the module exports them (weight_only.cpp's
// PYBIND11_MODULE): one declaration each, included by every source that defines or calls one.
#pragma once
#include <torch/extension.h>
#include <vector>

// weight_only.cpp: the low-byte products and their layouts, and which paths this CPU runs
torch::Tensor pack(torch::Tensor w);
torch::Tensor linear(torch::Tensor x, torch::Tensor packed, int64_t N, c10::optional<torch::Tensor> scale,
                     c10::optional<torch::Tensor> bias, int64_t path);
torch::Tensor pack_dynamic(torch::Tensor w);
torch::Tensor linear_dynamic(torch::Tensor x, torch::Tensor packed, int64_t N, torch::Tensor scale,
                             c10::optional<torch::Tensor> bias, int64_t path);
torch::Tensor linear_dynamic4(torch::Tensor x, torch::Tensor packed, int64_t N, torch::Tensor scales,
                              c10::optional<torch::Tensor> bias, int64_t path);
bool vnni_path();
bool avx512_path();

// decode_ops.cpp: the fused float32 norm, rotary embedding and attention
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
std::vector<torch::Tensor> rotary(torch::Tensor q, torch::Tensor k, torch::Tensor cos, torch::Tensor sin);
torch::Tensor attend_one(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale);
torch::Tensor attend_causal(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale, int64_t start);

// compact_layers.cpp: a compact step's decoder layers in one call
torch::Tensor compact_layers(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> keys,
                             std::vector<torch::Tensor> values, std::vector<torch::Tensor> weights,
                             std::vector<int64_t> dims, int64_t start, double eps, double scale, int64_t path);

// flash_head.cpp: FlashHead's greedy head
torch::Tensor flash_greedy(torch::Tensor h, torch::Tensor centroids, torch::Tensor rows, torch::Tensor slot_bias,
                           torch::Tensor tokens, torch::Tensor special_w, torch::Tensor special_b,
                           torch::Tensor special_ids, int64_t n_probes, int64_t sentinel, int64_t path);
