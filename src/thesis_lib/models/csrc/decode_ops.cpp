// Fused float32 operations for CPU decoding: an RMS norm, the rotary embedding of queries and keys, and one
// query's attention over a cache, each one call where eager PyTorch dispatches six to a dozen operations.
//
// Every output row is computed by the same operations in the same order whatever the number of rows: a row of a
// block equals that row computed alone, bit for bit (the row-exactness that keeps greedy speculative output equal
// to target-only output). A sum adds its elements into 16 lanes by index, each lane in ascending order, then the
// lanes (in order for the norm; as a fixed tree in the attention, whose AVX-512 and AVX2 paths give the same
// bits). Rows (attention heads) are split between threads, never the work within one.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "checks.h"
#include "kernels.h"

namespace {

// threads only where a call has rows enough to pay for them
constexpr int64_t kRowsPerTask = 16;
// attention heads per thread's task
constexpr int64_t kHeadsPerTask = 4;
// lanes of a sum: element i goes to lane i % kLanes, the lanes are added in order at the end (a fixed order the
// compiler can keep in vector registers)
constexpr int kLanes = 16;

inline float dot(const float* a, const float* b, int64_t n) {
  float lane[kLanes] = {0.f};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) lane[l] += a[i] * b[i];
  float s = 0.f;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  return s;
}

}  // namespace

// x [..., D] float32, w [D] float32: x / sqrt(mean(x^2) + eps) * w, row by row.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  checks::tensor("rms_norm", "x", x, {torch::kFloat32});
  checks::tensor("rms_norm", "w", w, {torch::kFloat32});
  TORCH_CHECK(x.dim() >= 1, "rms_norm: x must have a last dimension");
  const int64_t D = x.size(-1);
  checks::positive("rms_norm", "x's last dimension", D);
  TORCH_CHECK(w.numel() == D, "rms_norm: w's width differs from x's rows'");
  auto xc = x.contiguous();
  auto wc = w.contiguous();
  auto y = torch::empty_like(xc);
  const int64_t rows = xc.numel() / D;
  const float* xp = xc.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * D;
      const float s = dot(xr, xr, D);
      const float inv = 1.f / std::sqrt(s / static_cast<float>(D) + e);
      float* yr = yp + r * D;
      for (int64_t i = 0; i < D; ++i) yr[i] = wp[i] * (xr[i] * inv);
    }
  });
  return y;
}

// q [B, Hq, S, d], k [B, Hk, S, d], cos and sin [B, S, d]: x * cos + rotate_half(x) * sin for both, where
// rotate_half(x) = (-x[d/2:], x[:d/2]).
std::vector<torch::Tensor> rotary(torch::Tensor q, torch::Tensor k, torch::Tensor cos, torch::Tensor sin) {
  checks::tensor("rotary", "q", q, {torch::kFloat32}, 4);
  checks::tensor("rotary", "k", k, {torch::kFloat32}, 4);
  checks::tensor("rotary", "cos", cos, {torch::kFloat32}, 3);
  checks::tensor("rotary", "sin", sin, {torch::kFloat32}, 3);
  const int64_t B = q.size(0), S = q.size(2), d = q.size(3), h = d / 2;
  TORCH_CHECK(d % 2 == 0 && k.size(0) == B && k.size(3) == d && cos.size(2) == d && cos.size(1) == S &&
                  k.size(2) == S && sin.sizes() == cos.sizes(), "rotary: shapes do not match (q, k [B, H, S, d]; cos, sin [B, S, d])");
  auto cc = cos.expand({B, S, d}).contiguous(), sc = sin.expand({B, S, d}).contiguous();
  std::vector<torch::Tensor> out;
  for (auto x : {q, k}) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t H = xc.size(1), rows = B * H * S;
    const float* xp = xc.data_ptr<float>();
    const float* cp = cc.data_ptr<float>();
    const float* sp = sc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, rows, kRowsPerTask, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / (H * S), s = r % S;
        const float* xr = xp + r * d;
        const float* cr = cp + (b * S + s) * d;
        const float* sr = sp + (b * S + s) * d;
        float* yr = yp + r * d;
        for (int64_t i = 0; i < h; ++i) {
          const float a = xr[i] * cr[i], c = -xr[i + h] * sr[i];
          yr[i] = a + c;
        }
        for (int64_t i = h; i < d; ++i) {
          const float a = xr[i] * cr[i], c = xr[i - h] * sr[i];
          yr[i] = a + c;
        }
      }
    });
    out.push_back(y);
  }
  return out;
}

