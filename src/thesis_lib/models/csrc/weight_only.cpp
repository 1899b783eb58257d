// Low-byte linear layers for CPU decoding: y = x @ (W * scale)^T + b with W stored in bfloat16 or int8
// (one float32 scale per output row), x and y in float32. A decode step reads every weight once, so fewer
// bytes per weight shorten it. `linear` computes the products in float32 whatever the CPU supports;
// `linear_dynamic` (further below) rounds x to int8 per block and computes exact integer products.
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
#include <cstring>
#include <algorithm>
#include <limits>

#include "checks.h"
#include "kernels.h"

namespace {

// Packed layout: output rows in blocks of kRows; within a block, the input dimension in chunks of kChunk; a chunk
// holds kRows x kChunk weights, row after row. A block's weights are one contiguous stretch of memory, read from
// start to end once per step.
constexpr int kRows = 4;
constexpr int kChunk = 16;
// How far ahead of the weights being multiplied the kernel asks for them (bytes of the packed stream): far enough
// that each core keeps enough reads in flight to stream at the memory's rate. The int8 VNNI path asks for nothing
// ahead: its sequential stream is left to the hardware's prefetcher (the measurement log says why).
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


// ---- int8 weights x int8 activations ("int8-dynamic") ----
// Each input row is quantised on the fly, in blocks of kBlock values along the input dimension: a float32 scale per
// block (its largest magnitude over 127) and int8 levels rounded to nearest. Weights are int8 with a scale per output
// row, stored as w + 128 (the byte w ^ 0x80) so that AVX-512 VNNI's unsigned-by-signed dot product applies; its
// excess, 128 times the block's sum of levels, starts the block's integer sum negative. Integer sums are exact in
// any order, so a block's sum is one number on every path; it is then added into one float32 accumulator per output
// with one fused multiply-add per block by the block's scale, in ascending block order. Lanes are outputs, so no
// lane reduction follows. Every path (AVX-512 VNNI, AVX2) therefore computes each output bit for bit alike, and each
// row of a block equals that row alone.
constexpr int kBlock = 32;
constexpr int kGroupOut = 32;  // outputs per packed group: [N/32][K/4][32][4]
constexpr int kMaxRowsDyn = 6;

struct QRows {
  const int8_t* q;      // [M, K] levels
  const int8_t* aq;     // [M, K] their magnitudes (AVX2 path)
  const float* s;       // [M, K / kBlock] scales
  const int32_t* corr;  // [M, K / kBlock] -128 x the block's sum of levels (AVX-512 VNNI path)
  int64_t K;
};

inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#define VNNI_ATTR __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma")))

template <int MT> VNNI_ATTR void dyn_tile_vnni(const QRows& a, int64_t m0, const uint8_t* grp, float* out,
                                                int64_t ldo) {
  const int64_t K = a.K, nb = K / kBlock;
  __m512 af[MT][2];
  for (int m = 0; m < MT; ++m) af[m][0] = af[m][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i ai[MT][2];
    for (int m = 0; m < MT; ++m) ai[m][0] = ai[m][1] = _mm512_set1_epi32(a.corr[(m0 + m) * nb + b]);
    const uint8_t* c0 = grp + b * kBlock * kGroupOut;
    for (int c = 0; c < kBlock / 4; ++c) {
      const uint8_t* c1 = c0 + c * 4 * kGroupOut;  // no software prefetch: the stream is the hardware's to fetch
      const __m512i w0 = _mm512_loadu_si512(c1), w1 = _mm512_loadu_si512(c1 + 64);
      for (int m = 0; m < MT; ++m) {
        const __m512i av = _mm512_set1_epi32(load4(a.q + (m0 + m) * K + b * kBlock + 4 * c));
        ai[m][0] = _mm512_dpbusd_epi32(ai[m][0], w0, av);
        ai[m][1] = _mm512_dpbusd_epi32(ai[m][1], w1, av);
      }
    }
    for (int m = 0; m < MT; ++m) {
      const __m512 sv = _mm512_set1_ps(a.s[(m0 + m) * nb + b]);
      af[m][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[m][0]), sv, af[m][0]);
      af[m][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[m][1]), sv, af[m][1]);
    }
  }
  for (int m = 0; m < MT; ++m) {
    _mm512_storeu_ps(out + m * ldo, af[m][0]);
    _mm512_storeu_ps(out + m * ldo + 16, af[m][1]);
  }
}

