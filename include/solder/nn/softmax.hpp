// nn/softmax.hpp: softmax and log_softmax over the feature axis of [batch, N] activations, as
// blocks of their own: one visit per row, stable (the row max is subtracted before exp), and a
// backward pass that needs the output y alone.
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

// GCC 12.2 warns -W(maybe-)uninitialized inside its own AVX-512 intrinsics that xsimd's exp
// calls (GCC bug 105593, fixed in 12.3); the warning names no solder code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace solder::nn {

namespace detail {

/// The row kernels of softmax<N> and log_softmax<N>, on the vector walk of eval::cpu::row<N>.
template <std::size_t N>
struct softmax_row : eval::cpu::row<N> {
  using R = eval::cpu::row<N>;
  using typename R::V;
  using R::each;
  using R::full;
  using R::lanes;
  using R::load;
  using R::rest;
  using R::store;
  using R::sum;
  static constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  /// The row's max; NaN if the row holds one (simd::max propagates it), which makes every
  /// x_j - max, and so every output of the row, NaN.
  static SOLDER_INLINE float max(const float* x) {
    V acc(neg_inf);
    each([&]<class T>(std::size_t j, T) { acc = simd::max(acc, load(T{}, x + j, neg_inf)); });
    alignas(alignment) float buf[lanes];
    acc.store_aligned(buf);
    for (std::size_t w = lanes / 2; w > 0; w /= 2)  // a tree: log2(lanes) dependent steps
      for (std::size_t k = 0; k < w; ++k) buf[k] = simd::max(buf[k], buf[k + w]);
    return buf[0];
  }

  /// y = exp(x - m) / s, s = sum exp(x - m), m = max x (e parked in y until s is known); or, Log,
  /// y = (x - m) - log s. Padding with -inf adds exp(-inf) = 0 to s.
  template <bool Log>
  static SOLDER_INLINE void forward(const float* x, float* y) {
    const V m(max(x));
    if constexpr (Log) {
      const double s = sum([&]<class T>(std::size_t j, T) { return simd::exp(load(T{}, x + j, neg_inf) - m); });
      const V ls(float(std::log(s)));
      each([&]<class T>(std::size_t j, T) { store(T{}, y + j, (load(T{}, x + j) - m) - ls); });
    } else {
      const double s = sum([&]<class T>(std::size_t j, T) {
        const V e = simd::exp(load(T{}, x + j, neg_inf) - m);
        store(T{}, y + j, e);
        return e;
      });
      const V r(float(1.0 / s));
      each([&]<class T>(std::size_t j, T) { store(T{}, y + j, load(T{}, y + j) * r); });
    }
  }

  /// softmax: dx = y (dy - sum(dy y)); Log: dx = dy - exp(y) sum(dy). Padding dy with 0
  /// keeps the sums exact.
  template <bool Log>
  static SOLDER_INLINE void backward(const float* y, const float* dy, float* dx) {
    if constexpr (Log) {
      const V s(float(sum([&]<class T>(std::size_t j, T) { return load(T{}, dy + j); })));
      each([&]<class T>(std::size_t j, T) {
        store(T{}, dx + j, simd::fma(simd::neg(simd::exp(load(T{}, y + j))), s, load(T{}, dy + j)));
      });
    } else {
      const V dot(float(sum([&]<class T>(std::size_t j, T) { return load(T{}, dy + j) * load(T{}, y + j); })));
      each([&]<class T>(std::size_t j, T) { store(T{}, dx + j, load(T{}, y + j) * (load(T{}, dy + j) - dot)); });
    }
  }
};

/// What softmax<N> and log_softmax<N> share; Log picks the function.
template <std::size_t N, bool Log>
class softmax_layer {
  static_assert(N >= 1, "solder::nn::softmax, log_softmax: the feature count N must be at least 1");
  using row = softmax_row<N>;
  static constexpr const char* who = Log ? "solder::nn::log_softmax" : "solder::nn::softmax";

