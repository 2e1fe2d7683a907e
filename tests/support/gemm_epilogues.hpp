// tests/support/gemm_epilogues.hpp: hand-written GEMM epilogues that tests and benchmarks call
// the CPU GEMM with directly (the library's own products go through expression epilogues):
// a plain store, bias + ReLU, and C = beta C + A' B'.
#pragma once

#include <cstddef>

#include "solder/eval/cpu/access.hpp"
#include "solder/eval/cpu/gemm_epilogue.hpp"
#include "solder/ops/activations.hpp"

namespace solder::test {

using solder::eval::cpu::vec;

/// C = A' B': stores each tile at C[m][n] (row-major, leading dimension ldc), never past the
/// mr x nr valid part of an edge tile.
struct store_epilogue {
  float* C;
  std::size_t ldc;

  template <std::size_t MR, std::size_t NV>
  SOLDER_INLINE void tile(const vec<float> (&acc)[MR][NV], std::size_t m0, std::size_t n0, std::size_t mr,
                          std::size_t nr) const {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r)
      if (r < mr)
        eval::cpu::gemm_detail::store_row<NV>(C + (m0 + r) * ldc + n0, acc[r], nr,
                                   [](const vec<float>& x, std::size_t) { return x; });
  }
};

/// C = relu(A' B' + bias), bias [N] added to every row; relu is ops::relu (relu(NaN) = NaN).
struct bias_relu_epilogue {
  const float* bias;
  float* C;
  std::size_t ldc;

  template <std::size_t MR, std::size_t NV>
  SOLDER_INLINE void tile(const vec<float> (&acc)[MR][NV], std::size_t m0, std::size_t n0, std::size_t mr,
                          std::size_t nr) const {
    constexpr std::size_t W = eval::cpu::float_lanes;
    vec<float> b[NV];
#pragma GCC unroll 8
    for (std::size_t v = 0; v < NV; ++v)
      b[v] = (v + 1) * W <= nr ? vec<float>::load_unaligned(bias + n0 + v * W)
             : v * W < nr      ? eval::cpu::load_first<vec<float>>(bias + n0 + v * W, nr - v * W)
                               : vec<float>(0.0f);
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r)
      if (r < mr)
        eval::cpu::gemm_detail::store_row<NV>(C + (m0 + r) * ldc + n0, acc[r], nr, [&](const vec<float>& x, std::size_t v) {
          return ops::relu{}.forward(x + b[v]);
        });
  }
};

/// C = beta C + A' B', as fma(beta, C, A' B') (one rounding; beta = 1 gives C + A' B'), for
/// gradients accumulated over micro-batches. beta = 0 stores A' B' without reading C, so
/// whatever C held (NaN, Inf, uninitialized memory) is overwritten.
struct accumulate_epilogue {
  float* C;
  std::size_t ldc;
  float beta = 1.0f;

  template <std::size_t MR, std::size_t NV>
  SOLDER_INLINE void tile(const vec<float> (&acc)[MR][NV], std::size_t m0, std::size_t n0, std::size_t mr,
                          std::size_t nr) const {
    if (beta == 0.0f) {
      store_epilogue{C, ldc}.template tile<MR, NV>(acc, m0, n0, mr, nr);
      return;
    }
    constexpr std::size_t W = eval::cpu::float_lanes;
    const vec<float> b(beta);
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r)
      if (r < mr) {
        float* c = C + (m0 + r) * ldc + n0;
        eval::cpu::gemm_detail::store_row<NV>(c, acc[r], nr, [&](const vec<float>& x, std::size_t v) {
          const std::size_t col = v * W;  // store_row asks only for vectors with valid lanes
          const vec<float> old = col + W <= nr ? vec<float>::load_unaligned(c + col)
                                               : eval::cpu::load_first<vec<float>>(c + col, nr - col);
          return xsimd::fma(b, old, x);
        });
      }
  }
};

}  // namespace solder::test