// Eight outputs' signed weights w (4 inputs each) times a row's four levels at offset o, as 32-bit sums:
// |a| times w signed as a, in unsigned-by-signed byte products widened pairwise (no saturation at |w| <= 127).
AVX2_ATTR inline __m256i sdot4_avx2(const QRows& a, int64_t o, __m256i w) {
  const __m256i av = _mm256_set1_epi32(load4(a.q + o)), mag = _mm256_set1_epi32(load4(a.aq + o));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(mag, _mm256_sign_epi8(w, av)), _mm256_set1_epi16(1));
}

// AVX2: 8 outputs per pass (a quarter of a group). |a| times (w signed as a's sign) in unsigned-by-signed byte
// products (at most 2 x 127 x 127 per pair: no saturation), widened to 32-bit sums.
template <int MT> AVX2_ATTR void dyn_tile_avx2(const QRows& a, int64_t m0, const uint8_t* grp, int quarter,
                                                float* out, int64_t ldo) {
  const int64_t K = a.K, nb = K / kBlock;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 af[MT];
  for (int m = 0; m < MT; ++m) af[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i ai[MT];
    for (int m = 0; m < MT; ++m) ai[m] = _mm256_setzero_si256();
    const uint8_t* c0 = grp + b * kBlock * kGroupOut + quarter * 32;
    for (int c = 0; c < kBlock / 4; ++c) {
      const uint8_t* c1 = c0 + c * 4 * kGroupOut;
      if (quarter == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(c1 + kPrefetch), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(c1 + kPrefetch + 64), _MM_HINT_T0);
      }
      const __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1)), flip);
      for (int m = 0; m < MT; ++m) ai[m] = _mm256_add_epi32(ai[m], sdot4_avx2(a, (m0 + m) * K + b * kBlock + 4 * c, w));
    }
    for (int m = 0; m < MT; ++m)
      af[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[m]), _mm256_set1_ps(a.s[(m0 + m) * nb + b]), af[m]);
  }
  for (int m = 0; m < MT; ++m) _mm256_storeu_ps(out + m * ldo, af[m]);
}

using DynVnniFn = void (*)(const QRows&, int64_t, const uint8_t*, float*, int64_t);
using DynAvx2Fn = void (*)(const QRows&, int64_t, const uint8_t*, int, float*, int64_t);
constexpr DynVnniFn kDynVnni[kMaxRowsDyn + 1] = {nullptr, dyn_tile_vnni<1>, dyn_tile_vnni<2>, dyn_tile_vnni<3>,
                                                 dyn_tile_vnni<4>, dyn_tile_vnni<5>, dyn_tile_vnni<6>};
constexpr DynAvx2Fn kDynAvx2[kMaxRowsDyn + 1] = {nullptr, dyn_tile_avx2<1>, dyn_tile_avx2<2>, dyn_tile_avx2<3>,
                                                 dyn_tile_avx2<4>, dyn_tile_avx2<5>, dyn_tile_avx2<6>};

// ---- 4-bit weights x int8 activations ("int4-dynamic") ----
// Weights are levels -7..7 with a bfloat16 scale per output and block of kBlock inputs (the block's largest
// magnitude over 7), stored as level + 8 in nibbles: a group of 32 outputs holds, for each 4 inputs, 64 bytes whose
// low nibbles are outputs 0-15 and high nibbles outputs 16-31 (each output's 4 inputs adjacent, as in the int8
// layout), then the group's scales as [K / kBlock][32]. The activations are int8-dynamic's rows. A block's integer
// sum is exact on every path (AVX-512 VNNI: (level + 8) x a less 8 x the block's sum of levels; AVX2: |a| x level
// signed as a), then one fused multiply-add by the activation's scale times the weight's, in ascending block order:
// every path computes each output alike, and each row of a block equals that row alone.
constexpr int kNib = 64;  // bytes per group and 4 inputs

// 16 (AVX-512) or 8 (AVX2) bfloat16 scales as float32: each the 16 bits above 16 zero bits (exact)
AVX512_ATTR inline __m512 scales16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
AVX2_ATTR inline __m256 scales8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

