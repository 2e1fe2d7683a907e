// tests/cuda/rows.cu: the CUDA backend's row kernels (softmax, log_softmax, layer_norm, the
// losses), its fixed-order totals and its optimizer updates (eval/cuda/row_kernels.hpp,
// update_kernels.hpp) on the device, against the same row bodies run on the host over an
// emulated warp (support/warp_emulation.hpp) and against double loops; every reduction and loss
// the same bits on a second run and for another launch shape. Exits 77 (ctest's skip code)
// where no CUDA device is present.
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "../support/data.hpp"
#include "../support/device_vector.hpp"
#include "../support/gpu_program.hpp"
#include "../support/warp_emulation.hpp"
#include "solder/eval/cuda/memory.hpp"
#include "solder/eval/cuda/row_kernels.hpp"
#include "solder/eval/cuda/update_kernels.hpp"

namespace {

namespace cu = solder::eval::cuda;
namespace ops = solder::ops;
using solder::dyn;
using solder::test::fill_uniform;
using solder::test::run_warp;

/// Device and host run the same float algorithm in the same order, but CUDA's expf and logf
/// differ from glibc's by up to 2 ulp and nvcc contracts a * b + c into one fma where the host
/// rounds twice: a few ulp per element and per row-sum term. 1e-5 (168 u) of the quantities
/// each result is made of covers them; an indexing or order mistake is off by the values
/// themselves.
constexpr double row_tol = 1e-5;
/// The optimizer updates: a few roundings each, some contracted into fmas on the device (as
/// ops_device.cu allows), relative to the magnitudes of the result, the old weight, the
/// gradient and the step.
constexpr double update_tol = 1e-5;

constexpr float inf = INFINITY;
constexpr float qnan = NAN;

/// NaN matches NaN, an infinity itself, anything else within tol.
bool agree(double got, double want, double tol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= tol;
}

template <class G, class W>
void expect_close(const char* what, const std::vector<G>& got, const std::vector<W>& want,
                  const std::vector<double>& tol) {
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!agree(double(got[i]), double(want[i]), tol[i]) && bad++ < 5)
      fprintf(stderr, "solder: %s, element %zu: device %.9g, host %.9g (tolerance %.3g)\n", what, i, double(got[i]),
              double(want[i]), tol[i]);
  if (bad) fprintf(stderr, "solder: %s: %d of %zu elements differ\n", what, bad, got.size());
  solder::test::gpu::failures += bad != 0;
}

/// a and b hold the same bits, two NaNs excepted (their payload says nothing of the order).
template <class T>
void expect_same_bits(const char* what, const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t bad = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    bad += !(isnan(a[i]) && isnan(b[i])) && std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  if (bad) {
    fprintf(stderr, "solder: %s: %zu elements differ in their bits\n", what, bad);
    ++solder::test::gpu::failures;
  }
}

using solder::test::gpu::device_vector;
using solder::test::gpu::expect;

/// Rows of n: special rows (a NaN, a +inf, a -inf among finite values, only -inf, logits near
/// 1000), then seeded rows in [-4, 4], `rows` in all.
std::vector<float> test_rows(std::size_t rows, std::size_t n, std::uint32_t seed) {
  std::vector<float> x(rows * n);
  fill_uniform(x, -4, 4, seed);
  x[0 * n + n / 2] = qnan;
  x[1 * n + n - 1] = inf;
  x[2 * n] = -inf;
  for (std::size_t j = 0; j < n; ++j) {
    x[3 * n + j] = -inf;
    x[4 * n + j] += 1000.0f;
  }
  return x;
}

cudaStream_t stream = nullptr;

// ---- softmax and log_softmax ------------------------------------------------------------

