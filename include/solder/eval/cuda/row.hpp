// eval/cuda/row.hpp: the CUDA backend's row walker (a warp per row) and the row bodies its
// kernels run. Host+device code without CUDA headers: the host suite runs the same walker and
// bodies on an emulated warp (tests/support/warp_emulation.hpp).
#pragma once

#include <math.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "solder/config.hpp"
#include "solder/ops/layer_norm.hpp"
#include "solder/ops/loss.hpp"
#include "solder/ops/rows.hpp"
#include "solder/ops/softmax.hpp"
#include "solder/shape.hpp"
#include "solder/simd.hpp"

namespace solder::eval::cuda {

/// Lanes of a CUDA warp: the threads that share one row.
inline constexpr std::size_t warp_size = 32;

/// How a team combines a lane's value with its partner's (lane ^ o) at butterfly step o =
/// 16, 8, 4, 2, 1. The lower lane's value is always the left operand, so both lanes of a pair
/// compute the same bits, signed zeros and NaN payloads included (simd::max lets the first
/// operand win a tie of -0 and +0), and after the five steps every lane holds the same result.
struct butterfly {
  static constexpr unsigned first = unsigned(warp_size / 2);
  SOLDER_HD static double sum(unsigned lane, unsigned o, double mine, double theirs) {
    return (lane & o) ? theirs + mine : mine + theirs;
  }
  SOLDER_HD static float max(unsigned lane, unsigned o, float mine, float theirs) {
    return (lane & o) ? simd::max(theirs, mine) : simd::max(mine, theirs);
  }
};

/// One step of a warp's row walk: column j of the row, one of this lane's.
struct warp_step {
  std::size_t j;
};

namespace detail {
/// A row's length: a constant for warp_row<N>, a member for warp_row<dyn>.
template <std::size_t N>
struct warp_row_length {
  SOLDER_HD static constexpr std::size_t size() { return N; }
};
template <>
struct warp_row_length<dyn> {
  std::size_t n;
  SOLDER_HD constexpr std::size_t size() const { return n; }
};
}  // namespace detail

/// The walk of a row of N floats (N = dyn: a length given at run time) by the 32 lanes of a
/// warp, as the row ops of ops/ use it (docs/ops.md, "Row ops"): lane l takes columns l, l + 32,
/// l + 64, ... (neighbouring lanes read neighbouring floats), one float per step. Reductions
/// return the whole row's result to every lane, in an order fixed by N alone: each lane adds
/// its terms in float over blocks of 16, each block joining the lane's double total, then the
/// lanes' totals meet in a butterfly (struct butterfly). Team supplies the cross-lane steps:
///   unsigned lane(); double exchange_sum(double); float exchange_max(float); void sync();
/// (warp_team on the device, eval/cuda/row_kernels.hpp; an emulation on the host in the tests).
/// The members that call the team are checked per instantiation (SOLDER_EXEC_CHECK_OFF): a
/// host team makes them host code.
template <std::size_t N, class Team>
class warp_row {
 public:
  using scalar = float;
  using value = float;
  using accum = double;
  /// What f of sums<K> returns: K floats of one step.
  template <std::size_t K>
  using terms = std::array<float, K>;

  static constexpr std::size_t lanes = warp_size;
  /// Terms a lane sums in float before the block joins its double total: 16, as the CPU
  /// walker's lanes, so a row sum errs by about 20 u of its terms' magnitudes whatever N is.
  static constexpr std::size_t block = 16;

  SOLDER_HD explicit warp_row(const Team& team)
    requires(N != dyn)
      : team_(team) {}
  SOLDER_HD warp_row(std::size_t n, const Team& team)
    requires(N == dyn)
      : length_{n}, team_(team) {}

  SOLDER_HD constexpr std::size_t size() const { return length_.size(); }

  /// Column at.j of the row at p (`pad` is never needed: a lane visits only its own columns).
  SOLDER_HD static float load(warp_step at, const float* p, float /*pad*/ = 0.0f) { return p[at.j]; }
  SOLDER_HD static void store(warp_step at, float* p, float v) { p[at.j] = v; }

  /// f(at) for each of this lane's columns, in order.
  SOLDER_EXEC_CHECK_OFF
  template <class F>
  SOLDER_HD SOLDER_INLINE void each(const F& f) const {
    for (std::size_t j = team_.lane(); j < size(); j += lanes) f(warp_step{j});
  }

