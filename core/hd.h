#pragma once
// AG_HD marks the per-element math (core/kernels/pointwise.h, core/half.h) callable from host and
// device code. On the CPU it is also forced inline: it runs inside loops that must vectorise, and
// GCC's heuristics sometimes leave a functor (or the fast_exp under it) as a call in one copy of a
// loop (the one-thread branch of parallel_for), which stops vectorisation. Plain C++ only: nvcc
// compiles this header.
#if defined(__CUDACC__)
#define AG_HD __host__ __device__
#elif defined(__GNUC__)
#define AG_HD __attribute__((always_inline))
#else
#define AG_HD
#endif
