#pragma once
// Kernels of the tensor core: copies and casts, fill, arange, random numbers.
// dst is contiguous unless a Layout is given for it.
#include <cstdint>

namespace ag { struct Layout; }

namespace ag::cpu {

// dst[i] = To(src[layout element i]); dst contiguous, src strided.
template <class To, class From> void cast_copy(To* dst, const From* src, const Layout& src_layout);
// dst[layout element i] = src[layout element i]; both strided with the same shape.
template <class T> void strided_copy(T* dst, const Layout& dst_layout, const T* src, const Layout& src_layout);
template <class T> void fill(T* dst, const Layout& dst_layout, T value);
template <class T> void arange(T* dst, int64_t n, double start, double step);
// Random fills of a contiguous buffer from Philox(seed, offset + i/4).
template <class T> void uniform(T* dst, int64_t n, uint64_t seed, uint64_t offset, double low, double high);
template <class T> void normal(T* dst, int64_t n, uint64_t seed, uint64_t offset, double mean, double std);
void randint(int64_t* dst, int64_t n, uint64_t seed, uint64_t offset, int64_t low, int64_t high);

}  // namespace ag::cpu

// The same kernels on the GPU (cuda/core.cu). uniform and randint give bit-identical values to the
// CPU's; normal's f32 values too (its log/cos/sin are computed in f64, whose last-ulp differences
// reach the f32 result almost never), its f64 values agree to a few ulp.
namespace ag::cuda {

template <class To, class From> void cast_copy(To* dst, const From* src, const Layout& src_layout);
template <class T> void strided_copy(T* dst, const Layout& dst_layout, const T* src, const Layout& src_layout);
template <class T> void fill(T* dst, const Layout& dst_layout, T value);
template <class T> void arange(T* dst, int64_t n, double start, double step);
template <class T> void uniform(T* dst, int64_t n, uint64_t seed, uint64_t offset, double low, double high);
template <class T> void normal(T* dst, int64_t n, uint64_t seed, uint64_t offset, double mean, double std);
void randint(int64_t* dst, int64_t n, uint64_t seed, uint64_t offset, int64_t low, int64_t high);

}  // namespace ag::cuda