namespace {

// ---- one query's attention: an AVX-512 path and an AVX2 path that compute the same bits ----
// Sums over lanes: element i goes to lane i % 16 (AVX2 holds the 16 lanes in two registers), each lane adds by
// fused multiply-adds (or adds) in ascending i, and the lanes are added as a tree: lane l + lane l + 8, then
// + 4, + 2, + 1. exp is one polynomial (below) evaluated lane by lane. Every operation is elementwise IEEE
// arithmetic in the same order on both paths.
#define DECODE_AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma")))
#define DECODE_AVX2 __attribute__((target("avx2,fma")))

// exp(x) for x <= 0 (x below -87 taken as -87; NaN stays NaN): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by a
// degree-6 polynomial, times 2^n built in the exponent bits
constexpr float kLog2e = 1.44269504f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f, kLowest = -87.0f;
constexpr float kP[7] = {1.f, 1.f, 0.5f, 0.166666672f, 4.16666418e-2f, 8.33336078e-3f, 1.38878932e-3f};

DECODE_AVX2 inline float hsum256(__m256 v) {  // the tree over 8 lanes (a 16-lane tree's last three steps)
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
  return _mm_cvtss_f32(t);
}

DECODE_AVX2 inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(kLowest), x);  // NaN passes (max returns its second operand)
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 e = _mm256_set1_ps(kP[6]);
  for (int c = 5; c >= 0; --c) e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(kP[c]));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(e, _mm256_castsi256_ps(pow2));
}

DECODE_AVX512 inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(kLowest), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 e = _mm512_set1_ps(kP[6]);
  for (int c = 5; c >= 0; --c) e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(kP[c]));
  const __m512i pow2 = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(e, _mm512_castsi512_ps(pow2));
}

// the 16 lanes lo (0-7) and hi (8-15) with elements from i to n added into lanes 0.. in order (by fused
// multiply-adds of a and b, or adds of a where b is null), then the tree
DECODE_AVX2 inline float finish256(__m256 lo, __m256 hi, const float* a, const float* b, int64_t i, int64_t n) {
  if (i < n) {
    alignas(32) float lane[16];
    _mm256_store_ps(lane, lo);
    _mm256_store_ps(lane + 8, hi);
    for (int l = 0; i < n; ++i, ++l) lane[l] = b ? std::fma(a[i], b[i], lane[l]) : lane[l] + a[i];
    lo = _mm256_load_ps(lane);
    hi = _mm256_load_ps(lane + 8);
  }
  return hsum256(_mm256_add_ps(lo, hi));
}