template <int MT> VNNI_ATTR void dyn4_tile_vnni(const QRows& a, int64_t m0, const uint8_t* grp, const uint16_t* ws,
                                                 float* out, int64_t ldo) {
  const int64_t K = a.K, nb = K / kBlock;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 af[MT][2];
  for (int m = 0; m < MT; ++m) af[m][0] = af[m][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i ai[MT][2];
    for (int m = 0; m < MT; ++m) ai[m][0] = ai[m][1] = _mm512_set1_epi32(a.corr[(m0 + m) * nb + b] / 16);
    const uint8_t* c0 = grp + b * (kBlock / 4) * kNib;
    for (int c = 0; c < kBlock / 4; ++c) {
      const uint8_t* c1 = c0 + c * kNib;
      _mm_prefetch(reinterpret_cast<const char*>(c1 + kPrefetch), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(c1);
      const __m512i w0 = _mm512_and_si512(v, low), w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      for (int m = 0; m < MT; ++m) {
        const __m512i av = _mm512_set1_epi32(load4(a.q + (m0 + m) * K + b * kBlock + 4 * c));
        ai[m][0] = _mm512_dpbusd_epi32(ai[m][0], w0, av);
        ai[m][1] = _mm512_dpbusd_epi32(ai[m][1], w1, av);
      }
    }
    const __m512 s0 = scales16(ws + b * kGroupOut), s1 = scales16(ws + b * kGroupOut + 16);
    for (int m = 0; m < MT; ++m) {
      const __m512 sv = _mm512_set1_ps(a.s[(m0 + m) * nb + b]);
      af[m][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[m][0]), _mm512_mul_ps(sv, s0), af[m][0]);
      af[m][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[m][1]), _mm512_mul_ps(sv, s1), af[m][1]);
    }
  }
  for (int m = 0; m < MT; ++m) {
    _mm512_storeu_ps(out + m * ldo, af[m][0]);
    _mm512_storeu_ps(out + m * ldo + 16, af[m][1]);
  }
}

// AVX2: outputs 8 * quarter .. + 8: quarters 0 and 1 the low nibbles of bytes 0-31 and 32-63, 2 and 3 the high.
template <int MT> AVX2_ATTR void dyn4_tile_avx2(const QRows& a, int64_t m0, const uint8_t* grp, const uint16_t* ws,
                                                 int quarter, float* out, int64_t ldo) {
  const int64_t K = a.K, nb = K / kBlock;
  const __m256i low = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  const int shift = quarter >= 2 ? 4 : 0;
  __m256 af[MT];
  for (int m = 0; m < MT; ++m) af[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i ai[MT];
    for (int m = 0; m < MT; ++m) ai[m] = _mm256_setzero_si256();
    const uint8_t* c0 = grp + b * (kBlock / 4) * kNib + (quarter & 1) * 32;
    for (int c = 0; c < kBlock / 4; ++c) {
      const uint8_t* c1 = c0 + c * kNib;
      if (quarter == 0) _mm_prefetch(reinterpret_cast<const char*>(c1 + kPrefetch), _MM_HINT_T0);
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1));
      const __m256i w = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v, shift), low), eight);
      for (int m = 0; m < MT; ++m) ai[m] = _mm256_add_epi32(ai[m], sdot4_avx2(a, (m0 + m) * K + b * kBlock + 4 * c, w));
    }
    const __m256 sw = scales8(ws + b * kGroupOut + 8 * quarter);
    for (int m = 0; m < MT; ++m)
      af[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[m]), _mm256_mul_ps(_mm256_set1_ps(a.s[(m0 + m) * nb + b]), sw), af[m]);
  }
  for (int m = 0; m < MT; ++m) _mm256_storeu_ps(out + m * ldo, af[m]);
}

using Dyn4VnniFn = void (*)(const QRows&, int64_t, const uint8_t*, const uint16_t*, float*, int64_t);
using Dyn4Avx2Fn = void (*)(const QRows&, int64_t, const uint8_t*, const uint16_t*, int, float*, int64_t);
constexpr Dyn4VnniFn kDyn4Vnni[kMaxRowsDyn + 1] = {nullptr, dyn4_tile_vnni<1>, dyn4_tile_vnni<2>, dyn4_tile_vnni<3>,
                                                   dyn4_tile_vnni<4>, dyn4_tile_vnni<5>, dyn4_tile_vnni<6>};
