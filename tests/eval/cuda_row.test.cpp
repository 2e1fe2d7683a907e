// tests/eval/cuda_row.test.cpp: the CUDA backend's row walker and row bodies (eval/cuda/row.hpp)
// and its fixed-order total (eval/cuda/total.hpp), run on the host over an emulated warp and
// block (support/warp_emulation.hpp: the device's lanes, index arithmetic and reduction order)
// against the CPU walker (executor<cpu>::row) and double loops: softmax and log_softmax forward
// and backward, layer_norm forward and backward with its parameter gradients, the cross-entropy,
// mse and bce_with_logits row losses and gradients, at row lengths 1, 5, 31, 32, 33, 100 and
// 1000 (lanes without columns, partial warps, several float blocks per lane), static and
// dynamic, with NaN and infinite rows; every result the same bits on a second run.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/assign.hpp"
#include "solder/eval/cuda/row.hpp"
#include "solder/eval/cuda/total.hpp"
#include "solder/ops/layer_norm.hpp"
#include "solder/ops/loss.hpp"
#include "solder/ops/softmax.hpp"
#include "support/data.hpp"
#include "support/warp_emulation.hpp"

namespace {

namespace cu = solder::eval::cuda;
namespace ops = solder::ops;
using exec = solder::executor<solder::cpu>;
using solder::dyn;
using solder::test::fill_uniform;
using solder::test::run_warp;

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
/// Float's unit roundoff.
constexpr double u = 0x1p-24;

/// Both implementations run the same float algorithm in different orders: exp and log within
/// 2 ulp each (glibc on the warp, xsimd on the CPU walker), each row sum within about 20 u of
/// its terms' magnitudes (16 float terms per lane or vector lane, then double), and a few
/// roundings after. 1e-5 (168 u) covers the two together with room; an indexing or order
/// mistake is off by the size of the values themselves.
constexpr double row_tol = 1e-5;

/// Elements where got and want disagree: NaN only against NaN, an infinity only against itself,
/// otherwise |got - want| <= tol[i]. `first` describes the first.
template <class G, class W>
std::size_t disagreements(const std::vector<G>& got, const std::vector<W>& want, const std::vector<double>& tol,
                          std::string& first) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = double(got[i]), w = double(want[i]);
    const bool ok = std::isnan(w)   ? std::isnan(g)
                    : std::isinf(w) ? g == w
                                    : std::fabs(g - w) <= tol[i];
    if (!ok && bad++ == 0) {
      std::ostringstream s;
      s.precision(9);
      s << "element " << i << ": got " << g << ", want " << w << " (tolerance " << tol[i] << ")";
      first = s.str();
    }
  }
  return bad;
}

/// Checks that got agrees with want (disagreements), naming `what` and the first mismatch.
template <class G, class W>
void check_agree(const char* what, const std::vector<G>& got, const std::vector<W>& want,
                 const std::vector<double>& tol) {
  std::string first;
  const std::size_t bad = disagreements(got, want, tol, first);
  INFO(what << ": " << first);
  CHECK(bad == 0);
}

/// The rows every row op is run on, n columns each: three seeded rows in [-4, 4], one near
/// 1000 (logits that would overflow exp without the max), then the NaN/Inf rows: a NaN, a +inf,
/// a -inf among finite values (for n = 1, a row of only -inf), and a row of only -inf.
constexpr std::size_t special_rows = 4;
std::vector<float> test_rows(std::size_t n, std::uint32_t seed) {
  constexpr std::size_t rows = 4 + special_rows;
  std::vector<float> x(rows * n);
  fill_uniform(x, -4, 4, seed);
  for (std::size_t j = 0; j < n; ++j) x[3 * n + j] += 1000.0f;
  x[4 * n + n / 2] = qnan;
  x[5 * n + n - 1] = inf;
  x[6 * n] = -inf;
  for (std::size_t j = 0; j < n; ++j) x[7 * n + j] = -inf;
  return x;
}

/// Elements of a and b that differ in any bit, two NaNs excepted: a NaN's sign and payload
/// follow the operand order the optimizer picks per instantiation, and say nothing of the sums.
template <class T>
std::size_t differing_bits(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t d = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    d += !(std::isnan(a[i]) && std::isnan(b[i])) && std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return d;
}