DECODE_AVX2 void attend_row256(const float* qr, const float* kr, int64_t ks, const float* vr, int64_t vs, int64_t L,
                               int64_t d, float sc, float* p, float* o) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < L; ++j) {
    const float* k = kr + j * ks;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
      lo = _mm256_fmadd_ps(_mm256_loadu_ps(qr + i), _mm256_loadu_ps(k + i), lo);
      hi = _mm256_fmadd_ps(_mm256_loadu_ps(qr + i + 8), _mm256_loadu_ps(k + i + 8), hi);
    }
    p[j] = finish256(lo, hi, qr, k, i, d) * sc;
    m = std::max(m, p[j]);
  }
  const int64_t Lp = (L + 15) / 16 * 16;  // p has room for Lp floats; entries past L are computed and ignored
  for (int64_t j = L; j < Lp; ++j) p[j] = 0.f;
  const __m256 mb = _mm256_set1_ps(m);
  __m256 zlo = _mm256_setzero_ps(), zhi = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= Lp; j += 16) {
    const __m256 e0 = exp256(_mm256_sub_ps(_mm256_loadu_ps(p + j), mb));
    const __m256 e1 = exp256(_mm256_sub_ps(_mm256_loadu_ps(p + j + 8), mb));
    _mm256_storeu_ps(p + j, e0);
    _mm256_storeu_ps(p + j + 8, e1);
    if (j + 16 <= L) {
      zlo = _mm256_add_ps(zlo, e0);
      zhi = _mm256_add_ps(zhi, e1);
    }
  }
  const float z = finish256(zlo, zhi, p, nullptr, L / 16 * 16, L);
  for (int64_t jj = 0; jj < L; ++jj) {
    const __m256 w = _mm256_set1_ps(p[jj]);
    const float* v = vr + jj * vs;
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) _mm256_storeu_ps(o + i, _mm256_fmadd_ps(w, _mm256_loadu_ps(v + i), _mm256_loadu_ps(o + i)));
    for (; i < d; ++i) o[i] = std::fma(p[jj], v[i], o[i]);
  }
  const __m256 zv = _mm256_set1_ps(z);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(o + i, _mm256_div_ps(_mm256_loadu_ps(o + i), zv));
  for (; i < d; ++i) o[i] = o[i] / z;
}

DECODE_AVX512 inline float finish512(__m512 acc, const float* a, const float* b, int64_t i, int64_t n) {
  if (i < n) {
    alignas(64) float lane[16];
    _mm512_store_ps(lane, acc);
    for (int l = 0; i < n; ++i, ++l) lane[l] = b ? std::fma(a[i], b[i], lane[l]) : lane[l] + a[i];
    acc = _mm512_load_ps(lane);
  }
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));  // lanes 8-15
  const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(acc), hi);
  __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  u = _mm_add_ps(u, _mm_movehl_ps(u, u));
  u = _mm_add_ss(u, _mm_shuffle_ps(u, u, 1));
  return _mm_cvtss_f32(u);
}

DECODE_AVX512 void attend_row512(const float* qr, const float* kr, int64_t ks, const float* vr, int64_t vs, int64_t L,
                                 int64_t d, float sc, float* p, float* o) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < L; ++j) {
    const float* k = kr + j * ks;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qr + i), _mm512_loadu_ps(k + i), acc);
    p[j] = finish512(acc, qr, k, i, d) * sc;
    m = std::max(m, p[j]);
  }
  const int64_t Lp = (L + 15) / 16 * 16;
  for (int64_t j = L; j < Lp; ++j) p[j] = 0.f;
  const __m512 mb = _mm512_set1_ps(m);
  __m512 zacc = _mm512_setzero_ps();
  for (int64_t j = 0; j + 16 <= Lp; j += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(p + j), mb));
    _mm512_storeu_ps(p + j, e);
    if (j + 16 <= L) zacc = _mm512_add_ps(zacc, e);
  }
  const float z = finish512(zacc, p, nullptr, L / 16 * 16, L);
  for (int64_t jj = 0; jj < L; ++jj) {
    const __m512 w = _mm512_set1_ps(p[jj]);
    const float* v = vr + jj * vs;
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) _mm512_storeu_ps(o + i, _mm512_fmadd_ps(w, _mm512_loadu_ps(v + i), _mm512_loadu_ps(o + i)));
    for (; i < d; ++i) o[i] = std::fma(p[jj], v[i], o[i]);
  }
  const __m512 zv = _mm512_set1_ps(z);
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) _mm512_storeu_ps(o + i, _mm512_div_ps(_mm512_loadu_ps(o + i), zv));
  for (; i < d; ++i) o[i] = o[i] / z;
}

