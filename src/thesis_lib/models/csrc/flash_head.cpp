// FlashHead's greedy head on a CPU in one call (heads/cpu_kernels.py), for each row h of the hidden states:
//  1. every cluster's score h . c over the unit centroids: with bfloat16 centroids, h rounded to bfloat16 first and
//     the score rounded to bfloat16 after (a bfloat16 product's result), with float32 centroids in float32;
//  2. the n_probes best clusters, ties to the lower cluster index;
//  3. the exact float32 score of every row of those clusters (the head's rows, widened as read) and of the special
//     tokens, plus their bias (-inf: a slot that must never win);
//  4. the best candidate's token, ties to the lowest token id; a NaN score anywhere gives the sentinel (as the
//     compiled path's argmax does), and NaN cluster scores rank first (as torch.topk ranks them).
// Every dot product sums its products into kLanes lanes by index and the lanes in order: the same operations
// whatever the number of rows, and on every call. Threads split the clusters (1) and the probed clusters (3).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "checks.h"
#include "kernels.h"

namespace {

constexpr int kLanes = 16;

inline float widen(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float32 -> bfloat16, rounding to nearest even (as torch's .to(torch.bfloat16)); NaN stays NaN
inline uint16_t narrow(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// a dot product's elements from i (a multiple of kLanes) to n into their lanes, then the lanes in order
template <typename W> float finish(float* lane, const W* w, const float* x, int64_t i, int64_t n) {
  for (int l = 0; i < n; ++i, ++l) {
    const float wi = sizeof(W) == 2 ? widen(reinterpret_cast<const uint16_t*>(w)[i]) : reinterpret_cast<const float*>(w)[i];
    lane[l] = std::fma(wi, x[i], lane[l]);
  }
  float s = 0.f;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  return s;
}

#define HEAD_AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma")))
#define HEAD_AVX2 __attribute__((target("avx2,fma")))

// sum over i of w[i] * x[i], w bfloat16 (or float32), in kLanes lanes by index then the lanes in order
template <typename W> HEAD_AVX512 float dot512(const W* w, const float* x, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    __m512 wv;
    if constexpr (sizeof(W) == 2) {
      wv = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i))), 16));
    } else {
      wv = _mm512_loadu_ps(reinterpret_cast<const float*>(w + i));
    }
    acc = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + i), acc);
  }
  alignas(64) float lane[kLanes];
  _mm512_store_ps(lane, acc);
  return finish(lane, w, x, i, n);
}

// the same sum in two 8-lane halves of the same 16 lanes (lane l: elements i with i % 16 == l)
template <typename W> HEAD_AVX2 float dot256(const W* w, const float* x, int64_t n) {
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int half = 0; half < 2; ++half) {
      __m256 wv;
      if constexpr (sizeof(W) == 2) {
        wv = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i + 8 * half))), 16));
      } else {
        wv = _mm256_loadu_ps(reinterpret_cast<const float*>(w + i + 8 * half));
      }
      acc[half] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i + 8 * half), acc[half]);
    }
  }
  alignas(32) float lane[kLanes];
  _mm256_store_ps(lane, acc[0]);
  _mm256_store_ps(lane + 8, acc[1]);
  return finish(lane, w, x, i, n);
}

bool avx512() {
  static const bool v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return v;
}

// the path: AVX-512 where the CPU has it and the caller did not ask for AVX2 (the kernel's path argument 1)
template <typename W> float dot(const W* w, const float* x, int64_t n, bool wide) {
  return wide ? dot512(w, x, n) : dot256(w, x, n);
}

template <typename C, typename R>
int64_t greedy_row(const float* h, int64_t D, const C* cen, int64_t n_clusters, const R* rows, int64_t b,
                   const float* slot_bias, const int64_t* tokens, const R* sw, const float* sb, const int64_t* sids,
                   int64_t ns, int64_t p, int64_t sentinel, bool wide, std::vector<float>& scores,
                   std::vector<int32_t>& order, std::vector<float>& cand) {
  constexpr bool bf16 = sizeof(C) == 2;
  std::vector<float> hr(D);
  for (int64_t i = 0; i < D; ++i) hr[i] = bf16 ? widen(narrow(h[i])) : h[i];
  at::parallel_for(0, n_clusters, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const float s = dot(cen + c * D, hr.data(), D, wide);
      scores[c] = bf16 ? widen(narrow(s)) : s;
    }
  });
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int32_t c) { return std::isnan(scores[c]) ? std::numeric_limits<float>::infinity() : scores[c]; };
  auto better = [&](int32_t a, int32_t c) {
    const bool na = std::isnan(scores[a]), nc = std::isnan(scores[c]);
    if (na != nc) return na;  // NaN first
    return key(a) > key(c) || (key(a) == key(c) && a < c);
  };
  std::nth_element(order.begin(), order.begin() + (p - 1), order.end(), better);
  at::parallel_for(0, p, 16, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t c = order[q];
      for (int64_t j = 0; j < b; ++j) cand[q * b + j] = dot(rows + (c * b + j) * D, h, D, wide) + slot_bias[c * b + j];
    }
  });
  float best = -std::numeric_limits<float>::infinity();
  int64_t token = sentinel;
  bool nan = false;
  auto offer = [&](float s, int64_t t) {
    nan = nan || std::isnan(s);
    if (s > best || (s == best && t < token)) {
      best = s;
      token = t;
    }
  };
  for (int64_t q = 0; q < p; ++q)
    for (int64_t j = 0; j < b; ++j) offer(cand[q * b + j], tokens[order[q] * b + j]);
  for (int64_t k = 0; k < ns; ++k) offer(dot(sw + k * D, h, D, wide) + sb[k], sids[k]);
  return nan ? sentinel : token;
}

}  // namespace

