// eval/cpu/gemm_epilogue.hpp: what the CPU GEMM hands each finished tile to. An epilogue is any
// object with epi.template tile<MR, NV>(acc, m0, n0, mr, nr): acc the register tile of C's rows
// [m0, m0 + mr) and columns [n0, n0 + nr), its whole K sum accumulated. Expression epilogues
// (product.hpp) all reach the GEMM as one erased_epilogue, so the micro-kernels are compiled
// once per program; store_row is the masked store an epilogue writes a row of C with.
#pragma once

#include <cstddef>

#include "solder/config.hpp"
#include "solder/eval/cpu/access.hpp"
#include "solder/eval/cpu/batch.hpp"

namespace solder::eval::cpu {

namespace gemm_detail {

/// Stores row `row` of a tile (NV vectors, nr valid columns) at c, through `f` per vector.
template <std::size_t NV, class F>
SOLDER_INLINE void store_row(float* c, const vec<float> (&row)[NV], std::size_t nr, F&& f) {
  constexpr std::size_t W = float_lanes;
  if (nr == NV * W) {
#pragma GCC unroll 8
    for (std::size_t v = 0; v < NV; ++v) f(row[v], v).store_unaligned(c + v * W);
    return;
  }
  for (std::size_t v = 0; v < NV && v * W < nr; ++v) {
    const std::size_t left = nr - v * W;
    if (left >= W) f(row[v], v).store_unaligned(c + v * W);
    else store_first(c + v * W, f(row[v], v), left);
  }
}

}  // namespace gemm_detail

/// The epilogue the GEMM sees for every expression: one type, so the GEMM's micro-kernels are
/// compiled once per program for all expression epilogues (not once per expression: a model of
/// ten layers would compile them dozens of times). It spills the register tile to an L1 buffer
/// and calls the expression's row loop through a function pointer, once per tile.
struct erased_epilogue {
  const void* self;
  void (*rows)(const void* self, const float* tile, std::size_t ld, std::size_t m0, std::size_t n0, std::size_t mr,
               std::size_t nr);

  template <std::size_t MR, std::size_t NV>
  SOLDER_INLINE void tile(const vec<float> (&acc)[MR][NV], std::size_t m0, std::size_t n0, std::size_t mr,
                          std::size_t nr) const {
    constexpr std::size_t W = vec<float>::size;
    constexpr std::size_t ld = NV * W;
    alignas(alignment) float buf[MR * ld];
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (std::size_t v = 0; v < NV; ++v) acc[r][v].store_aligned(buf + r * ld + v * W);
    rows(self, buf, ld, m0, n0, mr, nr);
  }
};

}  // namespace solder::eval::cpu