template <bool Log, std::size_t N>
void check_softmax() {
  using op = std::conditional_t<Log, ops::log_softmax, ops::softmax>;
  const char* name = Log ? "log_softmax" : "softmax";
  std::string what;
  constexpr std::size_t rows = 40;
  const std::vector<float> x = test_rows(rows, N, 11);
  std::vector<float> dy(rows * N);
  fill_uniform(dy, -1, 1, 12);
  const device_vector<float> dx_in(x), ddy(dy), dy_out(rows * N), dy_again(rows * N), dy_one_warp(rows * N);
  const auto forward = [&](const device_vector<float>& out) {
    if constexpr (Log)
      cu::log_softmax_forward<N>(dx_in.get(), out.get(), rows, stream);
    else
      cu::softmax_forward<N>(dx_in.get(), out.get(), rows, stream);
  };
  forward(dy_out);
  forward(dy_again);
  cu::row_kernel<<<1, 32, 0, stream>>>(cu::softmax_forward_body<op, N>{dx_in.get(), dy_one_warp.get()}, rows);
  cu::check(cudaGetLastError(), "softmax_forward_body launch on one warp");
  const std::vector<float> y = dy_out.read();
  what = std::string(name) + " forward, N = " + std::to_string(N);
  expect_same_bits((what + ", a second run").c_str(), y, dy_again.read());
  expect_same_bits((what + ", one warp for every row").c_str(), y, dy_one_warp.read());
  std::vector<float> want(rows * N);
  run_warp(rows, cu::softmax_forward_body<op, N>{x.data(), want.data()});
  std::vector<double> tol(rows * N);
  for (std::size_t i = 0; i < tol.size(); ++i)
    tol[i] = row_tol * (Log ? 1 + fabs(double(want[i])) : fabs(double(want[i])));
  expect_close(what.c_str(), y, want, tol);

  // In place: the same bits.
  const device_vector<float> in_place(x);
  if constexpr (Log)
    cu::log_softmax_forward<N>(in_place.get(), in_place.get(), rows, stream);
  else
    cu::softmax_forward<N>(in_place.get(), in_place.get(), rows, stream);
  expect_same_bits((what + ", in place").c_str(), y, in_place.read());

  // Backward from the device's y, on both sides.
  dy_out.put(y);
  const device_vector<float> ddx(rows * N), ddx_again(rows * N);
  const auto backward = [&](const device_vector<float>& out) {
    if constexpr (Log)
      cu::log_softmax_backward<N>(dy_out.get(), ddy.get(), out.get(), rows, stream);
    else
      cu::softmax_backward<N>(dy_out.get(), ddy.get(), out.get(), rows, stream);
  };
  backward(ddx);
  backward(ddx_again);
  const std::vector<float> dx = ddx.read();
  what = std::string(name) + " backward, N = " + std::to_string(N);
  expect_same_bits((what + ", a second run").c_str(), dx, ddx_again.read());
  std::vector<float> want_dx(rows * N);
  run_warp(rows, cu::softmax_backward_body<op, N>{y.data(), dy.data(), want_dx.data()});
  for (std::size_t r = 0; r < rows; ++r) {
    double s = 0;
    for (std::size_t j = 0; j < N; ++j)
      s += Log ? fabs(double(dy[r * N + j])) : fabs(double(dy[r * N + j]) * y[r * N + j]);
    for (std::size_t j = 0; j < N; ++j) {
      const std::size_t i = r * N + j;
      tol[i] = Log ? row_tol * (fabs(double(dy[i])) + exp(double(y[i])) * s)
                   : row_tol * fabs(double(y[i])) * (fabs(double(dy[i])) + s);
    }
  }
  expect_close(what.c_str(), dx, want_dx, tol);
}

// ---- layer_norm -------------------------------------------------------------------------

