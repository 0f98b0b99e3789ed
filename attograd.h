#pragma once
// One include for users: tensors, ops, the tape, random numbers, gradcheck, threads and the
// determinism switch (core/parallel.h: set_num_threads, set_deterministic), the kernel profiler
// (core/profile.h).
#include "autograd/autocast.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "autograd/recompute.h"
#include "autograd/tape.h"
#include "core/allocator.h"
#include "core/format.h"
#include "core/parallel.h"
#include "core/profile.h"
#include "core/random.h"
#include "core/serialize.h"
#include "core/tensor.h"