  /// The K sums over the row of f(at)[k] (f returns terms<K>), on every lane.
  SOLDER_EXEC_CHECK_OFF
  template <std::size_t K, class F>
  SOLDER_HD SOLDER_INLINE std::array<accum, K> sums(const F& f) const {
    std::array<accum, K> total;
    for (std::size_t k = 0; k < K; ++k) total[k] = -0.0;  // -0 + x is x exactly
    const std::size_t n = size(), stride = lanes * block;
    for (std::size_t j0 = team_.lane(); j0 < n; j0 += stride) {
      terms<K> acc;
      for (std::size_t k = 0; k < K; ++k) acc[k] = 0.0f;
      const std::size_t end = j0 + stride < n ? j0 + stride : n;
      for (std::size_t j = j0; j < end; j += lanes) {
        const terms<K> v = f(warp_step{j});
        for (std::size_t k = 0; k < K; ++k) acc[k] += v[k];
      }
      for (std::size_t k = 0; k < K; ++k) total[k] += accum(acc[k]);
    }
    for (std::size_t k = 0; k < K; ++k) total[k] = team_.exchange_sum(total[k]);
    return total;
  }
  /// sums<1> of f(at), a float.
  SOLDER_EXEC_CHECK_OFF
  template <class F>
  SOLDER_HD SOLDER_INLINE accum sum(const F& f) const {
    return sums<1>([&](warp_step at) SOLDER_INLINE_LAMBDA { return terms<1>{f(at)}; })[0];
  }
  /// The largest f(at) over the row, on every lane; NaN if any is NaN (simd::max).
  SOLDER_EXEC_CHECK_OFF
  template <class F>
  SOLDER_HD SOLDER_INLINE float max(const F& f) const {
    float m = -INFINITY;  // a lane without columns (N < 32) offers the neutral value
    for (std::size_t j = team_.lane(); j < size(); j += lanes) m = simd::max(m, f(warp_step{j}));
    return team_.exchange_max(m);
  }

  /// f() on lane 0, after every lane's earlier stores to the row; the other lanes wait for it.
  SOLDER_EXEC_CHECK_OFF
  template <class F>
  SOLDER_HD SOLDER_INLINE void once(const F& f) const {
    team_.sync();
    if (team_.lane() == 0) f();
    team_.sync();
  }

  SOLDER_HD const Team& team() const { return team_; }
  /// The walk of another run-time length by the same lanes (a shorter last chunk).
  SOLDER_HD warp_row with_length(std::size_t n) const
    requires(N == dyn)
  {
    return warp_row(n, team_);
  }