/// Forward and backward against the emulated warp on rows of mixed kinds.
template <std::size_t N>
void check_layer_norm() {
  constexpr double eps = 1e-5;
  constexpr std::size_t rows = 40;
  std::vector<float> x(rows * N), w(N), b(N), dy(rows * N);
  fill_uniform(x, -2, 2, 21);
  for (std::size_t j = 0; j < N; ++j) x[3 * N + j] = 1000.0f + x[3 * N + j] / 2;
  x[0 * N + N / 2] = qnan;
  x[1 * N] = inf;
  fill_uniform(w, 0.5, 1.5, 22);
  fill_uniform(b, -0.5, 0.5, 23);
  fill_uniform(dy, -1, 1, 24);
  const std::string name = "layer_norm, N = " + std::to_string(N);

  const device_vector<float> dx_in(x), dw_in(w), db_in(b), dy_dev(dy), dy_out(rows * N), dmean(rows), drstd(rows);
  cu::layer_norm_forward<N>(dx_in.get(), dw_in.get(), db_in.get(), dy_out.get(), dmean.get(), drstd.get(), rows, eps,
                            stream);
  const std::vector<float> y = dy_out.read(), mean = dmean.read(), rstd = drstd.read();
  std::vector<float> want_y(rows * N), want_mean(rows), want_rstd(rows);
  run_warp(rows, cu::layer_norm_forward_body<N>{x.data(), w.data(), b.data(), want_y.data(), want_mean.data(),
                                                want_rstd.data(), eps});
  // The mean to 8 u of itself and 64 u of the row's spread, rstd to row_tol of itself, y from
  // them (scaled by w rstd).
  std::vector<double> tol_mean(rows), tol_rstd(rows), tol_y(rows * N);
  for (std::size_t r = 0; r < rows; ++r) {
    double spread = 0;
    for (std::size_t j = 0; j < N; ++j) spread = fmax(spread, fabs(double(x[r * N + j]) - want_mean[r]));
    tol_mean[r] = 0x1p-24 * (8 * fabs(double(want_mean[r])) + 64 * spread);
    tol_rstd[r] = row_tol * want_rstd[r];
    for (std::size_t j = 0; j < N; ++j) {
      const double xhat = (double(x[r * N + j]) - want_mean[r]) * want_rstd[r];
      tol_y[r * N + j] =
          row_tol * (fabs(w[j] * xhat) + fabs(double(b[j])) + 1) + 2 * fabs(double(w[j])) * want_rstd[r] * tol_mean[r];
    }
  }
  expect_close((name + " mean").c_str(), mean, want_mean, tol_mean);
  expect_close((name + " rstd").c_str(), rstd, want_rstd, tol_rstd);
  expect_close((name + " y").c_str(), y, want_y, tol_y);

  // Backward from the device's statistics on both sides, rows 2.. (finite).
  constexpr std::size_t skip = 2, grows = rows - skip;
  const device_vector<float> ddx(grows * N), dgw(N), dgb(N), dgw_again(N), dgb_again(N);
  const auto backward = [&](const device_vector<float>& gw, const device_vector<float>& gb) {
    cu::layer_norm_backward<N>(dx_in.get() + skip * N, dy_dev.get() + skip * N, dw_in.get(), dmean.get() + skip,
                               drstd.get() + skip, ddx.get(), gw.get(), gb.get(), grows, stream);
  };
  backward(dgw, dgb);
  backward(dgw_again, dgb_again);
  const std::vector<float> dx = ddx.read(), gw = dgw.read(), gb = dgb.read();
  expect_same_bits((name + " dweight, a second run").c_str(), gw, dgw_again.read());
  expect_same_bits((name + " dbias, a second run").c_str(), gb, dgb_again.read());
  const cu::row_chunks chunks(grows);
  std::vector<float> want_dx(grows * N), partial(chunks.count * 2 * N), want_gw(N), want_gb(N);
  std::vector<double> total(chunks.count * 2 * N);
  run_warp(chunks.count, cu::layer_norm_backward_body<N>{x.data() + skip * N, dy.data() + skip * N, w.data(),
                                                         mean.data() + skip, rstd.data() + skip, want_dx.data(),
                                                         partial.data(), total.data(), chunks});
  const cu::layer_norm_param_grad_body grads{total.data(), chunks.count, N, want_gw.data(), want_gb.data()};
  for (std::size_t j = 0; j < 2 * N; ++j) grads(j);
  std::vector<double> tol_dx(grows * N), tol_gw(N, 0), tol_gb(N, 0);
  for (std::size_t r = 0; r < grows; ++r) {
    const std::size_t s = r + skip;
    double ag = 0, agx = 0;
    for (std::size_t j = 0; j < N; ++j) {
      const double xhat = (double(x[s * N + j]) - mean[s]) * rstd[s], g = double(dy[s * N + j]) * w[j];
      ag += fabs(g) / N;
      agx += fabs(g * xhat) / N;
      tol_gw[j] += row_tol * fabs(double(dy[s * N + j]) * xhat);
      tol_gb[j] += row_tol * fabs(double(dy[s * N + j]));
    }
    for (std::size_t j = 0; j < N; ++j) {
      const double xhat = (double(x[s * N + j]) - mean[s]) * rstd[s], g = double(dy[s * N + j]) * w[j];
      tol_dx[r * N + j] = row_tol * rstd[s] * (fabs(g) + ag + fabs(xhat) * agx);
    }
  }
  expect_close((name + " dx").c_str(), dx, want_dx, tol_dx);
  expect_close((name + " dweight").c_str(), gw, want_gw, tol_gw);
  expect_close((name + " dbias").c_str(), gb, want_gb, tol_gb);
}

