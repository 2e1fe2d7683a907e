// nn/layer_norm.hpp: PyTorch's nn.LayerNorm(N) over the feature axis of [batch, N] activations,
// as a block of its own: one visit per row forward (statistics, then y) and backward (two sums,
// then dx and this row's share of dweight and dbias).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "solder/config.hpp"
#include "solder/diagnostic.hpp"
#include "solder/nn/batch_check.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/eval/cpu/row.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

namespace detail {

/// The row kernels of layer_norm<N>, on the vector walk of eval::cpu::row<N>.
template <std::size_t N>
struct layer_norm_row : eval::cpu::row<N> {
  using R = eval::cpu::row<N>;
  using typename R::V;
  using R::each;
  using R::full;
  using R::lanes;
  using R::load;
  using R::rest;
  using R::store;
  using R::sum;

  /// y = (x - mean) rstd w + b for one row; writes {mean, rstd} to stats.
  ///
  /// Statistics: a corrected two-pass over the row while it sits in L1 (Chan, Golub and
  /// LeVeque 1983): pass 1 gives a mean m1; pass 2 sums d = x - m1 and d^2, so mean =
  /// m1 + sum d / N repairs m1's rounding, and the variance sums small squares that do not
  /// cancel, where E[x^2] - mean^2 loses everything once |mean| >> std. Sums as in sums().
  /// The variance is the biased one (/ N), as torch's.
  static SOLDER_INLINE void forward(const float* x, float* y, const float* w, const float* b, double eps, float* stats) {
    const double n = double(N);
    const float m1 = float(R::template sums<1>([&]<class T>(std::size_t j, T) { return std::array<V, 1>{load(T{}, x + j)}; })[0] / n);
    const V vm1(m1);
    const auto [s1, s2] = R::template sums<2>([&]<class T>(std::size_t j, T) {
      const V d = load(T{}, x + j, m1) - vm1;  // padding with m1 gives d = 0
      return std::array<V, 2>{d, d * d};
    });
    const double shift = s1 / n;
    const double var = std::max(s2 / n - shift * shift, 0.0);  // NaN stays NaN
    const float mean = float(double(m1) + shift);
    const float rstd = float(1.0 / std::sqrt(var + eps));
    stats[0] = mean;
    stats[1] = rstd;
    const V vm(mean), vr(rstd);
    each([&]<class T>(std::size_t j, T) {
      const V xhat = (load(T{}, x + j) - vm) * vr;
      store(T{}, y + j, simd::fma(xhat, load(T{}, w + j), load(T{}, b + j)));
    });
  }

  /// dx for one row, and its dy xhat and dy added to dw and db:
  ///   g = dy w,  dx = rstd (g - mean(g) - xhat mean(g xhat)).
  static SOLDER_INLINE void backward(const float* x, const float* dy, const float* w, float mean, float rstd, float* dx,
                                     float* dw, float* db) {
    const V vm(mean), vr(rstd);
    const auto [sg, sgx] = R::template sums<2>([&]<class T>(std::size_t j, T) {
      const V xhat = (load(T{}, x + j, mean) - vm) * vr;
      const V g = load(T{}, dy + j) * load(T{}, w + j);  // padding dy with 0 zeroes both terms
      return std::array<V, 2>{g, g * xhat};
    });
    const V mg(float(sg / double(N))), mgx(float(sgx / double(N)));
    each([&]<class T>(std::size_t j, T) {
      const V xhat = (load(T{}, x + j, mean) - vm) * vr;
      const V d = load(T{}, dy + j);
      store(T{}, dx + j, (d * load(T{}, w + j) - simd::fma(xhat, mgx, mg)) * vr);
      store(T{}, dw + j, simd::fma(d, xhat, load(T{}, dw + j)));
      store(T{}, db + j, load(T{}, db + j) + d);
    });
  }
};

}  // namespace detail

