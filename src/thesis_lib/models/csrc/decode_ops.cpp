// Fused float32 operations for CPU decoding: an RMS norm, the rotary embedding of queries and keys, and one
// query's attention over a cache, each one call where eager PyTorch dispatches six to a dozen operations.
//
// Every output row is computed by the same operations in the same order whatever the number of rows, and every
// sum runs over its inputs in ascending order: a row of a block equals that row computed alone, bit for bit (the
// row-exactness that keeps greedy speculative output equal to target-only output): a sum adds its elements into
// 16 lanes by index and the lanes in order. Rows (attention heads) are split between threads, never the work
// within one.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <limits>
#include <vector>

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
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kFloat32, "rms_norm: float32 only");
  const int64_t D = x.size(-1);
  TORCH_CHECK(w.numel() == D, "rms_norm: the weight's width differs from the rows'");
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
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && cos.dim() == 3 && sin.dim() == 3, "rotary: q, k [B, H, S, d]; cos, sin [B, S, d]");
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k.scalar_type() == torch::kFloat32 &&
                  cos.scalar_type() == torch::kFloat32 && sin.scalar_type() == torch::kFloat32,
              "rotary: float32 only");
  const int64_t B = q.size(0), S = q.size(2), d = q.size(3), h = d / 2;
  TORCH_CHECK(d % 2 == 0 && k.size(0) == B && k.size(3) == d && cos.size(2) == d && cos.size(1) == S &&
                  k.size(2) == S, "rotary: shapes do not match");
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

// One query row qr over keys kr[j * ks] and values vr[j * vs], j < L: softmax(q k^T * sc) v added into o (zeros
// on entry); p holds L floats. Every one-query attention of this file goes through this one function (never
// inlined), so a query gets the same bits whichever call computes it.
__attribute__((noinline)) void attend_row(const float* qr, const float* kr, int64_t ks, const float* vr, int64_t vs,
                                          int64_t L, int64_t d, float sc, float* p, float* o) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < L; ++j) {
    p[j] = dot(qr, kr + j * ks, d) * sc;
    m = std::max(m, p[j]);
  }
  float z = 0.f;
  for (int64_t j = 0; j < L; ++j) {
    p[j] = std::exp(p[j] - m);
    z += p[j];
  }
  for (int64_t j = 0; j < L; ++j) {
    const float w = p[j] / z;
    for (int64_t i = 0; i < d; ++i) o[i] += w * vr[j * vs + i];
  }
}

void check_qkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const char* what) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(), what, ": q [B, Hq, n, d], k and v [B, Hk, L, d]");
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k.scalar_type() == torch::kFloat32 &&
                  v.scalar_type() == torch::kFloat32, what, ": float32 only");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(3) == q.size(3) && q.size(1) % k.size(1) == 0, what,
              ": shapes do not match");
}

}  // namespace

torch::Tensor attend_causal(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale, int64_t start);

// q [B, Hq, 1, d], k and v [B, Hk, L, d] (Hq a multiple of Hk: grouped queries; any strides with the last
// dimension contiguous, so a prefix of a cache is read in place): softmax(q k^T * scale) v per head, as
// [B, 1, Hq, d] (the layout transformers' attention functions return).
torch::Tensor attend_one(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale) {
  check_qkv(q, k, v, "attend_one");
  TORCH_CHECK(q.size(2) == 1, "attend_one: one query");
  return attend_causal(q, k, v, scale, k.size(2) - 1);
}

// q [B, Hq, n, d], the queries of positions start .. start + n - 1; k and v [B, Hk, L, d] with L >= start + n:
// query j attends over keys 0 .. start + j, each (query, head) exactly as attend_one computes it alone. Returns
// [B, n, Hq, d]. One call for a verified block's queries instead of one per query.
torch::Tensor attend_causal(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale, int64_t start) {
  check_qkv(q, k, v, "attend_causal");
  const int64_t B = q.size(0), Hq = q.size(1), n = q.size(2), d = q.size(3), Hk = k.size(1);
  TORCH_CHECK(start >= 0 && k.size(2) >= start + n, "attend_causal: the cache holds fewer keys than the queries see");
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
  at::parallel_for(0, B * Hq * n, kHeadsPerTask, [&](int64_t r0, int64_t r1) {
    std::vector<float> p(static_cast<size_t>(start + n));
    for (int64_t r = r0; r < r1; ++r) {  // r = (b * Hq + hq) * n + j
      const int64_t j = r % n, bh = r / n, b = bh / Hq, hq = bh % Hq, hk = hq / group;
      attend_row(qp + r * d, kp + b * kc.stride(0) + hk * kc.stride(1), kc.stride(2),
                 vp + b * vc.stride(0) + hk * vc.stride(1), vc.stride(2), start + j + 1, d, sc, p.data(),
                 op + ((b * n + j) * Hq + hq) * d);
    }
  });
  return out;
}