/// Many rows (chunks of several rows, flushed to double): dweight and dbias against double sums.
void check_layer_norm_many_rows() {
  constexpr std::size_t N = 64, rows = 20000;
  std::vector<float> x(rows * N), w(N, 1.0f), b(N, 0.0f), dy(rows * N);
  fill_uniform(x, -2, 2, 31);
  fill_uniform(dy, -1, 1, 32);
  const device_vector<float> dx_in(x), dw_in(w), db_in(b), dy_dev(dy), dy_out(rows * N), dmean(rows), drstd(rows),
      ddx(rows * N), dgw(N), dgb(N), dgw_again(N), dgb_again(N);
  cu::layer_norm_forward<N>(dx_in.get(), dw_in.get(), db_in.get(), dy_out.get(), dmean.get(), drstd.get(), rows, 1e-5,
                            stream);
  cu::layer_norm_backward<N>(dx_in.get(), dy_dev.get(), dw_in.get(), dmean.get(), drstd.get(), ddx.get(), dgw.get(),
                             dgb.get(), rows, stream);
  cu::layer_norm_backward<N>(dx_in.get(), dy_dev.get(), dw_in.get(), dmean.get(), drstd.get(), ddx.get(),
                             dgw_again.get(), dgb_again.get(), rows, stream);
  const std::vector<float> mean = dmean.read(), rstd = drstd.read(), gw = dgw.read(), gb = dgb.read();
  expect_same_bits("layer_norm dweight over 20000 rows, a second run", gw, dgw_again.read());
  expect_same_bits("layer_norm dbias over 20000 rows, a second run", gb, dgb_again.read());
  std::vector<double> want_gw(N, 0), want_gb(N, 0), tol_gw(N, 0), tol_gb(N, 0);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < N; ++j) {
      const float xhat = (x[r * N + j] - mean[r]) * rstd[r];  // as the op forms it
      const double t = double(dy[r * N + j]) * xhat;
      want_gw[j] += t;
      want_gb[j] += dy[r * N + j];
      tol_gw[j] += row_tol * fabs(t);
      tol_gb[j] += row_tol * fabs(double(dy[r * N + j]));
    }
  expect_close("layer_norm dweight over 20000 rows", gw, want_gw, tol_gw);
  expect_close("layer_norm dbias over 20000 rows", gb, want_gb, tol_gb);
}

// ---- losses -----------------------------------------------------------------------------

template <std::size_t C>
void check_cross_entropy(float smoothing) {
  constexpr std::size_t rows = 40;
  const std::string name =
      "softmax_cross_entropy, C = " + std::to_string(C) + ", label_smoothing " + std::to_string(smoothing);
  std::vector<float> x = test_rows(rows, C, 41);
  // The special rows make the mean NaN or infinite: they are compared per row, the mean on
  // the seeded rows from 5 on.
  std::vector<std::int32_t> labels(rows);
  for (std::size_t r = 0; r < rows; ++r) labels[r] = std::int32_t((r * 7 + 3) % C);
  const ops::softmax_cross_entropy op{1.0f - smoothing, smoothing / float(C), 1.0f / float(rows)};
  const device_vector<float> dx(x), dg(rows * C);
  const device_vector<std::int32_t> dlabels(labels);
  // Per row, all rows (NaN and infinities included), through the row kernel the launcher runs.
  const device_vector<double> dloss(rows);
  cu::row_kernel<<<4, cu::row_block_threads, 0, stream>>>(
      cu::cross_entropy_body<true, C>{op, dx.get(), dlabels.get(), dg.get(), dloss.get()}, rows);
  cu::check(cudaGetLastError(), "cross_entropy_body launch");
  const std::vector<double> loss = dloss.read();
  const std::vector<float> g = dg.read();
  std::vector<double> want_loss(rows);
  std::vector<float> want_g(rows * C);
  run_warp(rows, cu::cross_entropy_body<true, C>{op, x.data(), labels.data(), want_g.data(), want_loss.data()});
  std::vector<double> tol_loss(rows), tol_g(rows * C);
  for (std::size_t r = 0; r < rows; ++r) {
    tol_loss[r] = row_tol * (1 + fabs(want_loss[r]));
    for (std::size_t j = 0; j < C; ++j) {
      const double target = op.spread + (j == std::size_t(labels[r]) ? op.keep : 0.0f);
      tol_g[r * C + j] = row_tol * (fabs(double(want_g[r * C + j])) + target * op.scale);
    }
  }
  expect_close((name + " row losses").c_str(), loss, want_loss, tol_loss);
  expect_close((name + " gradient").c_str(), g, want_g, tol_g);

  // The launcher's mean over the finite rows, with and without the gradient: the same bits on
  // a second run, within row_tol of the host's double sum of the emulated rows' losses.
  constexpr std::size_t first = 5, finite = rows - first;
  const ops::softmax_cross_entropy mean_op{1.0f - smoothing, smoothing / float(C), 1.0f / float(finite)};
  std::vector<double> host_loss(finite);
  std::vector<float> host_g(finite * C);
  run_warp(finite, cu::cross_entropy_body<true, C>{mean_op, x.data() + first * C, labels.data() + first, host_g.data(),
                                                   host_loss.data()});
  double want = 0, magnitude = 0;
  for (double l : host_loss) {
    want += l;
    magnitude += fabs(l);
  }
  want /= double(finite);
  const device_vector<float> dgm(finite * C), dgm_again(finite * C);
  const double mean =
      cu::softmax_cross_entropy<C>(dx.get() + first * C, dlabels.get() + first, dgm.get(), finite, smoothing, stream);
  const double again = cu::softmax_cross_entropy<C>(dx.get() + first * C, dlabels.get() + first, dgm_again.get(),
                                                    finite, smoothing, stream);
  const double eval = cu::softmax_cross_entropy<C>(dx.get() + first * C, dlabels.get() + first, nullptr, finite,
                                                   smoothing, stream);
  const std::vector<float> g_mean = dgm.read();
  expect_same_bits((name + " mean, a second run").c_str(), std::vector<double>{mean}, std::vector<double>{again});
  expect_same_bits((name + " gradient, a second run").c_str(), g_mean, dgm_again.read());
  const std::vector<double> tol_mean{row_tol * (1 + magnitude / double(finite))};
  expect_close((name + " mean").c_str(), std::vector<double>{mean}, std::vector<double>{want}, tol_mean);
  expect_close((name + " mean without the gradient").c_str(), std::vector<double>{eval}, std::vector<double>{want},
               tol_mean);
  std::vector<double> tol_gm(finite * C);
  for (std::size_t r = 0; r < finite; ++r)
    for (std::size_t j = 0; j < C; ++j) {
      const double target = mean_op.spread + (j == std::size_t(labels[first + r]) ? mean_op.keep : 0.0f);
      tol_gm[r * C + j] = row_tol * (fabs(double(host_g[r * C + j])) + target * mean_op.scale);
    }
  expect_close((name + " gradient of the mean").c_str(), g_mean, host_g, tol_gm);
}