/// Elements of a and b further apart than 1e-5 of a's magnitude plus 1e-7 (NaN matches NaN, an infinity
/// itself). A row of static length and the same row of run-time length run different loops,
/// and the compiler may contract a * b + c into one fused multiply-add in one and not in the
/// other, so they agree to a few roundings, not bit for bit; each of them is the same bits
/// run to run.
template <class T>
std::size_t apart(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = double(a[i]), y = double(b[i]);
    d += std::isnan(x) ? !std::isnan(y) : std::isinf(x) ? !(x == y) : !(std::fabs(x - y) <= 1e-5 * std::fabs(x) + 1e-7);
  }
  return d;
}

// ---- the walker's own contract ----------------------------------------------------------

TEMPLATE_TEST_CASE_SIG("cuda warp_row: each, sum, sums, max and once over the row's columns, on every lane",
                       "[eval][cuda]", ((std::size_t N), N), (1), (5), (31), (32), (33), (100), (1000)) {
  std::vector<int> visits(N, 0), once_calls(1, 0);
  std::vector<double> sum(cu::warp_size), sum2(cu::warp_size), plain(cu::warp_size), big(cu::warp_size);
  std::vector<float> max(cu::warp_size), nan_max(cu::warp_size);
  std::vector<float> column(N);
  for (std::size_t j = 0; j < N; ++j) column[j] = float(j + 1);
  std::vector<float> with_nan = column;
  with_nan[N / 2] = qnan;
  run_warp(1, [&](std::size_t, const auto& team) {
    const auto row = cu::make_warp_row<N>(N, team);
    const unsigned l = team.lane();
    row.each([&](cu::warp_step at) { ++visits[at.j]; });  // each column by one lane only: no race
    const auto [s, s2] = row.template sums<2>([&](cu::warp_step at) {
      const float v = row.load(at, column.data());
      return typename decltype(row)::template terms<2>{v, 2 * v};
    });
    sum[l] = s;
    sum2[l] = s2;
    plain[l] = row.sum([&](cu::warp_step at) { return row.load(at, column.data()); });
    max[l] = row.max([&](cu::warp_step at) { return row.load(at, column.data()); });
    nan_max[l] = row.max([&](cu::warp_step at) { return row.load(at, with_nan.data()); });
    row.once([&] { ++once_calls[0]; });
  });
  // max finds a spike at any lane's first columns and at the row's last ones.
  std::vector<std::size_t> spikes;
  for (std::size_t j = 0; j < N; ++j)
    if (j < 2 * cu::warp_size || j + cu::warp_size >= N) spikes.push_back(j);
  std::vector<float> found(spikes.size() * cu::warp_size);
  run_warp(1, [&](std::size_t, const auto& team) {
    const auto row = cu::make_warp_row<N>(N, team);
    for (std::size_t k = 0; k < spikes.size(); ++k)
      found[k * cu::warp_size + team.lane()] =
          row.max([&](cu::warp_step at) { return at.j == spikes[k] ? 2.0f : -1.0f - float(at.j); });
  });
  for (float f : found) CHECK(f == 2.0f);
  for (std::size_t j = 0; j < N; ++j) CHECK(visits[j] == 1);
  CHECK(once_calls[0] == 1);
  const double want = double(N) * double(N + 1) / 2;  // small integers: exact in any order
  for (std::size_t l = 0; l < cu::warp_size; ++l) {
    INFO("lane " << l);
    CHECK(sum[l] == want);
    CHECK(sum2[l] == 2 * want);
    CHECK(plain[l] == want);
    CHECK(max[l] == float(N));
    CHECK(std::isnan(nan_max[l]));
  }
}