/// y = (x - E[x]) / sqrt(Var[x] + eps) * weight + bias over each row of x [batch, N]: torch's
/// nn.LayerNorm(N, eps) with elementwise_affine (weight [N] starts at 1, bias [N] at 0; Var is
/// the biased variance). Keeps each row's mean and 1/sqrt(Var + eps) for backward. Results
/// do not depend on the thread count. A NaN or infinity in a row makes that row's y NaN.
template <std::size_t N>
class layer_norm {
  static_assert(N >= 1, "solder::nn::layer_norm: the feature count N must be at least 1");
  using row = detail::layer_norm_row<N>;

 public:
  static constexpr std::size_t in_features = N;
  static constexpr std::size_t out_features = N;
  static constexpr const char* name = "layer_norm";
  static constexpr std::size_t parameter_count = 2 * N;
  /// Per sample, approximate: mean (N), shifted sums (3N), normalize and affine (4N).
  static constexpr double forward_flops = 8.0 * N;
  /// Per sample, approximate: the two sums (6N), dx (6N), dweight and dbias (3N).
  static constexpr double backward_flops = 15.0 * N;
  /// Floats per sample kept for backward beyond x and y: the row's mean and rstd.
  static constexpr std::size_t saved_floats = 2;

  tensor<float, shape<N>> weight;       // gamma
  tensor<float, shape<N>> bias;         // beta
  tensor<float, shape<N>> weight_grad;  // dL/dweight, written by backward
  tensor<float, shape<N>> bias_grad;    // dL/dbias, written by backward
  float eps;                            // added to the variance, as torch's eps

  explicit layer_norm(float eps = 1e-5f) : eps(eps) { reset_parameters(); }

  /// torch's LayerNorm.reset_parameters: weight 1, bias 0.
  void reset_parameters() {
    weight.fill(1.0f);
    bias.fill(0.0f);
  }

  /// {prefix + "weight", prefix + "bias"}, as torch's state_dict names them.
  std::vector<optim::param> params(const std::string& prefix = "") {
    return {optim::make_param(prefix + "weight", weight, weight_grad), optim::make_param(prefix + "bias", bias, bias_grad)};
  }