void check_bad_label() {
  constexpr std::size_t C = 10, rows = 300;
  std::vector<float> x(rows * C);
  fill_uniform(x, -1, 1, 51);
  std::vector<std::int32_t> labels(rows, 2);
  labels[217] = 10;
  labels[250] = -1;
  const device_vector<float> dx(x);
  const device_vector<std::int32_t> dlabels(labels);
  try {
    cu::softmax_cross_entropy<C>(dx.get(), dlabels.get(), nullptr, rows, 0.0f, stream);
    expect(false, "softmax_cross_entropy: a label of 10 for 10 classes was not reported");
  } catch (const solder::error& e) {
    expect(std::string(e.what()).find("label 10 of row 217 is outside [0, 10)") != std::string::npos,
           (std::string("softmax_cross_entropy: unexpected message: ") + e.what()).c_str());
  }
}

/// An elementwise loss over n elements: the mean and gradient against the emulated chunks.
template <class Op>
void check_elementwise_loss(const char* name, std::size_t n, bool probabilities) {
  std::vector<float> x(n), t(n);
  fill_uniform(x, -3, 3, 61);
  fill_uniform(t, probabilities ? 0 : -3, probabilities ? 1 : 3, 62);
  const device_vector<float> dx(x), dt(t), dg(n), dg_again(n);
  double mean, again, eval;
  if constexpr (std::is_same_v<Op, ops::mse>) {
    mean = cu::mse(dx.get(), dt.get(), dg.get(), n, stream);
    again = cu::mse(dx.get(), dt.get(), dg_again.get(), n, stream);
    eval = cu::mse(dx.get(), dt.get(), nullptr, n, stream);
  } else {
    mean = cu::bce_with_logits(dx.get(), dt.get(), dg.get(), n, stream);
    again = cu::bce_with_logits(dx.get(), dt.get(), dg_again.get(), n, stream);
    eval = cu::bce_with_logits(dx.get(), dt.get(), nullptr, n, stream);
  }
  const std::string what = std::string(name) + ", " + std::to_string(n) + " elements";
  const std::vector<float> g = dg.read();
  expect_same_bits((what + " mean, a second run").c_str(), std::vector<double>{mean}, std::vector<double>{again});
  expect_same_bits((what + " gradient, a second run").c_str(), g, dg_again.read());
  using body = cu::elementwise_loss_body<true, Op>;
  const std::size_t chunks = body::chunks(n);
  std::vector<double> sums(chunks);
  std::vector<float> want_g(n);
  run_warp(chunks, body{Op{}, x.data(), t.data(), want_g.data(), sums.data(), n, 1.0f / float(n)});
  double want = 0;
  for (double s : sums) want += s;
  want /= double(n);
  const std::vector<double> tol_mean{row_tol * fabs(want)};  // every term >= 0
  expect_close((what + " mean").c_str(), std::vector<double>{mean}, std::vector<double>{want}, tol_mean);
  expect_close((what + " mean without the gradient").c_str(), std::vector<double>{eval}, std::vector<double>{want},
               tol_mean);
  std::vector<double> tol_g(n);
  for (std::size_t i = 0; i < n; ++i)
    tol_g[i] = row_tol / double(n) * 2 * (fabs(double(x[i])) + fabs(double(t[i])) + 1);
  expect_close((what + " gradient").c_str(), g, want_g, tol_g);
}