TEST_CASE("cuda warp_row: every lane gets the same bits of a sum, and the walk stays within the row",
          "[eval][cuda]") {
  // Values whose sum rounds differently in different orders: every lane must still agree, and
  // a dynamic length must give the static length's bits.
  constexpr std::size_t n = 777;
  std::vector<float> x(n + 8, 12345.0f);  // 8 floats past the row
  std::vector<float> row_values(n);
  fill_uniform(row_values, -1e3, 1e3, 7);
  std::copy(row_values.begin(), row_values.end(), x.begin());
  std::vector<double> fixed(cu::warp_size), dynamic(cu::warp_size);
  std::vector<float> out(n + 8, -1.0f);
  run_warp(1, [&](std::size_t, const auto& team) {
    const cu::warp_row<n, std::decay_t<decltype(team)>> r(team);
    const cu::warp_row<dyn, std::decay_t<decltype(team)>> d(n, team);
    fixed[team.lane()] = r.sum([&](cu::warp_step at) { return r.load(at, x.data()) * 1.1f; });
    dynamic[team.lane()] = d.sum([&](cu::warp_step at) { return d.load(at, x.data()) * 1.1f; });
    d.each([&](cu::warp_step at) { d.store(at, out.data(), d.load(at, x.data())); });
  });
  for (std::size_t l = 0; l < cu::warp_size; ++l) {
    CHECK(std::memcmp(&fixed[l], &fixed[0], sizeof(double)) == 0);
    CHECK(std::memcmp(&dynamic[l], &fixed[0], sizeof(double)) == 0);
  }
  for (std::size_t j = 0; j < n; ++j) CHECK(out[j] == x[j]);
  for (std::size_t j = n; j < n + 8; ++j) CHECK(out[j] == -1.0f);
}

// ---- softmax and log_softmax ------------------------------------------------------------