constexpr Dyn4Avx2Fn kDyn4Avx2[kMaxRowsDyn + 1] = {nullptr, dyn4_tile_avx2<1>, dyn4_tile_avx2<2>, dyn4_tile_avx2<3>,
                                                   dyn4_tile_avx2<4>, dyn4_tile_avx2<5>, dyn4_tile_avx2<6>};

bool has_vnni() {
  static const bool v = has_avx512() && __builtin_cpu_supports("avx512vnni");
  return v;
}

// One row's levels, magnitudes, scales and corrections, in AVX2 on every path (the same operations: IEEE products,
// rounding to nearest even, exact integer sums). A block holding NaN or an infinity gets scale NaN (its outputs are
// NaN, as float32 products would make them); a block too small for 127 / amax to be finite (below about 4e-37)
// rounds to zero.
AVX2_ATTR void quantize_row(const float* x, int64_t K, int8_t* q, int8_t* aq, float* s, int32_t* corr) {
  const __m256 nosign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 big = _mm256_set1_ps(std::numeric_limits<float>::max());
  const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    int nonfinite = 0;
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      const __m256 a = _mm256_and_ps(v[i], nosign);
      nonfinite |= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_NLE_UQ));  // NaN or above the largest float
      mx = _mm256_max_ps(mx, a);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float r = amax > 0.f ? 127.f / amax : 0.f;
    const bool zero = nonfinite || r > std::numeric_limits<float>::max();
    const __m256 inv = _mm256_set1_ps(zero ? 0.f : r);
    __m256i l[4], sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      l[i] = _mm256_min_epi32(hi, _mm256_max_epi32(lo, _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv))));
      if (zero) l[i] = _mm256_setzero_si256();
      sum = _mm256_add_epi32(sum, l[i]);
    }
    // 32 x int32 -> 32 x int8 in order (packs interleave 128-bit lanes; the permute restores the order)
    const __m256i w16a = _mm256_packs_epi32(l[0], l[1]), w16b = _mm256_packs_epi32(l[2], l[3]);
    const __m256i b8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w16a, w16b), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kBlock), b8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(aq + b * kBlock), _mm256_abs_epi8(b8));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    s[b] = nonfinite ? std::numeric_limits<float>::quiet_NaN() : zero ? 0.f : amax / 127.f;
    corr[b] = -128 * _mm_cvtsi128_si32(s4);
  }
}

// N output rows (positive, and small enough that a padded count of them cannot overflow) and the optional per-row
// scale and bias: CPU tensors of N elements.
void outputs(const char* fn, int64_t N, const c10::optional<torch::Tensor>& scale, const c10::optional<torch::Tensor>& bias) {
  checks::positive(fn, "N", N);
  TORCH_CHECK(N <= (int64_t{1} << 40), fn, ": N = ", N, " is no layer's output count");
  for (const auto& [name, t] : {std::pair{"scale", scale}, std::pair{"bias", bias}}) {
    if (!t.has_value()) continue;
    checks::tensor(fn, name, *t, {torch::kFloat32, torch::kBFloat16, torch::kFloat16});
    TORCH_CHECK(t->numel() == N, fn, ": ", name, " must hold N = ", N, " values, not ", t->numel());
  }
}

}  // namespace

// [N, K] weights (bfloat16 or int8) -> the packed layout, [ceil(N / 4) * 4 * K] of the same dtype (rows past N zero).
torch::Tensor pack(torch::Tensor w) {
  checks::tensor("pack", "w", w, {torch::kBFloat16, torch::kInt8}, 2);
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K % kChunk == 0, "pack: w's input width must be a multiple of ", kChunk);
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
  checks::tensor("linear", "x", x, {torch::kFloat32}, 2);
  checks::tensor("linear", "packed", packed, {torch::kBFloat16, torch::kInt8}, 1, true);
  const bool bf16 = packed.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(bf16 || scale.has_value(), "linear: int8 weights need a scale per output row");
  outputs("linear", N, scale, bias);
  checks::avx2("linear");
  const bool avx512 = path == 0 && has_avx512();
  const int64_t M = x.size(0), K = x.size(1);
  checks::positive("linear", "x's width", K);
  const int64_t blocks = (N + kRows - 1) / kRows;
  TORCH_CHECK(K % kChunk == 0 && packed.numel() == checks::times("linear", "N x K", blocks * kRows, K),
              "linear: packed does not match x and N");
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

