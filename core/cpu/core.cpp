// CPU kernels of the tensor core. Shapes and contracts: core/kernels/core.h.
#include <cmath>

#include "core/cpu/loops.h"
#include "core/kernels.h"

namespace ag::cpu {

template <class To, class From>
void cast_copy(To* dst, const From* src, const Layout& src_layout) {
  map1(dst, src, src_layout, [](From v) { return storage_cast<To>(v); });
}

template <class T>
void strided_copy(T* dst, const Layout& dst_layout, const T* src, const Layout& src_layout) {
  if (dst_layout.is_contiguous()) return cast_copy<T, T>(dst, src, src_layout);
  // Walk both layouts together: a two-input plan whose "inputs" are dst and src; the contiguous
  // output index of the plan is unused.
  const Layout* const in[2] = {&dst_layout, &src_layout};
  for_each_row(make_plan<2>(in), [&](int64_t, const int64_t* off, int64_t n, const int64_t* st) {
    T* d = dst + off[0];
    const T* s = src + off[1];
    for (int64_t i = 0; i < n; ++i) d[i * st[0]] = s[i * st[1]];
  });
}

template <class T>
void fill(T* dst, const Layout& l, T value) {
  if (l.is_contiguous()) {
    parallel_for(l.numel(), kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) dst[i] = value;
    });
    return;
  }
  const Layout* const in[1] = {&l};
  for_each_row(make_plan<1>(in), [&](int64_t, const int64_t* off, int64_t n, const int64_t* st) {
    for (int64_t i = 0; i < n; ++i) dst[off[0] + i * st[0]] = value;
  });
}

// The multiply-adds of arange, uniform and normal are written as std::fma: one rounding, whatever
// the compiler would contract (GCC fuses a * b + c where the CPU has FMA, not elsewhere), so the
// numbers are the same on every build, and equal the GPU's (cuda/core.cu computes the same fma).
template <class T>
void arange(T* dst, int64_t n, double start, double step) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(std::fma(double(i), step, start));
}

// Element i takes lane i%4 of Philox(seed, offset + i/4): independent of the thread split.
template <class T>
void uniform(T* dst, int64_t n, uint64_t seed, uint64_t offset, double low, double high) {
  const double span = high - low;
  parallel_for((n + 3) / 4, kGrain / 4, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      Philox4 r = philox4x32_10(seed, offset + uint64_t(c));
      for (int j = 0; j < 4 && c * 4 + j < n; ++j) {
        // low + span * u < high in exact arithmetic, but the rounding to T can reach high
        // (f32 in [1, 2): 2 - 2^-24 rounds to 2); keep the interval half-open.
        T v = T(std::fma(span, double(uniform01(r.v[j])), low));
        dst[c * 4 + j] = v < T(high) ? v : std::nextafter(T(high), T(low));
      }
    }
  });
}

// Box-Muller on lanes (0,1) and (2,3): four normals per Philox block.
template <class T>
void normal(T* dst, int64_t n, uint64_t seed, uint64_t offset, double mean, double std) {
  parallel_for((n + 3) / 4, kGrain / 4, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      Philox4 r = philox4x32_10(seed, offset + uint64_t(c));
      double z[4];
      for (int p = 0; p < 2; ++p) {
        double u1 = 1.0 - double(uniform01(r.v[2 * p]));  // (0, 1]: log is finite
        double u2 = double(uniform01(r.v[2 * p + 1]));
        double rad = std::sqrt(-2.0 * std::log(u1)), th = 2.0 * M_PI * u2;
        z[2 * p] = rad * std::cos(th);
        z[2 * p + 1] = rad * std::sin(th);
      }
      for (int j = 0; j < 4 && c * 4 + j < n; ++j) dst[c * 4 + j] = T(std::fma(std, z[j], mean));
    }
  });
}

// Element i takes lanes (0,1) or (2,3) of Philox(seed, offset + i/2) as one 64-bit draw: two
// elements per block. The modulo bias is below range / 2^64, under 2^-32 for ranges below 2^32.
void randint(int64_t* dst, int64_t n, uint64_t seed, uint64_t offset, int64_t low, int64_t high) {
  const uint64_t range = uint64_t(high) - uint64_t(low);
  parallel_for((n + 1) / 2, kGrain / 2, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      Philox4 r = philox4x32_10(seed, offset + uint64_t(c));
      for (int j = 0; j < 2 && c * 2 + j < n; ++j) {
        uint64_t x = (uint64_t(r.v[2 * j]) << 32) | r.v[2 * j + 1];
        dst[c * 2 + j] = int64_t(uint64_t(low) + x % range);
      }
    }
  });
}

// The kernels of core/kernels/core.h for the dtypes listed there.
AG_INSTANTIATE_CORE_KERNELS

}  // namespace ag::cpu