 public:
  static constexpr std::size_t in_features = N;
  static constexpr std::size_t out_features = N;
  static constexpr const char* name = Log ? "log_softmax" : "softmax";
  static constexpr std::size_t parameter_count = 0;
  /// Per sample, approximate: max, subtract, exp, sum, and a multiply (softmax) or two
  /// subtractions (log_softmax), N each.
  static constexpr double forward_flops = (Log ? 6.0 : 5.0) * N;
  /// Per sample, approximate: a sum (N or 2N with its products) and the elementwise dx (2N or 3N).
  static constexpr double backward_flops = 4.0 * N;
  /// Backward reads y alone.
  static constexpr std::size_t saved_floats = 0;

  /// No parameters.
  std::vector<optim::param> params(const std::string& /*prefix*/ = "") { return {}; }

  /// y = softmax(x) (or log_softmax) along each row of x, y [batch, N]; y may be x (in place).
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX> x, tensor_ref<float, SY> y) {
    static_assert(check_shapes<SX, SY>());
    if (x.batch() != y.batch())
      detail::batches_differ(std::string(who) + "::forward", {{"x", x.batch()}, {"y", y.batch()}});
    const float* xp = x.data();
    float* yp = y.data();
    for_rows(SX::elements(x.batch()) / N, [=](std::size_t r) { row::template forward<Log>(xp + r * N, yp + r * N); });
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX>& x, tensor<float, SY>& y) {
    forward(x.ref(), y.ref());
  }

  /// dx = dL/dx from the last forward's output y and dy = dL/dy (x is not read); dx may be dy.
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX> x, tensor_ref<const float, SY> y, tensor_ref<const float, SY> dy,
                tensor_ref<float, SX> dx) {
    static_assert(check_shapes<SX, SY>());
    const std::size_t batch = x.batch();
    if (y.batch() != batch || dy.batch() != batch || dx.batch() != batch)
      detail::batches_differ(std::string(who) + "::backward",
                             {{"x", batch}, {"y", y.batch()}, {"dy", dy.batch()}, {"dx", dx.batch()}});
    const float *yp = y.data(), *dyp = dy.data();
    float* dxp = dx.data();
    for_rows(SY::elements(batch) / N,
             [=](std::size_t r) { row::template backward<Log>(yp + r * N, dyp + r * N, dxp + r * N); });
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX>& x, const tensor<float, SY>& y, const tensor<float, SY>& dy, tensor<float, SX>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

 private:
  /// Below this many elements a pass runs on the calling thread.
  static constexpr std::size_t parallel_min_elements = std::size_t(1) << 16;

  /// f(r) for every row; rows are independent, so how they are split among threads cannot
  /// change a result.
  template <class F>
  static void for_rows(std::size_t rows, const F& f) {
    const int threads = rows * N >= parallel_min_elements ? num_threads() : 1;
    const std::size_t per = (rows + std::size_t(threads) - 1) / std::size_t(threads);
    eval::cpu::parallel_for(std::size_t(threads), threads, [&](std::size_t t) {
      for (std::size_t r = t * per; r < std::min(rows, (t + 1) * per); ++r) f(r);
    });
  }

  template <class SX, class SY>
  static constexpr bool check_shapes() {
    if constexpr (SX::rank == 2 && SX::last == N && std::is_same_v<SX, SY>) {
      return true;
    } else {
      constexpr fixed_string m = [] {
        fixed_string s;
        s.append(who).append(": a layer of ").append(N).append(" features needs x and y of one shape [batch, ").append(N);
        s.append("]; got x ");
        solder::detail::append_shape<SX>(s);
        s.append(" and y ");
        solder::detail::append_shape<SY>(s);
        return s;
      }();
      return diagnostic<m>::reported;
    }
  }
};

}  // namespace detail

/// y_j = exp(x_j - max x) / sum_k exp(x_k - max x) along each row of x [batch, N]: torch's
/// softmax(x, dim=-1). Backward: dx = y (dy - sum(dy y)), from y alone. A NaN in a row, or a row
/// of -inf, gives a row of NaN (as torch); +inf in a row gives NaN too. Results do not depend
/// on the thread count.
template <std::size_t N>
struct softmax : detail::softmax_layer<N, false> {};

/// y_j = x_j - max x - log sum_k exp(x_k - max x) along each row of x [batch, N]: torch's
/// log_softmax(x, dim=-1). Backward: dx = dy - exp(y) sum(dy), from y alone. NaN and infinity
/// as softmax.
template <std::size_t N>
struct log_softmax : detail::softmax_layer<N, true> {};

}  // namespace solder::nn

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