// h [S, D] float32; centroids [C, D] (unit, bfloat16 or float32); rows [C, b, D] and special_w [ns, D] the head's
// rows (bfloat16 or float32, one dtype); slot_bias [C, b] and special_b [ns] float32; tokens [C, b] and
// special_ids [ns] int64, all on the CPU; path 0 = the CPU's best, 1 = AVX2. Returns [S] int64 token ids (the
// sentinel where a score is NaN; where every candidate scores -inf, the lowest of their ids).
torch::Tensor flash_greedy(torch::Tensor h, torch::Tensor centroids, torch::Tensor rows, torch::Tensor slot_bias,
                           torch::Tensor tokens, torch::Tensor special_w, torch::Tensor special_b,
                           torch::Tensor special_ids, int64_t n_probes, int64_t sentinel, int64_t path) {
  const char* fn = "flash_greedy";
  const auto heads = {torch::kBFloat16, torch::kFloat32};
  checks::tensor(fn, "h", h, {torch::kFloat32}, 2);
  checks::tensor(fn, "centroids", centroids, heads, 2, true);
  checks::tensor(fn, "rows", rows, heads, 3, true);
  checks::tensor(fn, "slot_bias", slot_bias, {torch::kFloat32}, 2, true);
  checks::tensor(fn, "tokens", tokens, {torch::kLong}, 2, true);
  checks::tensor(fn, "special_w", special_w, {rows.scalar_type()}, 2, true);
  checks::tensor(fn, "special_b", special_b, {torch::kFloat32}, 1, true);
  checks::tensor(fn, "special_ids", special_ids, {torch::kLong}, 1, true);
  const int64_t S = h.size(0), D = h.size(1), C = centroids.size(0), b = rows.size(1), ns = special_ids.numel();
  const auto cdt = centroids.scalar_type(), rdt = rows.scalar_type();
  checks::positive(fn, "h's width", D);
  checks::positive(fn, "rows' slots per cluster", b);
  TORCH_CHECK(centroids.size(1) == D && rows.size(0) == C && rows.size(2) == D && slot_bias.sizes() == tokens.sizes() &&
                  tokens.size(0) == C && tokens.size(1) == b && special_b.numel() == ns && special_w.size(0) == ns &&
                  (ns == 0 || special_w.size(1) == D),
              "flash_greedy: shapes do not match");
  TORCH_CHECK(n_probes >= 1 && n_probes <= C, "flash_greedy: n_probes must be in 1..C");
  checks::times(fn, "n_probes x slots", n_probes, b);
  checks::avx2(fn);
  auto hc = h.contiguous();
  auto out = torch::empty({S}, torch::kLong);
  int64_t* op = out.data_ptr<int64_t>();
  std::vector<float> scores(C), cand(n_probes * b);
  std::vector<int32_t> order(C);
  const bool wide = path == 0 && avx512();
  const float* sb = special_b.data_ptr<float>();
  const int64_t* sids = special_ids.data_ptr<int64_t>();
  const float* bias = slot_bias.data_ptr<float>();
  const int64_t* tok = tokens.data_ptr<int64_t>();
  for (int64_t s = 0; s < S; ++s) {
    const float* hp = hc.data_ptr<float>() + s * D;
    int64_t t;
    if (cdt == torch::kBFloat16 && rdt == torch::kBFloat16) {
      t = greedy_row(hp, D, reinterpret_cast<const uint16_t*>(centroids.data_ptr()), C,
                     reinterpret_cast<const uint16_t*>(rows.data_ptr()), b, bias, tok,
                     reinterpret_cast<const uint16_t*>(special_w.data_ptr()), sb, sids, ns, n_probes, sentinel, wide,
                     scores, order, cand);
    } else if (cdt == torch::kBFloat16) {
      t = greedy_row(hp, D, reinterpret_cast<const uint16_t*>(centroids.data_ptr()), C, rows.data_ptr<float>(), b,
                     bias, tok, special_w.data_ptr<float>(), sb, sids, ns, n_probes, sentinel, wide, scores, order, cand);
    } else if (rdt == torch::kBFloat16) {
      t = greedy_row(hp, D, centroids.data_ptr<float>(), C, reinterpret_cast<const uint16_t*>(rows.data_ptr()), b,
                     bias, tok, reinterpret_cast<const uint16_t*>(special_w.data_ptr()), sb, sids, ns, n_probes,
                     sentinel, wide, scores, order, cand);
    } else {
      t = greedy_row(hp, D, centroids.data_ptr<float>(), C, rows.data_ptr<float>(), b, bias, tok,
                     special_w.data_ptr<float>(), sb, sids, ns, n_probes, sentinel, wide, scores, order, cand);
    }
    op[s] = t;
  }
  return out;
}
