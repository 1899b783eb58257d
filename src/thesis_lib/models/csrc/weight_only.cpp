// Weight-only linear layers for CPU decoding: y = x @ (W * scale)^T + b with W stored in bfloat16 or int8
// (one float32 scale per output row), x and y in float32. A decode step reads every weight once, so fewer
// bytes per weight shorten it; the products are computed in float32 whatever the CPU supports.
//
// Each output element is one chain of fused multiply-adds over the input dimension in ascending order, in
// vector lanes of fixed width, reduced across lanes in a fixed order: the same operations whatever the number of
// rows in x and however rows are grouped, so each row of a block equals that row computed alone, bit for bit.
// Work is split between threads by output rows only. The AVX-512 path runs where the CPU has AVX-512 (F and BW),
// the AVX2 path (with FMA) elsewhere; a CPU has one path, so its results do not depend on the block size.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cstdint>

namespace {

// Packed layout: output rows in blocks of kRows; within a block, the input dimension in chunks of kChunk; a chunk
// holds kRows x kChunk weights, row after row. A block's weights are one contiguous stretch of memory, read from
// start to end once per step.
constexpr int kRows = 4;
constexpr int kChunk = 16;
// How far ahead of the weights being multiplied the kernel asks for them (bytes of the packed stream): far enough
// that each core keeps enough reads in flight to stream at the memory's rate.
constexpr int kPrefetch = 4096;

enum class Fmt { BF16, INT8 };

// ---- AVX2 + FMA: 8 lanes, a chunk as two halves into the same accumulator ----
#define AVX2_ATTR __attribute__((target("avx2,fma")))

template <Fmt F> AVX2_ATTR inline __m256 load8(const uint8_t* p) {
  if constexpr (F == Fmt::BF16) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  }
}

