// What every exported entry point checks before it reads a raw pointer, each failure a Python RuntimeError that
// names the function and the argument: a tensor is defined, dense and on the CPU (a CUDA or meta tensor's pointer
// is no host memory), of an expected dtype and rank, and contiguous where the kernel walks it by index; a size the
// kernel divides by is positive; a product of sizes fits int64; a cache window start .. start + n lies inside the
// cache without forming start + n (which can overflow); the CPU has AVX2 and FMA.
#pragma once
#include <torch/extension.h>
#include <initializer_list>

namespace checks {

// an argument's name, with its index in a list argument (spelt out only when a check fails)
struct Name {
  Name(const char* base, int64_t index = -1) : base(base), index(index) {}
  const char* base;
  int64_t index;
};
inline std::ostream& operator<<(std::ostream& o, const Name& n) {
  o << n.base;
  if (n.index >= 0) o << "[" << n.index << "]";
  return o;
}

// `t` is a dense CPU tensor of one of `dtypes` (empty: any), of rank `dim` (-1: any), contiguous when `flat`.
inline void tensor(const char* fn, const Name& name, const torch::Tensor& t,
                   std::initializer_list<c10::ScalarType> dtypes, int64_t dim = -1, bool flat = false) {
  TORCH_CHECK(t.defined(), fn, ": ", name, " is undefined");
  TORCH_CHECK(t.layout() == c10::kStrided && t.device().is_cpu(), fn, ": ", name,
              " must be a dense CPU tensor, not one on ", t.device(), " (layout ", t.layout(), ")");
  bool known = dtypes.size() == 0;
  for (auto d : dtypes) known = known || t.scalar_type() == d;
  TORCH_CHECK(known, fn, ": ", name, " must not be ", t.scalar_type());
  TORCH_CHECK(dim < 0 || t.dim() == dim, fn, ": ", name, " must have ", dim, " dimensions, not ", t.dim());
  TORCH_CHECK(!flat || t.is_contiguous(), fn, ": ", name, " must be contiguous (the kernel reads or writes it in place)");
}

// a size the kernel divides by, or steps through, or that must name at least one element
inline void positive(const char* fn, const char* name, int64_t v) {
  TORCH_CHECK(v > 0, fn, ": ", name, " must be positive, not ", v);
}

// a * b, refused where it overflows int64
inline int64_t times(const char* fn, const char* name, int64_t a, int64_t b) {
  int64_t r = 0;
  TORCH_CHECK(!__builtin_mul_overflow(a, b, &r), fn, ": ", name, " overflows (", a, " x ", b, ")");
  return r;
}

// positions start .. start + n - 1 inside a cache of `capacity` positions, checked without forming start + n
inline void window(const char* fn, int64_t start, int64_t n, int64_t capacity) {
  TORCH_CHECK(start >= 0 && n >= 0 && start <= capacity && n <= capacity - start, fn, ": start ", start, " with ", n,
              " new positions does not fit a cache of ", capacity);
}

inline void avx2(const char* fn) {
  TORCH_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), fn, ": this CPU lacks AVX2 and FMA");
}

}  // namespace checks