// [N, K] int8 weights -> the int8-dynamic layout, [ceil(N / 32) * 32 * K] bytes of w + 128 (rows past N zero).
torch::Tensor pack_dynamic(torch::Tensor w) {
  checks::tensor("pack_dynamic", "w", w, {torch::kInt8}, 2);
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K % kBlock == 0, "pack_dynamic: w's input width must be a multiple of ", kBlock);
  TORCH_CHECK(w.numel() == 0 || w.min().item<int8_t>() > -128, "pack_dynamic: w's int8 levels must lie in -127..127");
  const int64_t Np = (N + kGroupOut - 1) / kGroupOut * kGroupOut;
  auto padded = torch::zeros({Np, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  // [Np/32, 32, K/4, 4] -> [Np/32, K/4, 32, 4], each byte w ^ 0x80
  auto blocked = padded.view({Np / kGroupOut, kGroupOut, K / 4, 4}).permute({0, 2, 1, 3}).contiguous().view({-1});
  return blocked.view(torch::kUInt8).bitwise_xor(0x80);
}

namespace {

// x's rows rounded to int8 per block (quantize_row): the tensors a QRows points into.
struct Quantised {
  torch::Tensor q, aq, s, corr;
  QRows rows() const {
    return QRows{q.data_ptr<int8_t>(), aq.data_ptr<int8_t>(), s.data_ptr<float>(), corr.data_ptr<int32_t>(), q.size(1)};
  }
};

Quantised quantize(const torch::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1), nb = K / kBlock;
  auto xc = x.contiguous();
  Quantised r{torch::empty({M, K}, torch::kInt8), torch::empty({M, K}, torch::kInt8),
              torch::empty({M, nb}, torch::kFloat32), torch::empty({M, nb}, torch::kInt32)};
  const float* xp = xc.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m)
    quantize_row(xp + m * K, K, r.q.data_ptr<int8_t>() + m * K, r.aq.data_ptr<int8_t>() + m * K,
                 r.s.data_ptr<float>() + m * nb, r.corr.data_ptr<int32_t>() + m * nb);
  return r;
}

// Rows per tile for `left` rows still to do: 6 at most, and never 5 (GCC's five-row tile ran slower than four and one).
inline int tile_rows(int64_t left) { return left >= kMaxRowsDyn ? kMaxRowsDyn : left == 5 ? 4 : static_cast<int>(left); }

// Runs tile(group, m, rows, out) over the groups of 32 outputs (split between threads) and the rows in tiles of up
// to kMaxRowsDyn; returns y [M, N] plus bias.
template <typename Tile>
torch::Tensor dynamic_product(const torch::Tensor& x, int64_t N, const c10::optional<torch::Tensor>& bias,
                              const torch::Tensor& scale, Tile tile) {
  const int64_t M = x.size(0), groups = (N + kGroupOut - 1) / kGroupOut, Np = groups * kGroupOut;
  auto y = torch::empty({M, Np}, x.options());
  float* yp = y.data_ptr<float>();
  const int64_t nthreads = at::get_num_threads();
  const int64_t grain = std::max<int64_t>(1, (groups + nthreads - 1) / nthreads);
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t m = 0; m < M;) {
        const int mt = tile_rows(M - m);
        tile(g, m, mt, yp + m * Np + g * kGroupOut, Np);
        m += mt;
      }
  });
  auto out = Np == N ? y : y.narrow(1, 0, N);
  if (scale.defined()) out = out.mul(scale.to(torch::kFloat32).unsqueeze(0));
  if (bias.has_value()) out = out.add(bias->to(torch::kFloat32).unsqueeze(0));
  return out.contiguous();
}

}  // namespace