// ---- totals -----------------------------------------------------------------------------

/// The emulated blocks of total.hpp over term(i), i < n: the device's bits exactly (double
/// additions in the same order; x^2 of a float is exact in double, so a contracted fma
/// changes nothing).
template <class Term>
double emulated_total(const Term& term, std::size_t n) {
  using block = cu::block_total<cu::total_threads>;
  const auto one_block = [](const auto& f, std::size_t count, std::size_t first, std::size_t stride) {
    std::vector<double> shared(cu::total_threads), result(cu::total_threads);
    solder::test::run_block<cu::total_threads>([&](unsigned t, const auto& sync) {
      result[t] = block::run(t, first, stride, count, f, shared.data(), sync);
    });
    return result[0];
  };
  const std::size_t blocks = cu::total_blocks(n);
  if (blocks == 1) return one_block(term, n, 0, cu::total_threads);
  std::vector<double> partials(blocks);
  for (std::size_t b = 0; b < blocks; ++b)
    partials[b] = one_block(term, n, b * cu::total_threads, blocks * cu::total_threads);
  return one_block(cu::double_terms{partials.data()}, blocks, 0, cu::total_threads);
}

void check_totals(std::size_t n) {
  std::vector<double> x(n);
  std::vector<float> f(n);
  fill_uniform(x, -1e3, 1e3, 71);
  fill_uniform(f, -2, 2, 72);
  const device_vector<double> dx(x), out(2), out_again(2);
  const device_vector<float> df(f);
  cu::total(dx.get(), n, out.get(), stream);
  cu::sum_of_squares(df.get(), n, out.get() + 1, stream);
  cu::total(dx.get(), n, out_again.get(), stream);
  cu::sum_of_squares(df.get(), n, out_again.get() + 1, stream);
  const std::vector<double> got = out.read();
  const std::string what = std::to_string(n) + " terms";
  expect_same_bits(("total and sum_of_squares of " + what + ", a second run").c_str(), got, out_again.read());
  const std::vector<double> want{emulated_total(cu::double_terms{x.data()}, n),
                                 emulated_total(cu::square_terms{f.data()}, n)};
  expect_same_bits(("total and sum_of_squares of " + what + ": the host's emulated blocks").c_str(), got, want);
}

// ---- the launchers over device views ----------------------------------------------------