 private:
  [[no_unique_address]] detail::warp_row_length<N> length_;
  Team team_;
};

/// The walker of row length N, or n when N is dyn.
SOLDER_EXEC_CHECK_OFF
template <std::size_t N, class Team>
SOLDER_HD SOLDER_INLINE warp_row<N, Team> make_warp_row(std::size_t n, const Team& team) {
  if constexpr (N == dyn)
    return warp_row<N, Team>(n, team);
  else
    return warp_row<N, Team>(team);
}

/// A walker-generic row body (executor's rows<N>: body(walker, r), written once for every
/// backend) as a warp's row body: row r walked by the team's lanes. body.n is the row length
/// when N is dyn.
template <std::size_t N, class Body>
struct warp_rows {
  Body body;
  SOLDER_EXEC_CHECK_OFF
  template <class Team>
  SOLDER_HD void operator()(std::size_t r, const Team& team) const {
    std::size_t n = N;
    if constexpr (N == dyn) n = body.n;
    body(make_warp_row<N>(n, team), r);
  }
};

/// An element body (executor's elements: body.template operator()<V>(i)) one element per
/// thread: V is float on the device.
template <class Body>
struct thread_elements {
  Body body;
  SOLDER_EXEC_CHECK_OFF
  SOLDER_HD void operator()(std::size_t i) const { body.template operator()<float>(i); }
};

/// A plane body (executor's planes: body(p, i, j)) one element per thread: flat index k of
/// [planes, rows, cols].
template <class Body>
struct plane_elements {
  Body body;
  std::size_t rows, cols;
  SOLDER_EXEC_CHECK_OFF
  SOLDER_HD void operator()(std::size_t k) const {
    body(k / (rows * cols), (k / cols) % rows, k % cols);
  }
};

// The row bodies: what one warp does for one row (or chunk), a function of the row index and
// the team, so the kernels of row_kernels.hpp and the host tests run the same code. Pointers
// are the whole arrays; `n` is the row length (used when N is dyn, else equal to N).

/// Op (ops::softmax or ops::log_softmax) forward on row r: y = op(x); x, y [rows, n]. The
/// backend-free row body of ops/rows.hpp on a warp: {x, y} or {x, y, n}.
template <class Op, std::size_t N>
using softmax_forward_body = warp_rows<N, ops::rows_forward<Op, N>>;

/// Op backward on row r, from the output: dx from y and dy; all [rows, n]: {y, dy, dx[, n]}.
template <class Op, std::size_t N>
using softmax_backward_body = warp_rows<N, ops::rows_backward_from_output<Op, N>>;

/// layer_norm forward on row r: y = (x - mean) rstd w + b; keeps mean[r] and rstd[r]. The
/// backend-free row body (ops::layer_norm_forward_rows) on a warp.
template <std::size_t N>
struct layer_norm_forward_body {
  const float* x;
  const float* w;
  const float* b;
  float* y;
  float* mean;
  float* rstd;
  double eps;
  std::size_t n = N;
  SOLDER_EXEC_CHECK_OFF
  template <class Team>
  SOLDER_HD void operator()(std::size_t r, const Team& team) const {
    ops::layer_norm_forward_rows<N>{x, w, b, y, mean, rstd, 1, eps, n}(make_warp_row<N>(n, team), r);
  }
};

/// Rows cut into chunks fixed by the row count alone: at most max_chunks chunks of per_chunk
/// consecutive rows (the last one shorter). layer_norm's backward gives each chunk its own
/// partial dweight and dbias, so their sums never depend on the launch shape.
struct row_chunks {
  /// Enough warps to fill a GPU; each chunk keeps 2 n floats and 2 n doubles of partial sums.
  static constexpr std::size_t max_chunks = 256;
  std::size_t rows, per_chunk, count;
  SOLDER_HD explicit row_chunks(std::size_t rows)
      : rows(rows),
        per_chunk(rows > max_chunks ? (rows + max_chunks - 1) / max_chunks : 1),
        count((rows + per_chunk - 1) / per_chunk) {}
  SOLDER_HD std::size_t begin(std::size_t c) const { return c * per_chunk; }
  SOLDER_HD std::size_t end(std::size_t c) const { return (c + 1) * per_chunk < rows ? (c + 1) * per_chunk : rows; }
};

/// layer_norm backward on chunk c of the rows: dx of each row from its saved mean and rstd,
/// and the chunk's dweight and dbias terms summed in float, flushed to double every 64 rows (as
/// the CPU layer), into total[c] = [dweight (n), dbias (n)] of doubles; partial[c] (2 n floats)
/// is scratch. The backend-free chunk body (ops::layer_norm_backward_chunks) on a warp.
template <std::size_t N>
struct layer_norm_backward_body {
  const float* x;
  const float* dy;
  const float* w;
  const float* mean;
  const float* rstd;
  float* dx;
  float* partial;
  double* total;
  row_chunks chunks;
  std::size_t n = N;
  SOLDER_EXEC_CHECK_OFF
  template <class Team>
  SOLDER_HD void operator()(std::size_t c, const Team& team) const {
    ops::layer_norm_backward_chunks<N, row_chunks>{x, dy, w, mean, rstd, 1, dx, partial, total, chunks, n}(
        make_warp_row<N>(n, team), c);
  }
};

/// layer_norm's parameter gradients, one column each: for j < n, dw[j] = sum over chunks of
/// total[c][j], and db[j - n] from the columns n..2n, added in chunk order.
struct layer_norm_param_grad_body {
  const double* total;
  std::size_t chunks;
  std::size_t n;
  float* dw;
  float* db;
  SOLDER_HD void operator()(std::size_t j) const { ops::layer_norm_param_grads{total, chunks, n, dw, db}.column(j); }
};

/// Softmax cross-entropy of row r of logits x [rows, n] against labels[r]: loss[r], and with
/// Grad its gradient in g; the backend-free row body (ops::softmax_cross_entropy_rows, a NaN
/// loss for a label outside [0, n), which the launcher reports) on a warp.
template <bool Grad, std::size_t N>
struct cross_entropy_body {
  ops::softmax_cross_entropy op;
  const float* x;
  const std::int32_t* labels;
  float* g;
  double* loss;
  std::size_t n = N;
  SOLDER_EXEC_CHECK_OFF
  template <class Team>
  SOLDER_HD void operator()(std::size_t r, const Team& team) const {
    const ops::row_value_into<ops::softmax_cross_entropy_rows<Grad, N>> body{{op, x, labels, g, n}, loss};
    body(make_warp_row<N>(n, team), r);
  }
};

/// Elements per chunk of an elementwise loss: 128 per lane, 8 float blocks.
inline constexpr std::size_t loss_chunk = 4096;

/// An elementwise loss Op (ops::mse, ops::bce_with_logits) over chunk c of n elements (chunks
/// of loss_chunk, the last shorter): loss[c] = the chunk's sum, and with Grad g = slope * scale.
template <bool Grad, class Op>
struct elementwise_loss_body {
  Op op;
  const float* x;
  const float* t;
  float* g;
  double* loss;
  std::size_t n;
  float scale;
  /// Chunks for n elements.
  SOLDER_HD static std::size_t chunks(std::size_t n) { return (n + loss_chunk - 1) / loss_chunk; }
  SOLDER_EXEC_CHECK_OFF
  template <class Team>
  SOLDER_HD void operator()(std::size_t c, const Team& team) const {
    const std::size_t begin = c * loss_chunk, len = n - begin < loss_chunk ? n - begin : loss_chunk;
    const warp_row<dyn, Team> row(len, team);
    const double s = ops::elementwise_loss_sum<Grad>(op, row, x + begin, t + begin, Grad ? g + begin : nullptr, scale);
    row.once([&]() SOLDER_INLINE_LAMBDA { loss[c] = s; });
  }
};

}  // namespace solder::eval::cuda