/// Op's forward and backward on the test rows: the warp (twice, and with a dynamic length)
/// against the CPU walker; backward from the warp's own y, so both start from the same bits.
template <class Op, std::size_t N>
void check_softmax_family(bool log) {
  const std::vector<float> x = test_rows(N, 101);
  const std::size_t rows = x.size() / N;
  std::vector<float> y(x.size()), y_again(x.size()), y_dyn(x.size()), y_cpu(x.size());
  run_warp(rows, cu::softmax_forward_body<Op, N>{x.data(), y.data()});
  run_warp(rows, cu::softmax_forward_body<Op, N>{x.data(), y_again.data()});
  run_warp(rows, cu::softmax_forward_body<Op, dyn>{x.data(), y_dyn.data(), N});
  for (std::size_t r = 0; r < rows; ++r) Op{}.forward(exec::row<N>{}, x.data() + r * N, y_cpu.data() + r * N);
  CHECK(differing_bits(y, y_again) == 0);
  CHECK(apart(y, y_dyn) == 0);
  std::vector<double> tol(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    tol[i] = row_tol * (log ? 1 + std::fabs(double(y_cpu[i])) : std::fabs(double(y_cpu[i])));
  check_agree("y against the CPU walker", y, y_cpu, tol);
  // The NaN/Inf rows are NaN on the warp too (-inf among finite logits excepted).
  for (std::size_t j = 0; j < N; ++j) {
    CHECK(std::isnan(y[4 * N + j]));
    CHECK(std::isnan(y[5 * N + j]));
    CHECK(std::isnan(y[7 * N + j]));
  }

  std::vector<float> dy(x.size()), dx(x.size()), dx_again(x.size()), dx_dyn(x.size()), dx_cpu(x.size());
  fill_uniform(dy, -1, 1, 102);
  run_warp(rows, cu::softmax_backward_body<Op, N>{y.data(), dy.data(), dx.data()});
  run_warp(rows, cu::softmax_backward_body<Op, N>{y.data(), dy.data(), dx_again.data()});
  run_warp(rows, cu::softmax_backward_body<Op, dyn>{y.data(), dy.data(), dx_dyn.data(), N});
  for (std::size_t r = 0; r < rows; ++r)
    Op{}.backward(exec::row<N>{}, y.data() + r * N, dy.data() + r * N, dx_cpu.data() + r * N);
  CHECK(differing_bits(dx, dx_again) == 0);
  CHECK(apart(dx, dx_dyn) == 0);
  // softmax: dx = y (dy - sum(dy y)), off by row_tol of y (|dy| + sum |dy y|); log_softmax:
  // dx = dy - exp(y) sum(dy), off by row_tol of |dy| + exp(y) sum |dy|.
  for (std::size_t r = 0; r < rows; ++r) {
    double s = 0;
    for (std::size_t j = 0; j < N; ++j) {
      const std::size_t i = r * N + j;
      s += log ? std::fabs(double(dy[i])) : std::fabs(double(dy[i]) * double(y[i]));
    }
    for (std::size_t j = 0; j < N; ++j) {
      const std::size_t i = r * N + j;
      tol[i] = log ? row_tol * (std::fabs(double(dy[i])) + std::exp(double(y[i])) * s)
                   : row_tol * std::fabs(double(y[i])) * (std::fabs(double(dy[i])) + s);
    }
  }
  check_agree("dx against the CPU walker", dx, dx_cpu, tol);
}

TEMPLATE_TEST_CASE_SIG("cuda row bodies: softmax and log_softmax forward and backward match the CPU walker",
                       "[eval][cuda]", ((std::size_t N), N), (1), (5), (31), (32), (33), (100), (1000)) {
  SECTION("softmax") { check_softmax_family<ops::softmax, N>(false); }
  SECTION("log_softmax") { check_softmax_family<ops::log_softmax, N>(true); }
}

// ---- layer_norm -------------------------------------------------------------------------

TEMPLATE_TEST_CASE_SIG("cuda row bodies: layer_norm forward and backward match the CPU walker", "[eval][cuda]",
                       ((std::size_t N), N), (1), (5), (31), (32), (33), (100), (1000)) {
  constexpr double eps = 1e-5;
  // Rows: three centered, one with mean 1000 and spread 1, one constant, then NaN, +inf, -inf.
  constexpr std::size_t rows = 8;
  std::vector<float> x(rows * N), w(N), b(N);
  fill_uniform(x, -2, 2, 201);
  for (std::size_t j = 0; j < N; ++j) {
    x[3 * N + j] = 1000.0f + x[3 * N + j] / 2;
    x[4 * N + j] = 0.1f;
  }
  x[5 * N + N / 2] = qnan;
  x[6 * N] = inf;
  x[7 * N + N - 1] = -inf;
  fill_uniform(w, 0.5, 1.5, 202);
  fill_uniform(b, -0.5, 0.5, 203);

  std::vector<float> y(rows * N), y_again(rows * N), y_dyn(rows * N), y_cpu(rows * N);
  std::vector<float> mean(rows), rstd(rows), mean_again(rows), rstd_again(rows), mean_dyn(rows), rstd_dyn(rows);
  std::vector<float> mean_cpu(rows), rstd_cpu(rows);
  run_warp(rows, cu::layer_norm_forward_body<N>{x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), eps});
  run_warp(rows, cu::layer_norm_forward_body<N>{x.data(), w.data(), b.data(), y_again.data(), mean_again.data(),
                                                rstd_again.data(), eps});
  run_warp(rows, cu::layer_norm_forward_body<dyn>{x.data(), w.data(), b.data(), y_dyn.data(), mean_dyn.data(),
                                                  rstd_dyn.data(), eps, N});
  for (std::size_t r = 0; r < rows; ++r) {
    const auto st = ops::layer_norm{}.forward(exec::row<N>{}, x.data() + r * N, y_cpu.data() + r * N, w.data(),
                                              b.data(), eps);
    mean_cpu[r] = st.mean;
    rstd_cpu[r] = st.rstd;
  }
  CHECK(differing_bits(y, y_again) == 0);
  CHECK(apart(y, y_dyn) == 0);
  CHECK(differing_bits(mean, mean_again) == 0);
  CHECK(apart(mean, mean_dyn) == 0);
  CHECK(differing_bits(rstd, rstd_again) == 0);
  CHECK(apart(rstd, rstd_dyn) == 0);

  // The mean to a few ulp of itself plus the sums' error relative to the spread (64 u: two
  // orders of ~20 u each); rstd relative to itself; y from those, scaled by w rstd.
  std::vector<double> tol_mean(rows), tol_rstd(rows), tol_y(rows * N);
  for (std::size_t r = 0; r < rows; ++r) {
    double spread = 0;
    for (std::size_t j = 0; j < N; ++j) spread = std::fmax(spread, std::fabs(double(x[r * N + j]) - mean_cpu[r]));
    tol_mean[r] = 8 * u * std::fabs(double(mean_cpu[r])) + 64 * u * spread;
    tol_rstd[r] = row_tol * double(rstd_cpu[r]);
    for (std::size_t j = 0; j < N; ++j) {
      const double xhat = (double(x[r * N + j]) - mean_cpu[r]) * rstd_cpu[r];
      tol_y[r * N + j] = row_tol * (std::fabs(double(w[j]) * xhat) + std::fabs(double(b[j])) + 1) +
                         2 * std::fabs(double(w[j])) * rstd_cpu[r] * tol_mean[r];
    }
  }
  check_agree("mean against the CPU walker", mean, mean_cpu, tol_mean);
  check_agree("rstd against the CPU walker", rstd, rstd_cpu, tol_rstd);
  check_agree("y against the CPU walker", y, y_cpu, tol_y);
  for (std::size_t j = 0; j < N; ++j) {
    CHECK(y[4 * N + j] == b[j]);  // a constant row normalizes to the bias exactly
    CHECK(std::isnan(y[5 * N + j]));
    CHECK(std::isnan(y[6 * N + j]));
    CHECK(std::isnan(y[7 * N + j]));
  }

  // Backward from the warp's statistics, on every row: dx per row against the CPU walker.
  std::vector<float> dy(rows * N), dx(rows * N), dx_again(rows * N), dx_cpu(rows * N);
  fill_uniform(dy, -1, 1, 204);
  const auto backward_on_warp = [&](std::vector<float>& out, const cu::row_chunks& chunks) {
    std::vector<float> partial(chunks.count * 2 * N, qnan);
    std::vector<double> total(chunks.count * 2 * N, double(qnan));
    std::vector<float> dw(N), db(N);
    run_warp(chunks.count, cu::layer_norm_backward_body<N>{x.data(), dy.data(), w.data(), mean.data(), rstd.data(),
                                                           out.data(), partial.data(), total.data(), chunks});
    const cu::layer_norm_param_grad_body grads{total.data(), chunks.count, N, dw.data(), db.data()};
    for (std::size_t j = 0; j < 2 * N; ++j) grads(j);
    return std::pair{dw, db};
  };
  backward_on_warp(dx, cu::row_chunks(rows));
  backward_on_warp(dx_again, cu::row_chunks(rows));
  CHECK(differing_bits(dx, dx_again) == 0);
  std::vector<float> scratch_w(N), scratch_b(N);
  std::vector<double> tol_dx(rows * N);
  for (std::size_t r = 0; r < rows; ++r) {
    ops::layer_norm{}.backward(exec::row<N>{}, x.data() + r * N, dy.data() + r * N, w.data(), {mean[r], rstd[r]},
                               dx_cpu.data() + r * N, scratch_w.data(), scratch_b.data());
    // dx = rstd (g - mean(g) - xhat mean(g xhat)): off by row_tol of rstd (|g| + mean|g| +
    // |xhat| mean|g xhat|), the sums' magnitudes.
    double ag = 0, agx = 0;
    for (std::size_t j = 0; j < N; ++j) {
      const double xhat = (double(x[r * N + j]) - mean[r]) * rstd[r], g = double(dy[r * N + j]) * w[j];
      ag += std::fabs(g) / N;
      agx += std::fabs(g * xhat) / N;
    }
    for (std::size_t j = 0; j < N; ++j) {
      const double xhat = (double(x[r * N + j]) - mean[r]) * rstd[r], g = double(dy[r * N + j]) * w[j];
      tol_dx[r * N + j] = row_tol * rstd[r] * (std::fabs(g) + ag + std::fabs(xhat) * agx);
    }
  }
  check_agree("dx against the CPU walker", dx, dx_cpu, tol_dx);

  // dweight and dbias over 100 finite rows, cut the default way (one row per chunk below
  // max_chunks rows) and into chunks of 70 rows (the first flushed to double at 64), against
  // the double sums of dy xhat and dy.
  constexpr std::size_t grad_rows = 100;
  std::vector<float> gx(grad_rows * N), gdy(grad_rows * N), gmean(grad_rows), grstd(grad_rows);
  fill_uniform(gx, -2, 2, 205);
  fill_uniform(gdy, -1, 1, 206);
  for (std::size_t r = 0; r < grad_rows; ++r) {
    const auto st = ops::layer_norm{}.statistics(exec::row<N>{}, gx.data() + r * N, eps);
    gmean[r] = st.mean;
    grstd[r] = st.rstd;
  }
  std::vector<double> want_dw(N, 0), want_db(N, 0), tol_dw(N, 0), tol_db(N, 0);
  for (std::size_t r = 0; r < grad_rows; ++r)
    for (std::size_t j = 0; j < N; ++j) {
      // xhat exactly as the op forms it, in float: the sums are what is compared.
      const float xhat = (gx[r * N + j] - gmean[r]) * grstd[r];
      const double t = double(gdy[r * N + j]) * double(xhat);
      want_dw[j] += t;
      want_db[j] += gdy[r * N + j];
      tol_dw[j] += row_tol * std::fabs(t);
      tol_db[j] += row_tol * std::fabs(double(gdy[r * N + j]));
    }
  // float terms of up to 64 rows: about 64 u of the terms' magnitudes, under row_tol.
  const auto grads_on_warp = [&](const cu::row_chunks& chunks) {
    std::vector<float> partial(chunks.count * 2 * N, qnan), gdx(grad_rows * N), dw(N), db(N);
    std::vector<double> total(chunks.count * 2 * N, double(qnan));
    run_warp(chunks.count, cu::layer_norm_backward_body<N>{gx.data(), gdy.data(), w.data(), gmean.data(), grstd.data(),
                                                           gdx.data(), partial.data(), total.data(), chunks});
    const cu::layer_norm_param_grad_body grads{total.data(), chunks.count, N, dw.data(), db.data()};
    for (std::size_t j = 0; j < 2 * N; ++j) grads(j);
    return std::pair{dw, db};
  };
  cu::row_chunks by_70(grad_rows);
  by_70.per_chunk = 70;
  by_70.count = 2;
  for (const cu::row_chunks& chunks : {cu::row_chunks(grad_rows), by_70}) {
    INFO(chunks.count << " chunks of " << chunks.per_chunk << " rows");
    const auto [dw, db] = grads_on_warp(chunks);
    const auto [dw_again, db_again] = grads_on_warp(chunks);
    CHECK(differing_bits(dw, dw_again) == 0);
    CHECK(differing_bits(db, db_again) == 0);
    check_agree("dw against the double sums", dw, want_dw, tol_dw);
    check_agree("db against the double sums", db, want_db, tol_db);
  }
}