/// The tensor_ref overloads run the pointer launchers: the same bits, and batch mismatches
/// are solder::errors.
void check_tensor_views() {
  using S = solder::shape<dyn, 3, 33>;
  using vec = solder::shape<33>;
  using per_row = solder::shape<dyn>;
  using solder::device;
  using solder::tensor_ref;
  constexpr std::size_t batch = 4, rows = batch * 3, n = rows * 33;
  std::vector<float> x(n), dy(n), w(33), b(33);
  fill_uniform(x, -3, 3, 91);
  fill_uniform(dy, -1, 1, 92);
  fill_uniform(w, 0.5, 1.5, 93);
  fill_uniform(b, -0.5, 0.5, 94);
  std::vector<std::int32_t> labels(rows);
  for (std::size_t r = 0; r < rows; ++r) labels[r] = std::int32_t(r * 5 % 33);
  const device_vector<float> dx(x), ddy(dy), dw(w), db(b), y1(n), y2(n), g1(n), g2(n), m1(rows), m2(rows), s1(rows),
      s2(rows), gw1(33), gw2(33), gb1(33), gb2(33);
  const device_vector<std::int32_t> dlabels(labels);
  const tensor_ref<const float, S, device> vx(dx.get(), batch), vdy(ddy.get(), batch);
  const tensor_ref<float, S, device> vy(y2.get(), batch), vg(g2.get(), batch);

  cu::softmax_forward<33>(dx.get(), y1.get(), rows, stream);
  cu::softmax_forward(vx, vy, stream);
  expect_same_bits("softmax_forward over views", y1.read(), y2.read());
  cu::log_softmax_backward<33>(dx.get(), ddy.get(), g1.get(), rows, stream);
  cu::log_softmax_backward(vx, vdy, vg, stream);
  expect_same_bits("log_softmax_backward over views", g1.read(), g2.read());

  cu::layer_norm_forward<33>(dx.get(), dw.get(), db.get(), y1.get(), m1.get(), s1.get(), rows, 1e-5, stream);
  cu::layer_norm_forward(vx, tensor_ref<const float, vec, device>(dw.get()),
                         tensor_ref<const float, vec, device>(db.get()), vy,
                         tensor_ref<float, per_row, device>(m2.get(), rows),
                         tensor_ref<float, per_row, device>(s2.get(), rows), 1e-5, stream);
  expect_same_bits("layer_norm_forward over views", y1.read(), y2.read());
  cu::layer_norm_backward<33>(dx.get(), ddy.get(), dw.get(), m1.get(), s1.get(), g1.get(), gw1.get(), gb1.get(), rows,
                              stream);
  cu::layer_norm_backward(vx, vdy, tensor_ref<const float, vec, device>(dw.get()),
                          tensor_ref<const float, per_row, device>(m2.get(), rows),
                          tensor_ref<const float, per_row, device>(s2.get(), rows), vg,
                          tensor_ref<float, vec, device>(gw2.get()), tensor_ref<float, vec, device>(gb2.get()), stream);
  expect_same_bits("layer_norm_backward over views: dx", g1.read(), g2.read());
  expect_same_bits("layer_norm_backward over views: dweight", gw1.read(), gw2.read());
  expect_same_bits("layer_norm_backward over views: dbias", gb1.read(), gb2.read());

  const tensor_ref<const std::int32_t, per_row, device> vlabels(dlabels.get(), rows);
  const double ce1 = cu::softmax_cross_entropy<33>(dx.get(), dlabels.get(), g1.get(), rows, 0.1f, stream);
  const double ce2 = cu::softmax_cross_entropy(vx, vlabels, vg, 0.1f, stream);
  const double ce3 = cu::softmax_cross_entropy(vx, vlabels, 0.1f, stream);
  expect_same_bits("softmax_cross_entropy over views", std::vector<double>{ce1, ce1}, std::vector<double>{ce2, ce3});
  expect_same_bits("softmax_cross_entropy over views: the gradient", g1.read(), g2.read());
  const double l1 = cu::mse(dx.get(), ddy.get(), g1.get(), n, stream), l2 = cu::mse(vx, vdy, vg, stream);
  const double l3 = cu::bce_with_logits(dx.get(), ddy.get(), nullptr, n, stream);
  const double l4 = cu::bce_with_logits(vx, vdy, stream);
  expect_same_bits("mse and bce_with_logits over views", std::vector<double>{l1, l3}, std::vector<double>{l2, l4});
  expect_same_bits("mse over views: the gradient", g1.read(), g2.read());

  try {
    cu::softmax_forward(vx, tensor_ref<float, S, device>(y2.get(), batch - 1), stream);
    expect(false, "softmax_forward: a y of another batch was not reported");
  } catch (const solder::error& e) {
    expect(std::string(e.what()).find("y has a batch of 3 but the input has 4") != std::string::npos,
           (std::string("softmax_forward: unexpected message: ") + e.what()).c_str());
  }
}

// ---- optimizer updates ------------------------------------------------------------------