// y = quantised(x) @ (w * scale)^T + bias, w packed by `pack_dynamic` from [N, K]; path as for `linear`.
torch::Tensor linear_dynamic(torch::Tensor x, torch::Tensor packed, int64_t N, torch::Tensor scale,
                             c10::optional<torch::Tensor> bias, int64_t path) {
  checks::tensor("linear_dynamic", "x", x, {torch::kFloat32}, 2);
  checks::tensor("linear_dynamic", "packed", packed, {torch::kUInt8}, 1, true);
  outputs("linear_dynamic", N, scale, bias);
  checks::avx2("linear_dynamic");
  const bool vnni = path == 0 && has_vnni();
  const int64_t K = x.size(1), groups = (N + kGroupOut - 1) / kGroupOut;
  checks::positive("linear_dynamic", "x's width", K);
  TORCH_CHECK(K % kBlock == 0 && packed.numel() == checks::times("linear_dynamic", "N x K", groups * kGroupOut, K),
              "linear_dynamic: packed does not match x and N (pack_dynamic's layout)");
  const Quantised qx = quantize(x);
  const QRows a = qx.rows();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  return dynamic_product(x, N, bias, scale, [&](int64_t g, int64_t m, int mt, float* o, int64_t ldo) {
    const uint8_t* grp = wp + g * kGroupOut * K;
    if (vnni) {
      kDynVnni[mt](a, m, grp, o, ldo);
    } else {
      for (int h = 0; h < kGroupOut / 8; ++h) kDynAvx2[mt](a, m, grp, h, o + 8 * h, ldo);
    }
  });
}

// y = quantised(x) @ w^T + bias, w the int4-dynamic layout from [N, K] (packed nibbles; bfloat16 scales
// [N/32][K/32][32]).
torch::Tensor linear_dynamic4(torch::Tensor x, torch::Tensor packed, int64_t N, torch::Tensor scales,
                              c10::optional<torch::Tensor> bias, int64_t path) {
  checks::tensor("linear_dynamic4", "x", x, {torch::kFloat32}, 2);
  checks::tensor("linear_dynamic4", "packed", packed, {torch::kUInt8}, 1, true);
  checks::tensor("linear_dynamic4", "scales", scales, {torch::kBFloat16}, -1, true);
  outputs("linear_dynamic4", N, c10::nullopt, bias);
  checks::avx2("linear_dynamic4");
  const bool vnni = path == 0 && has_vnni();
  const int64_t K = x.size(1), groups = (N + kGroupOut - 1) / kGroupOut, nb = K / kBlock;
  checks::positive("linear_dynamic4", "x's width", K);
  const int64_t rows = groups * kGroupOut;
  TORCH_CHECK(K % kBlock == 0 && packed.numel() == checks::times("linear_dynamic4", "N x K", rows, K) / 2 &&
                  scales.numel() == rows * nb, "linear_dynamic4: packed and scales do not match x and N");
  const Quantised qx = quantize(x);
  const QRows a = qx.rows();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::BFloat16>());
  return dynamic_product(x, N, bias, torch::Tensor(), [&](int64_t g, int64_t m, int mt, float* o, int64_t ldo) {
    const uint8_t* grp = wp + g * kGroupOut * K / 2;
    const uint16_t* ws = sp + g * kGroupOut * nb;
    if (vnni) {
      kDyn4Vnni[mt](a, m, grp, ws, o, ldo);
    } else {
      for (int h = 0; h < kGroupOut / 8; ++h) kDyn4Avx2[mt](a, m, grp, ws, h, o + 8 * h, ldo);
    }
  });
}

bool vnni_path() { return has_vnni(); }

bool avx512_path() { return has_avx512(); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "weights in the kernel's block layout");
  m.def("linear", &linear, "weight-only linear (bfloat16 or int8 weights, float32 compute)");
  m.def("pack_dynamic", &pack_dynamic, "int8 weights in the int8-dynamic layout");
  m.def("linear_dynamic", &linear_dynamic, "int8 weights by int8 activations quantised per block of 32");
  m.def("linear_dynamic4", &linear_dynamic4, "4-bit weights (a bfloat16 scale per block of 32) by int8-dynamic activations");
  m.def("vnni_path", &vnni_path, "whether the AVX-512 VNNI path runs on this CPU");
  m.def("avx512_path", &avx512_path, "whether the AVX-512 path runs on this CPU");
  m.def("rms_norm", &rms_norm, "float32 RMS norm, row by row (decode_ops.cpp)");
  m.def("rotary", &rotary, "float32 rotary embedding of queries and keys (decode_ops.cpp)");
  m.def("attend_one", &attend_one, "one query's float32 attention over a cache, grouped heads (decode_ops.cpp)");
  m.def("flash_greedy", &flash_greedy, "FlashHead's greedy head on a CPU in one call (flash_head.cpp)");
  m.def("compact_layers", &compact_layers, "a compact step's decoder layers in one call (compact_layers.cpp)");
  m.def("attend_causal", &attend_causal, "a block's queries, each over its prefix as attend_one (decode_ops.cpp)");
}