// ---- losses -----------------------------------------------------------------------------

TEMPLATE_TEST_CASE_SIG("cuda row bodies: softmax cross-entropy rows and gradients match the CPU walker",
                       "[eval][cuda]", ((std::size_t N), N), (1), (5), (31), (32), (33), (100), (1000)) {
  const float smoothing = GENERATE(0.0f, 0.1f);
  INFO("label_smoothing " << smoothing);
  const std::vector<float> x = test_rows(N, 301);
  const std::size_t rows = x.size() / N;
  std::vector<std::int32_t> labels(rows);
  for (std::size_t r = 0; r < rows; ++r) labels[r] = std::int32_t((r * 7 + 3) % N);
  const ops::softmax_cross_entropy op{1.0f - smoothing, smoothing / float(N), 1.0f / float(rows)};

  std::vector<double> loss(rows), loss_again(rows), loss_dyn(rows), loss_eval(rows), loss_cpu(rows);
  std::vector<float> g(x.size()), g_again(x.size()), g_dyn(x.size()), g_cpu(x.size());
  run_warp(rows, cu::cross_entropy_body<true, N>{op, x.data(), labels.data(), g.data(), loss.data()});
  run_warp(rows, cu::cross_entropy_body<true, N>{op, x.data(), labels.data(), g_again.data(), loss_again.data()});
  run_warp(rows, cu::cross_entropy_body<true, dyn>{op, x.data(), labels.data(), g_dyn.data(), loss_dyn.data(), N});
  run_warp(rows, cu::cross_entropy_body<false, N>{op, x.data(), labels.data(), nullptr, loss_eval.data()});
  for (std::size_t r = 0; r < rows; ++r)
    loss_cpu[r] = op.row<true>(exec::row<N>{}, x.data() + r * N, std::size_t(labels[r]), g_cpu.data() + r * N);
  CHECK(differing_bits(loss, loss_again) == 0);
  CHECK(apart(loss, loss_dyn) == 0);
  CHECK(differing_bits(g, g_again) == 0);
  CHECK(apart(g, g_dyn) == 0);

  // The loss: log s + keep (m - x_y) + spread sum (m - x_j), all terms >= 0, each off by
  // row_tol of itself. The gradient (softmax_j - spread - keep [j == y]) scale: off by row_tol
  // of softmax_j scale, bounded by |g_j| + (spread + keep [j == y]) scale.
  std::vector<double> tol_loss(rows), tol_g(x.size());
  for (std::size_t r = 0; r < rows; ++r) {
    tol_loss[r] = row_tol * (1 + std::fabs(loss_cpu[r]));
    for (std::size_t j = 0; j < N; ++j) {
      const double target = op.spread + (j == std::size_t(labels[r]) ? op.keep : 0.0f);
      tol_g[r * N + j] = row_tol * (std::fabs(double(g_cpu[r * N + j])) + target * op.scale);
    }
  }
  check_agree("loss against the CPU walker", loss, loss_cpu, tol_loss);
  check_agree("loss_eval against the CPU walker", loss_eval, loss_cpu, tol_loss);
  check_agree("g against the CPU walker", g, g_cpu, tol_g);
  CHECK(std::isnan(loss[4]));  // a NaN logit
  CHECK(std::isnan(loss[5]));  // +inf
  CHECK(std::isnan(loss[7]));  // only -inf
}