// One query row qr over keys kr[j * ks] and values vr[j * vs], j < L: softmax(q k^T * sc) v into o (zeros on
// entry; o = sum of exp(s_j - max) v_j, then divided by the sum of the exps); p holds L rounded up to 16 floats.
// Every one-query attention of this file goes through this one function (never inlined), so a query gets the same
// bits whichever call computes it, on either path (w512: the AVX-512 path).
__attribute__((noinline)) void attend_row(const float* qr, const float* kr, int64_t ks, const float* vr, int64_t vs,
                                          int64_t L, int64_t d, float sc, float* p, float* o, bool w512) {
  if (w512) attend_row512(qr, kr, ks, vr, vs, L, d, sc, p, o);
  else attend_row256(qr, kr, ks, vr, vs, L, d, sc, p, o);
}

// the AVX-512 path where the CPU has it, unless THESIS_LIB_KERNEL_PATH=avx2 asks for the AVX2 path (as the weight
// kernels take it)
bool attention_wide() {
  const char* forced = std::getenv("THESIS_LIB_KERNEL_PATH");
  std::string f = forced ? forced : "";
  for (auto& c : f) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return avx512_path() && f != "avx2";
}

void check_qkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const char* what) {
  checks::tensor(what, "q", q, {torch::kFloat32}, 4);
  checks::tensor(what, "k", k, {torch::kFloat32}, 4);
  checks::tensor(what, "v", v, {torch::kFloat32}, 4);
  checks::positive(what, "k's head count", k.size(1));
  checks::positive(what, "the head width", q.size(3));
  TORCH_CHECK(v.sizes() == k.sizes() && k.size(0) == q.size(0) && k.size(3) == q.size(3) && q.size(1) % k.size(1) == 0,
              what, ": shapes do not match (q [B, Hq, n, d], k and v [B, Hk, L, d])");
}

}  // namespace

// q [B, Hq, 1, d], k and v [B, Hk, L, d] (Hq a multiple of Hk: grouped queries; any strides with the last
// dimension contiguous, so a prefix of a cache is read in place): softmax(q k^T * scale) v per head, as
// [B, 1, Hq, d] (the layout transformers' attention functions return).
torch::Tensor attend_one(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale) {
  check_qkv(q, k, v, "attend_one");
  TORCH_CHECK(q.size(2) == 1, "attend_one: one query");
  checks::positive("attend_one", "the cache's length", k.size(2));
  return attend_causal(q, k, v, scale, k.size(2) - 1);
}

// q [B, Hq, n, d], the queries of positions start .. start + n - 1; k and v [B, Hk, L, d] with L >= start + n:
// query j attends over keys 0 .. start + j, each (query, head) exactly as attend_one computes it alone. Returns
// [B, n, Hq, d]. One call for a verified block's queries instead of one per query.
torch::Tensor attend_causal(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale, int64_t start) {
  check_qkv(q, k, v, "attend_causal");
  const int64_t B = q.size(0), Hq = q.size(1), n = q.size(2), d = q.size(3), Hk = k.size(1);
  checks::window("attend_causal", start, n, k.size(2));
  checks::avx2("attend_causal");
  auto qc = q.contiguous();
  auto kc = k.stride(3) == 1 ? k : k.contiguous();
  auto vc = v.stride(3) == 1 ? v : v.contiguous();
  auto out = torch::zeros({B, n, Hq, d}, q.options());
  const float* qp = qc.data_ptr<float>();
  const float* kp = kc.data_ptr<float>();
  const float* vp = vc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t group = Hq / Hk;
  const float sc = static_cast<float>(scale);
  const bool w512 = attention_wide();
  at::parallel_for(0, B * Hq * n, kHeadsPerTask, [&](int64_t r0, int64_t r1) {
    std::vector<float> p(static_cast<size_t>((start + n + 15) / 16 * 16));
    for (int64_t r = r0; r < r1; ++r) {  // r = (b * Hq + hq) * n + j
      const int64_t j = r % n, bh = r / n, b = bh / Hq, hq = bh % Hq, hk = hq / group;
      attend_row(qp + r * d, kp + b * kc.stride(0) + hk * kc.stride(1), kc.stride(2),
                 vp + b * vc.stride(0) + hk * vc.stride(1), vc.stride(2), start + j + 1, d, sc, p.data(),
                 op + ((b * n + j) * Hq + hq) * d, w512);
    }
  });
  return out;
}
