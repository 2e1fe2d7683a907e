// tests/codegen/prefetch.cpp: compiled to assembly by the codegen check (tests/CMakeLists.txt,
// scripts/cmake/run_codegen_check.cmake), which counts the software prefetches in it.
//
// Each pass below is a large elementwise assignment over a bias-broadcast shape: solder
// compiles its loop nest twice (regular and non-temporal stores), and each loop must prefetch
// its streamed operand (eval/cpu/evaluator.hpp, prefetch_bytes_*). Without the prefetch the
// dropout pass at 64 MiB ran at 16-17 instead of 27 GB/s, and nothing but the timing showed it:
// GCC had deleted the prefetch calls as side-effect free before inlining them. The `// EXPECT`
// line gives how many `prefetcht1` instructions the assembly must hold at least: one per loop.
// EXPECT[prefetcht1 6]
#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"
#include "solder/ops.hpp"

namespace {
using rows = solder::shape<4096, 4096>;
using in = solder::tensor_ref<const float, rows>;
using out = solder::tensor_ref<float, rows>;
using bias = solder::tensor_ref<const float, solder::shape<4096>>;
}  // namespace

void codegen_relu(const float* x, const float* b, float* y) { out{y} = relu(in{x} + bias{b}); }

void codegen_scale(const float* x, const float* b, float* y) { out{y} = (in{x} + bias{b}) * 2.0f; }

void codegen_dropout(const float* x, const float* b, float* y) {
  out{y} = solder::dropout(relu(in{x} + bias{b}), 0.1f, solder::philox_state{1, 0});
}