TEST_CASE("cuda row bodies: a label outside the classes gives a NaN loss and reads nothing", "[eval][cuda]") {
  constexpr std::size_t n = 40;
  std::vector<float> x(3 * n), g(3 * n, 7.0f);
  fill_uniform(x, -1, 1, 401);
  const std::vector<std::int32_t> labels{-1, 3, std::int32_t(n)};
  std::vector<double> loss(3);
  const ops::softmax_cross_entropy op{1.0f, 0.0f, 1.0f / 3};
  run_warp(3, cu::cross_entropy_body<true, n>{op, x.data(), labels.data(), g.data(), loss.data()});
  CHECK(std::isnan(loss[0]));
  CHECK(std::isfinite(loss[1]));
  CHECK(std::isnan(loss[2]));
  for (std::size_t j = 0; j < n; ++j) {
    CHECK(g[j] == 7.0f);  // the bad rows' gradients are left alone
    CHECK(g[2 * n + j] == 7.0f);
  }
}

/// An elementwise loss Op over n elements in chunks of loss_chunk: each chunk's sum and the
/// gradient against the CPU walker's elementwise_loss_sum over the same chunk.
template <class Op>
void check_elementwise_loss(std::size_t n, const std::vector<float>& x, const std::vector<float>& t) {
  using body = cu::elementwise_loss_body<true, Op>;
  const std::size_t chunks = body::chunks(n);
  const float scale = 1.0f / float(n);
  std::vector<double> loss(chunks), loss_again(chunks), loss_eval(chunks), loss_cpu(chunks), tol_loss(chunks);
  std::vector<float> g(n), g_again(n), g_cpu(n);
  run_warp(chunks, body{Op{}, x.data(), t.data(), g.data(), loss.data(), n, scale});
  run_warp(chunks, body{Op{}, x.data(), t.data(), g_again.data(), loss_again.data(), n, scale});
  run_warp(chunks, cu::elementwise_loss_body<false, Op>{Op{}, x.data(), t.data(), nullptr, loss_eval.data(), n, scale});
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t begin = c * cu::loss_chunk, len = std::min(cu::loss_chunk, n - begin);
    loss_cpu[c] = ops::elementwise_loss_sum<true>(Op{}, exec::row<dyn>(len), x.data() + begin, t.data() + begin,
                                                  g_cpu.data() + begin, scale);
    // Every term is >= 0: the sum is off by row_tol of itself.
    tol_loss[c] = row_tol * std::fabs(loss_cpu[c]);
  }
  CHECK(differing_bits(loss, loss_again) == 0);
  CHECK(differing_bits(g, g_again) == 0);
  check_agree("loss against the CPU walker", loss, loss_cpu, tol_loss);
  check_agree("loss_eval against the CPU walker", loss_eval, loss_cpu, tol_loss);
  // The slope times the scale: 2 (x - t) or sigmoid(x) - t, a few roundings (and exp) of the
  // operands' magnitudes, which may cancel.
  std::vector<double> tol_g(n);
  for (std::size_t i = 0; i < n; ++i)
    tol_g[i] = row_tol * scale * 2 * (std::fabs(double(x[i])) + std::fabs(double(t[i])) + 1);
  check_agree("g against the CPU walker", g, g_cpu, tol_g);
}