AVX2_ATTR inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// rows r0 .. r0 + RC of one block against MT input rows
template <Fmt F, int RC, int MT> AVX2_ATTR void tile_avx2(const float* x, int64_t ldx, const uint8_t* blk, int r0,
                                                           int64_t K, float* out, int64_t ldo) {
  constexpr int esz = F == Fmt::BF16 ? 2 : 1;
  __m256 acc[MT][RC];
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < RC; ++r) acc[m][r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += kChunk) {
    const uint8_t* c = blk + k * kRows * esz;
    for (int l = 0; l < kRows * kChunk * esz; l += 64) _mm_prefetch(reinterpret_cast<const char*>(c + kPrefetch + l), _MM_HINT_T0);
    for (int h = 0; h < 2; ++h) {
      __m256 xv[MT];
      for (int m = 0; m < MT; ++m) xv[m] = _mm256_loadu_ps(x + m * ldx + k + 8 * h);
      for (int r = 0; r < RC; ++r) {
        __m256 wv = load8<F>(c + ((r0 + r) * kChunk + 8 * h) * esz);
        for (int m = 0; m < MT; ++m) acc[m][r] = _mm256_fmadd_ps(wv, xv[m], acc[m][r]);
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < RC; ++r) out[m * ldo + r0 + r] = hsum8(acc[m][r]);
}

// ---- AVX-512: 16 lanes, a chunk per vector ----
#define AVX512_ATTR __attribute__((target("avx512f,avx512bw,avx2,fma")))

template <Fmt F> AVX512_ATTR inline __m512 load16(const uint8_t* p) {
  if constexpr (F == Fmt::BF16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  }
}

AVX512_ATTR inline float hsum16(__m512 v) {
  __m256 lo = _mm512_castps512_ps256(v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <Fmt F, int RC, int MT> AVX512_ATTR void tile_avx512(const float* x, int64_t ldx, const uint8_t* blk, int r0,
                                                               int64_t K, float* out, int64_t ldo) {
  constexpr int esz = F == Fmt::BF16 ? 2 : 1;
  __m512 acc[MT][RC];
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < RC; ++r) acc[m][r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += kChunk) {
    const uint8_t* c = blk + k * kRows * esz;
    for (int l = 0; l < kRows * kChunk * esz; l += 64) _mm_prefetch(reinterpret_cast<const char*>(c + kPrefetch + l), _MM_HINT_T0);
    __m512 xv[MT];
    for (int m = 0; m < MT; ++m) xv[m] = _mm512_loadu_ps(x + m * ldx + k);
    for (int r = 0; r < RC; ++r) {
      __m512 wv = load16<F>(c + (r0 + r) * kChunk * esz);
      for (int m = 0; m < MT; ++m) acc[m][r] = _mm512_fmadd_ps(wv, xv[m], acc[m][r]);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < RC; ++r) out[m * ldo + r0 + r] = hsum16(acc[m][r]);
}

using TileFn = void (*)(const float*, int64_t, const uint8_t*, int, int64_t, float*, int64_t);

// The tiles of one block: `rc` rows at a time, up to 4 input rows at a time (index: input rows 1..4).
constexpr int kMaxMT = 6;
struct Plan {
  int rc;
  TileFn fn[kMaxMT + 1];
};

template <Fmt F> Plan plan_for(bool avx512) {
  if (avx512)
    return {4, {nullptr, tile_avx512<F, 4, 1>, tile_avx512<F, 4, 2>, tile_avx512<F, 4, 3>, tile_avx512<F, 4, 4>,
                tile_avx512<F, 4, 5>, tile_avx512<F, 4, 6>}};
  return {2, {nullptr, tile_avx2<F, 2, 1>, tile_avx2<F, 2, 2>, tile_avx2<F, 2, 3>, tile_avx2<F, 2, 4>,
              tile_avx2<F, 2, 5>, tile_avx2<F, 2, 6>}};
}

bool has_avx512() {
  static const bool v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return v;
}

bool has_avx2() {
  static const bool v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return v;
}

}  // namespace

// [N, K] weights (bfloat16 or int8) -> the packed layout, [ceil(N / 4) * 4 * K] of the same dtype (rows past N zero).
torch::Tensor pack(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2, "w must be 2-D");
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 || w.scalar_type() == torch::kInt8, "w must be bfloat16 or int8");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K % kChunk == 0, "the input width must be a multiple of ", kChunk);
  const int64_t Np = (N + kRows - 1) / kRows * kRows;
  auto padded = torch::zeros({Np, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  // [Np/4, 4, K/16, 16] -> [Np/4, K/16, 4, 16]
  return padded.view({Np / kRows, kRows, K / kChunk, kChunk}).permute({0, 2, 1, 3}).contiguous().view({-1});
}

// y = x @ (w * scale)^T + bias, w packed by `pack` from [N, K]; path 0 = the CPU's best (AVX-512 where present),
// 1 = AVX2 (the path of CPUs without AVX-512, to test it here).
torch::Tensor linear(torch::Tensor x, torch::Tensor packed, int64_t N, c10::optional<torch::Tensor> scale,
                     c10::optional<torch::Tensor> bias, int64_t path) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2, "x must be a 2-D float32 tensor");
  const bool bf16 = packed.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(bf16 || packed.scalar_type() == torch::kInt8, "weights must be bfloat16 or int8");
  TORCH_CHECK(bf16 || scale.has_value(), "int8 weights need a scale per output row");
  TORCH_CHECK(has_avx2(), "this CPU lacks AVX2 and FMA");
  const bool avx512 = path == 0 && has_avx512();
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t blocks = (N + kRows - 1) / kRows;
  TORCH_CHECK(K % kChunk == 0 && packed.numel() == blocks * kRows * K, "packed weights do not match x and N");
  auto xc = x.contiguous();
  const int64_t Np = blocks * kRows;
  auto y = torch::empty({M, Np}, x.options());
  const Plan p = bf16 ? plan_for<Fmt::BF16>(avx512) : plan_for<Fmt::INT8>(avx512);
  const int64_t esz = bf16 ? 2 : 1;
  const float* xp = xc.data_ptr<float>();
  const uint8_t* wp = static_cast<const uint8_t*>(packed.data_ptr());
  float* yp = y.data_ptr<float>();
  const int64_t nthreads = at::get_num_threads();
  const int64_t grain = std::max<int64_t>(1, (blocks + nthreads - 1) / nthreads);
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* blk = wp + b * kRows * K * esz;
      for (int64_t m = 0; m < M;) {
        const int mt = static_cast<int>(std::min<int64_t>(kMaxMT, M - m));
        for (int r0 = 0; r0 < kRows; r0 += p.rc) p.fn[mt](xp + m * K, K, blk, r0, K, yp + m * Np + b * kRows, Np);
        m += mt;
      }
    }
  });
  auto out = Np == N ? y : y.narrow(1, 0, N);
  if (scale.has_value()) out = out.mul(scale->to(torch::kFloat32).unsqueeze(0));
  if (bias.has_value()) out = out.add(bias->to(torch::kFloat32).unsqueeze(0));
  return out.contiguous();
}

bool avx512_path() { return has_avx512(); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "weights in the kernel's block layout");
  m.def("linear", &linear, "weight-only linear (bfloat16 or int8 weights, float32 compute)");
  m.def("avx512_path", &avx512_path, "whether the AVX-512 path runs on this CPU");
}