void check_updates() {
  constexpr std::size_t n = 10007;
  std::vector<float> w(n), g(n), b(n), m(n), v(n);
  fill_uniform(w, -1, 1, 81);
  fill_uniform(g, -1, 1, 82);
  fill_uniform(b, -0.5, 0.5, 83);
  fill_uniform(m, -0.5, 0.5, 84);
  fill_uniform(v, 0, 0.25, 85);
  std::vector<double> tol(n);
  const auto close_to = [&](const char* what, const std::vector<float>& got, const std::vector<float>& want,
                            const std::vector<float>& before) {
    for (std::size_t i = 0; i < n; ++i)
      tol[i] = update_tol * (fabs(double(want[i])) + fabs(double(before[i])) + fabs(double(g[i])) +
                             fabs(double(want[i]) - double(before[i])));
    expect_close(what, got, want, tol);
  };
  {
    const ops::sgd_update u(3.1e-3f, 0.0f, 0.0f, 1.7e-2f, false, false);
    const device_vector<float> dw(w), dg(g);
    cu::sgd_step(u, dw.get(), dg.get(), n, stream);
    std::vector<float> want = w;
    for (std::size_t i = 0; i < n; ++i) u(want[i], g[i]);
    close_to("sgd_step without momentum", dw.read(), want, w);
  }
  for (const bool nesterov : {false, true}) {
    const ops::sgd_update u(3.1e-3f, 0.9f, 0.1f, 1.7e-2f, nesterov, false);
    const device_vector<float> dw(w), dg(g), db(b);
    cu::sgd_step(u, dw.get(), dg.get(), db.get(), n, stream);
    std::vector<float> want = w, want_b = b;
    for (std::size_t i = 0; i < n; ++i) u(want[i], g[i], want_b[i]);
    close_to(nesterov ? "sgd_step, nesterov: w" : "sgd_step with momentum: w", dw.read(), want, w);
    close_to(nesterov ? "sgd_step, nesterov: buffer" : "sgd_step with momentum: buffer", db.read(), want_b, b);
  }
  const auto adam = [&]<bool Decoupled>(const ops::adam_update<Decoupled>& u, const char* name) {
    const device_vector<float> dw(w), dg(g), dm(m), dv(v);
    cu::adam_step(u, dw.get(), dg.get(), dm.get(), dv.get(), n, stream);
    std::vector<float> want = w, want_m = m, want_v = v;
    for (std::size_t i = 0; i < n; ++i) u(want[i], g[i], want_m[i], want_v[i]);
    close_to((std::string(name) + ": w").c_str(), dw.read(), want, w);
    close_to((std::string(name) + ": m").c_str(), dm.read(), want_m, m);
    close_to((std::string(name) + ": v").c_str(), dv.read(), want_v, v);
  };
  adam(ops::adam_update<false>(1.3e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, 3), "adam_step (Adam)");
  adam(ops::adam_update<true>(1.3e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, 3), "adam_step (AdamW)");
  {
    // Clipping by the norm from the device's sum of squares.
    const device_vector<float> dg(g);
    const device_vector<double> dsum(1);
    cu::sum_of_squares(dg.get(), n, dsum.get(), stream);
    const double norm = sqrt(dsum.read()[0]);
    double want_sum = 0;
    for (float x : g) want_sum += double(x) * x;
    expect_close("sum_of_squares", std::vector<double>{norm * norm}, std::vector<double>{want_sum},
                 std::vector<double>{1e-10 * want_sum});  // two orders of 10^4 double additions
    const ops::clip_scale clip(1.0f, norm);
    expect(clip.scales(), "clip_scale: a norm of about 58 against 1 must scale");
    cu::clip_gradients(clip, dg.get(), n, stream);
    std::vector<float> want = g;
    for (float& x : want) clip(x);
    close_to("clip_gradients", dg.read(), want, g);
    const ops::clip_scale none(1e6f, norm);
    cu::clip_gradients(none, dg.get(), n, stream);
    expect_same_bits("clip_gradients below max_norm leaves the gradients", dg.read(), want);
  }
  {
    // Three micro-batches: first, middle, last (the mean into g).
    const device_vector<float> dsum(n), dg(g);
    std::vector<float> sum(n), host_g = g;
    for (int k = 0; k < 3; ++k) {
      const ops::grad_fold fold{3.0f, k == 0, k == 2};
      cu::fold_gradients(fold, dsum.get(), dg.get(), n, stream);
      for (std::size_t i = 0; i < n; ++i) {
        float acc = fold.first ? 0.0f : sum[i];
        fold(acc, host_g[i]);
        (fold.last ? host_g : sum)[i] = acc;
      }
    }
    close_to("fold_gradients: the mean over three micro-batches", dg.read(), host_g, g);
  }
}

}  // namespace

int main() {
  return solder::test::gpu::run(
      "tests/cuda/rows.cu", "solder: the row kernels, losses, totals and optimizer updates match the host", [] {
        cu::check(cudaStreamCreate(&stream), "cudaStreamCreate");
        []<std::size_t... N>(std::index_sequence<N...>) {
          constexpr std::size_t lengths[] = {1, 5, 31, 32, 33, 100, 1000};
          (check_softmax<false, lengths[N]>(), ...);
          (check_softmax<true, lengths[N]>(), ...);
          (check_layer_norm<lengths[N]>(), ...);
          (check_cross_entropy<lengths[N]>(0.0f), ...);
          (check_cross_entropy<lengths[N]>(0.1f), ...);
        }(std::make_index_sequence<7>{});
        check_layer_norm_many_rows();
        check_bad_label();
        for (const std::size_t n : {std::size_t(1), std::size_t(33), std::size_t(4097), std::size_t(100000)}) {
          check_elementwise_loss<ops::mse>("mse", n, false);
          check_elementwise_loss<ops::bce_with_logits>("bce_with_logits", n, true);
        }
        for (const std::size_t n : {std::size_t(1), std::size_t(1000), std::size_t(8193), std::size_t(50000)})
          check_totals(n);
        check_tensor_views();
        check_updates();
        cu::check(cudaStreamDestroy(stream), "cudaStreamDestroy");
      });
}
