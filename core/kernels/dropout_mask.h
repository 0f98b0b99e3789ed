#pragma once
// Which elements dropout keeps, and the factor of a kept one: the one rule behind ag::dropout (the
// kernels of core/cpu/nn.cpp and cuda/nn.cu) and the dropout on the weights of the fused attention
// (core/cpu/attention.cpp, cuda/attention.cu), so that a seed drops the same elements on the CPU
// and on the GPU, fused or composed. docs/ops.md's dropout entry states it; here it is as math.
//
//   A dropout call reserves blocks of its generator's Philox stream (seed, offset): element i of
//   the tensor (row-major, i = 0 .. n-1) takes lane i % 4 of block offset + i / 4,
//       r_i = Philox4x32-10(seed, counter = offset + floor(i / 4)).v[i mod 4]      (32 random bits)
//       u_i = floor(r_i / 2^8) / 2^24                in [0, 1), exact in f32 (uniform01)
//   and keeps the element when
//       u_i >= p                                      (probability 1 - p; p in [0, 1))
//   A kept element is scaled by 1 / (1 - p), a dropped one becomes 0:
//       y_i = x_i m_i / (1 - p),   m_i = [u_i >= p]    (dx_i = g_i m_i / (1 - p) in backward)
//   so the mean of y is that of x. The mask is never stored: backward draws it again from
//   (seed, offset), which is all the op saves.
//
//   The fused attention drops weight (bh, i, j) of a (BH, Tq, Tk) weight tensor with element
//   (bh Tq + i) Tk + j: the element ag::dropout would use for that weight of the composed path.
//
// Plain C++17 and AG_HD: nvcc compiles this header for the device, g++ for the host.
#include <cstdint>

#include "core/kernels.h"

namespace ag {

// The Philox blocks a mask of n elements uses (4 elements per block): what a dropout call advances
// its generator by.
AG_HD inline uint64_t dropout_blocks(int64_t n) { return uint64_t(n + 3) / 4; }

// Lane `lane` (0..3) of a Philox block, picked without indexing the array: in GPU code an indexed
// r.v[lane] with a lane known only at run time would put the block in local memory.
AG_HD inline uint32_t philox_lane(const Philox4& r, uint64_t lane) {
  return (lane & 2) ? ((lane & 1) ? r.v[3] : r.v[2]) : ((lane & 1) ? r.v[1] : r.v[0]);
}

// The keep decision from an element's 32 random bits r: u = uniform01(r) >= p. Kernels that draw a
// whole Philox block at once (one block, four elements) call this for each lane.
AG_HD inline bool dropout_keeps(uint32_t r, double p) { return double(uniform01(r)) >= p; }

// The keep decision of element i of the mask drawn from (seed, offset).
AG_HD inline bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t i, double p) {
  return dropout_keeps(philox_lane(philox4x32_10(seed, offset + i / 4), i % 4), p);
}

// The factor of a kept element, 1 / (1 - p), computed in double and rounded once to T.
template <class T>
AG_HD inline T dropout_scale(double p) {
  return T(1.0 / (1.0 - p));
}

// The element of the dropout stream that the fused attention uses for weight (bh, i, j).
AG_HD inline uint64_t attention_dropout_element(int64_t bh, int64_t i, int64_t j, int64_t Tq, int64_t Tk) {
  return uint64_t((bh * Tq + i) * Tk + j);
}

}  // namespace ag