  /// y = layer_norm(x) for x, y [batch, N]; y may be x (in place). Saves each row's statistics.
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX> x, tensor_ref<float, SY> y) {
    static_assert(check_shapes<SX, SY>());
    if (x.batch() != y.batch())
      detail::batches_differ("solder::nn::layer_norm::forward", {{"x", x.batch()}, {"y", y.batch()}});
    const std::size_t rows = SX::elements(x.batch()) / N;
    if (stats.batch() < rows) stats = tensor<float, shape<dyn, 2>>(rows);
    saved_rows = rows;
    const float *xp = x.data(), *w = weight.data(), *b = bias.data();
    float* yp = y.data();
    float* st = stats.data();
    const double e = eps;
    // Rows are independent: how they are split among threads cannot change a result.
    const int threads = rows * N >= parallel_min_elements ? num_threads() : 1;
    const std::size_t per = (rows + std::size_t(threads) - 1) / std::size_t(threads);
    eval::cpu::parallel_for(std::size_t(threads), threads, [&](std::size_t t) {
      for (std::size_t r = t * per; r < std::min(rows, (t + 1) * per); ++r)
        row::forward(xp + r * N, yp + r * N, w, b, e, st + 2 * r);
    });
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX>& x, tensor<float, SY>& y) {
    forward(x.ref(), y.ref());
  }

  /// dx = dL/dx, and weight_grad, bias_grad (overwritten), for the last forward, whose input
  /// and output x and y were; uses the statistics it saved. dx may be dy (in place).
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX> x, tensor_ref<const float, SY> y, tensor_ref<const float, SY> dy,
                tensor_ref<float, SX> dx) {
    static_assert(check_shapes<SX, SY>());
    const std::size_t batch = x.batch();
    if (y.batch() != batch || dy.batch() != batch || dx.batch() != batch)
      detail::batches_differ("solder::nn::layer_norm::backward",
                             {{"x", batch}, {"y", y.batch()}, {"dy", dy.batch()}, {"dx", dx.batch()}});
    const std::size_t rows = SX::elements(batch) / N;
    if (saved_rows == 0)
      solder::detail::fail("solder::nn::layer_norm::backward: no forward has run; backward needs the row statistics "
                           "of the forward on this batch");
    if (rows != saved_rows)
      solder::detail::fail("solder::nn::layer_norm::backward: the last forward saw " + std::to_string(saved_rows) +
                           " rows but backward got " + std::to_string(rows) + "; run forward on this batch first");
    // Chunks depend on the sizes only; each sums its rows' dweight and dbias in float for up
    // to flush_rows rows, then in double; the chunks are added in order. So the gradients are
    // the same for any thread count.
    const std::size_t per = std::max((rows + max_chunks - 1) / max_chunks, (min_chunk_elements + N - 1) / N);
    const std::size_t chunks = (rows + per - 1) / per;
    if (partial.batch() < chunks) {
      partial = tensor<float, shape<dyn, 2 * N>>(chunks);
      total = tensor<double, shape<dyn, 2 * N>>(chunks);
    }
    const float *xp = x.data(), *dyp = dy.data(), *w = weight.data(), *st = stats.data();
    float* dxp = dx.data();
    const int threads = rows * N >= parallel_min_elements ? num_threads() : 1;
    eval::cpu::parallel_for(chunks, threads, [&](std::size_t c) {
      float* p = partial.data() + c * 2 * N;  // [dweight, dbias] of this chunk
      double* t = total.data() + c * 2 * N;
      std::fill_n(p, 2 * N, 0.0f);
      std::fill_n(t, 2 * N, 0.0);
      const std::size_t begin = c * per, end = std::min(rows, begin + per);
      for (std::size_t r = begin; r < end; ++r) {
        row::backward(xp + r * N, dyp + r * N, w, st[2 * r], st[2 * r + 1], dxp + r * N, p, p + N);
        if ((r - begin + 1) % flush_rows == 0 || r + 1 == end) {
          for (std::size_t j = 0; j < 2 * N; ++j) t[j] += double(p[j]);
          std::fill_n(p, 2 * N, 0.0f);
        }
      }
    });
    for (std::size_t j = 0; j < N; ++j) {
      double dw = 0, db = 0;
      for (std::size_t c = 0; c < chunks; ++c) {
        dw += total.data()[c * 2 * N + j];
        db += total.data()[c * 2 * N + N + j];
      }
      weight_grad[j] = float(dw);
      bias_grad[j] = float(db);
    }
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX>& x, const tensor<float, SY>& y, const tensor<float, SY>& dy, tensor<float, SX>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

 private:
  /// Below this many elements a pass runs on the calling thread.
  static constexpr std::size_t parallel_min_elements = std::size_t(1) << 16;
  /// Backward cuts the rows into at most max_chunks chunks of at least min_chunk_elements.
  static constexpr std::size_t max_chunks = 32;
  static constexpr std::size_t min_chunk_elements = std::size_t(1) << 14;
  /// Rows summed in float before a flush to double: 64 terms, about 64 u of relative error.
  static constexpr std::size_t flush_rows = 64;

  tensor<float, shape<dyn, 2>> stats{1};          // [mean, rstd] per row of the last forward
  std::size_t saved_rows = 0;                     // its rows; 0: no forward yet
  tensor<float, shape<dyn, 2 * N>> partial{1};    // backward: float sums per chunk
  tensor<double, shape<dyn, 2 * N>> total{1};     // backward: double sums per chunk

  template <class SX, class SY>
  static constexpr bool check_shapes() {
    if constexpr (SX::rank == 2 && SX::last == N && std::is_same_v<SX, SY>) {
      return true;
    } else {
      constexpr fixed_string m = [] {
        fixed_string s("solder::nn::layer_norm: a layer of ");
        s.append(N).append(" features needs x and y of one shape [batch, ").append(N).append("]; got x ");
        solder::detail::append_shape<SX>(s);
        s.append(" and y ");
        solder::detail::append_shape<SY>(s);
        return s;
      }();
      return diagnostic<m>::reported;
    }
  }
};

}  // namespace solder::nn