TEST_CASE("cuda row bodies: mse and bce_with_logits chunks and gradients match the CPU walker", "[eval][cuda]") {
  const std::size_t n = GENERATE(std::size_t(1), 5, 31, 32, 33, 100, 1000, 4096, 4097, 10000);
  INFO(n << " elements");
  std::vector<float> x(n), t(n), p(n);
  fill_uniform(x, -3, 3, 501);
  fill_uniform(t, -3, 3, 502);
  fill_uniform(p, 0, 1, 503);
  SECTION("mse") { check_elementwise_loss<ops::mse>(n, x, t); }
  SECTION("bce_with_logits") { check_elementwise_loss<ops::bce_with_logits>(n, x, p); }
  SECTION("NaN and infinite inputs as on the CPU") {
    if (n >= 3) {
      x[0] = qnan;
      x[n / 2] = inf;
      x[n - 1] = -inf;
    }
    check_elementwise_loss<ops::mse>(n, x, t);
    check_elementwise_loss<ops::bce_with_logits>(n, x, p);
  }
}

// ---- the total --------------------------------------------------------------------------

/// The device's sum of x: total_blocks(n) blocks of total_threads over x, then one block over
/// their totals (one block alone where total_blocks(n) is 1), each block emulated on its threads.
double emulated_total(const std::vector<double>& x) {
  using block = cu::block_total<cu::total_threads>;
  const std::size_t n = x.size(), blocks = cu::total_blocks(n);
  const auto one_block = [](const std::vector<double>& v, std::size_t first, std::size_t stride) {
    std::vector<double> shared(cu::total_threads), result(cu::total_threads);
    solder::test::run_block<cu::total_threads>([&](unsigned t, const auto& sync) {
      result[t] = block::run(t, first, stride, v.size(), [&](std::size_t i) { return v[i]; }, shared.data(), sync);
    });
    for (unsigned t = 1; t < cu::total_threads; ++t) REQUIRE(std::memcmp(&result[t], &result[0], sizeof(double)) == 0);
    return result[0];
  };
  if (blocks == 1) return one_block(x, 0, cu::total_threads);
  std::vector<double> partials(blocks);
  for (std::size_t b = 0; b < blocks; ++b)
    partials[b] = one_block(x, b * cu::total_threads, blocks * cu::total_threads);
  return one_block(partials, 0, cu::total_threads);
}

TEST_CASE("cuda total: the fixed-order block sum equals a plain double sum within its error bound", "[eval][cuda]") {
  const std::size_t n = GENERATE(std::size_t(1), 255, 256, 1000, 8192, 8193, 30000);
  INFO(n << " terms, " << cu::total_blocks(n) << " blocks");
  std::vector<double> x(n);
  fill_uniform(x, -1e3, 1e3, 601);
  double naive = 0, magnitude = 0;
  for (double v : x) {
    naive += v;
    magnitude += std::fabs(v);
  }
  const double got = emulated_total(x), again = emulated_total(x);
  CHECK(std::memcmp(&got, &again, sizeof got) == 0);
  // Each term passes through at most n / (blocks threads) + log2(threads) additions per pass,
  // each within one double rounding; the naive sum through n. Both together are within
  // (2 n + 2 log2(threads) + 2) u_double of the terms' magnitudes.
  const double bound = (2.0 * double(n) + 2 * 8 + 2) * 0x1p-53 * magnitude;
  CHECK(std::fabs(got - naive) <= bound);
}

}  // namespace
