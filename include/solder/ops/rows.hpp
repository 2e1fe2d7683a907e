// ops/rows.hpp: a row op over a batch of rows, as a body of the executor's rows<N> verb
// (executor.hpp): body(walker, r) runs the op on row r with whichever walker the backend hands
// it (the CPU's vector walk, a CUDA warp), so a layer writes its row loop once for every backend.
#pragma once

#include <cstddef>

#include "solder/config.hpp"

namespace solder::ops {

/// y_r = Op.forward(x_r) for row r of x, y [rows, n] (n = N, or a run-time length when N is dyn).
template <class Op, std::size_t N>
struct rows_forward {
  const float* x;
  float* y;
  std::size_t n = N;
  SOLDER_EXEC_CHECK_OFF
  template <class R>
  SOLDER_HD SOLDER_INLINE void operator()(const R& walker, std::size_t r) const {
    Op{}.forward(walker, x + r * n, y + r * n);
  }
};

/// dx_r = Op.backward(y_r, dy_r) for row r, from the op's output (an op whose trait
/// output_backward says it differentiates from y alone); all [rows, n].
template <class Op, std::size_t N>
struct rows_backward_from_output {
  static_assert(Op::output_backward, "solder::ops::rows_backward_from_output: this op's backward needs its input, not its output");
  const float* y;
  const float* dy;
  float* dx;
  std::size_t n = N;
  SOLDER_EXEC_CHECK_OFF
  template <class R>
  SOLDER_HD SOLDER_INLINE void operator()(const R& walker, std::size_t r) const {
    Op{}.backward(walker, y + r * n, dy + r * n, dx + r * n);
  }
};

/// x.n where x has one, else `otherwise`: a body's run-time row length (none for a constant
/// N), or the columns of a walker's step (a CPU vector step's n, one for a warp lane's).
template <class X>
SOLDER_HD SOLDER_INLINE constexpr std::size_t n_or(const X& x, std::size_t otherwise) {
  if constexpr (requires { x.n; })
    return x.n;
  else
    return otherwise;
}

/// A chunk body's partial sums of two terms per column, in float (p) and double (t), each [2 n]
/// (columns j and n + j): zero_columns sets both to 0, flush_columns adds p into t and zeroes p,
/// each lane of the walker (over n columns) for its own columns.
SOLDER_EXEC_CHECK_OFF
template <class R>
SOLDER_HD SOLDER_INLINE void zero_columns(const R& walker, float* p, double* t, std::size_t n) {
  walker.each([&](auto at) SOLDER_INLINE_LAMBDA {
    for (std::size_t j = at.j; j < at.j + n_or(at, 1); ++j) {
      p[j] = p[n + j] = 0.0f;
      t[j] = t[n + j] = 0.0;
    }
  });
}
SOLDER_EXEC_CHECK_OFF
template <class R>
SOLDER_HD SOLDER_INLINE void flush_columns(const R& walker, float* p, double* t, std::size_t n) {
  walker.each([&](auto at) SOLDER_INLINE_LAMBDA {
    for (std::size_t j = at.j; j < at.j + n_or(at, 1); ++j) {
      t[j] += double(p[j]);
      t[n + j] += double(p[n + j]);
      p[j] = p[n + j] = 0.0f;
    }
  });
}

/// A producer's epilogue that runs nothing: what a body calls where no writes follow it.
struct no_row_epilogue {
  SOLDER_HD SOLDER_INLINE void rows(std::size_t, std::size_t, std::size_t) const {}
};

/// A row body whose row gives a value (body(walker, r) returns a double), storing it at
/// out[r] once the row is done: what a backend runs for row_sums<N> before adding the values.
template <class Body>
struct row_value_into {
  Body body;
  double* out;
  std::size_t n = n_or(body, 0);
  SOLDER_EXEC_CHECK_OFF
  template <class R>
  SOLDER_HD SOLDER_INLINE void operator()(const R& walker, std::size_t r) const {
    const double v = body(walker, r);
    walker.once([&]() SOLDER_INLINE_LAMBDA { out[r] = v; });
  }
};

}  // namespace solder::ops
