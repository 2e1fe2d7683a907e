// nn/pool.hpp: 2-d pooling layers over NCHW [batch, C, H, W] activations with torch's
// semantics: max_pool2d, avg_pool2d, adaptive_avg_pool2d (and global_avg_pool2d). The math, per
// output element forward and per input element backward, is ops/pool.hpp's plane bodies; the
// layers run them by the planes verb of the executor of their memory space (host by default).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "solder/assign.hpp"
#include "solder/backend.hpp"
#include "solder/config.hpp"
#include "solder/diagnostic.hpp"
#include "solder/nn/batch_check.hpp"
#include "solder/nn/block.hpp"
#include "solder/nn/layer_kind.hpp"
#include "solder/nn/sample_shape.hpp"
#include "solder/ops/pool.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

namespace pool2d {

// The windows and the per-element bodies are ops/pool.hpp's, named here as the layers use them.
using ops::pool2d::adaptive_avg_backward_at;
using ops::pool2d::adaptive_avg_forward_at;
using ops::pool2d::adaptive_window;
using ops::pool2d::avg_backward_at;
using ops::pool2d::avg_divisor;
using ops::pool2d::avg_forward_at;
using ops::pool2d::geometry;
using ops::pool2d::index;
using ops::pool2d::interval;
using ops::pool2d::max_backward_at;
using ops::pool2d::max_forward_at;
using ops::pool2d::out_extent;
using ops::pool2d::window;
using ops::pool2d::windows_over;

/// "[C, H, W] with H + 2*1 >= 3 and W + 2*1 >= 3" (or "H, W >= 3" without padding).
constexpr void append_window_takes(fixed_string& m, std::size_t k, std::size_t p) {
  m.append("[C, H, W]");
  if (k <= 1) return;
  if (p == 0) {
    m.append(" with H, W >= ").append(k);
  } else {
    m.append(" with H + 2*").append(p).append(" >= ").append(k);
    m.append(" and W + 2*").append(p).append(" >= ").append(k);
  }
}

/// The shape check every pooling layer runs on its tensor types: x [batch, C, H, W] that the
/// layer takes (Traits::takes), y [batch, C, Ho, Wo] as it gives. One error per mistake.
/// What the planner knows of a K x K window pooling with stride Stride and padding Pad (max
/// and avg pooling): it takes [C, H, W] with at least one window each way and gives [C, Ho, Wo].
template <std::size_t K, std::size_t Stride, std::size_t Pad>
struct window_traits {
    static constexpr layer_kind kind = layer_kind::block;
    static constexpr std::size_t in = 0, out = 0;
    static constexpr std::size_t parameters = 0;
    static constexpr bool takes(sample_shape s) {
      return s.rank == 3 && s[0] >= 1 && pool2d::out_extent(s[1], K, Stride, Pad) >= 1 &&
             pool2d::out_extent(s[2], K, Stride, Pad) >= 1;
    }
    static constexpr sample_shape gives(sample_shape s) {
      if (!takes(s)) return {};
      return sample_shape(s[0], pool2d::out_extent(s[1], K, Stride, Pad), pool2d::out_extent(s[2], K, Stride, Pad));
    }
    static constexpr void append_takes(fixed_string& m) { pool2d::append_window_takes(m, K, Pad); }
};

template <fixed_string Who, class Traits, class SX, class SY>
constexpr bool check_shapes() {
  constexpr bool x_ok = [] {
    if constexpr (SX::rank == 4)
      return Traits::takes(sample_of<SX>());
    else
      return false;
  }();
  if constexpr (!x_ok) {
    constexpr fixed_string m = [] {
      fixed_string s = Who;
      s.append(": the samples of x must be ");
      Traits::append_takes(s);
      s.append("; got x ");
      solder::detail::append_shape<SX>(s);
      return s;
    }();
    return diagnostic<m>::reported;
  } else {
    constexpr bool y_ok = [] {
      if constexpr (SY::rank == 4)
        return SY::extents[0] == SX::extents[0] && sample_of<SY>() == Traits::gives(sample_of<SX>());
      else
        return false;
    }();
    if constexpr (y_ok) {
      return true;
    } else {
      constexpr fixed_string m = [] {
        const sample_shape want = Traits::gives(sample_of<SX>());
        fixed_string s = Who;
        s.append(": x ");
        solder::detail::append_shape<SX>(s);
        s.append(" gives y [");
        if (SX::extents[0] == dyn)
          s.append("?");
        else
          s.append(SX::extents[0]);
        for (std::size_t d = 0; d < want.rank; ++d) s.append(", ").append(want.dims[d]);
        s.append("]; got y ");
        solder::detail::append_shape<SY>(s);
        return s;
      }();
      return diagnostic<m>::reported;
    }
  }
}

}  // namespace pool2d

/// y [batch, C, Ho, Wo] = the max of x [batch, C, H, W] over K x K windows at stride S, with P
/// rows and columns of -inf padding: torch's nn.MaxPool2d(K, S, P) (dilation 1, ceil_mode=False),
/// Ho = floor((H + 2P - K) / S) + 1. A NaN in a window makes its y NaN. Forward saves each
/// output's argmax; backward routes dy there (ties: the first maximal element, row-major).
template <std::size_t K, std::size_t Stride = K, std::size_t Pad = 0, class Space = host>
class max_pool2d : public block_defaults<Space> {
  static_assert(K >= 1 && Stride >= 1, "solder::nn::max_pool2d: the kernel size and the stride must be at least 1");
  static_assert(Pad <= K / 2, "solder::nn::max_pool2d: the padding must be at most half the kernel size (Pad <= K / 2), "
                              "as torch requires; use a larger kernel or less padding");

 public:
  using space = Space;
  /// The same layer over memory space S.
  template <class S>
  using in_space = max_pool2d<K, Stride, Pad, S>;
  static constexpr const char* name = "max_pool2d";

  struct planner_traits : pool2d::window_traits<K, Stride, Pad> {
    // K*K compares per output forward; one add per output routed backward.
    static constexpr double forward_flops(std::size_t out_features) { return double(K * K) * double(out_features); }
    static constexpr double backward_flops(std::size_t out_features) { return double(out_features); }
    // The argmax of each output (an int32, one float's size).
    static constexpr std::size_t saved_floats(std::size_t out_features) { return out_features; }
  };

  /// No parameters.
  std::vector<optim::basic_param<Space>> params(const std::string& /*prefix*/ = "") { return {}; }

  /// y = max_pool2d(x) for x [batch, C, H, W], y [batch, C, Ho, Wo] (not overlapping x); saves
  /// the argmax of every output for backward.
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y) {
    static_assert(pool2d::check_shapes<who, planner_traits, SX, SY>());
    if (x.batch() != y.batch())
      detail::batches_differ("solder::nn::max_pool2d::forward", {{"x", x.batch()}, {"y", y.batch()}});
    constexpr pool2d::geometry g = geometry_of<SX, SY>();
    const std::size_t planes = x.size() / (SX::extents[2] * SX::extents[3]);
    if (argmax.size() < y.size()) argmax = tensor<std::int32_t, shape<dyn>, Space>(y.size());
    saved_x = x.size();
    saved_y = y.size();
    exec::planes(planes, g.ho, g.wo, g.h * g.w, forward_body{x.data(), y.data(), argmax.data(), g, false});
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX, Space>& x, tensor<float, SY, Space>& y) {
    forward(x.ref(), y.ref());
  }

  /// dx = dL/dx (overwritten) for the last forward, whose input and output x and y were: each
  /// dy goes to its window's saved argmax. x and y are not read.
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX, Space> x, tensor_ref<const float, SY, Space> y,
                tensor_ref<const float, SY, Space> dy, tensor_ref<float, SX, Space> dx) {
    static_assert(pool2d::check_shapes<who, planner_traits, SX, SY>());
    const std::size_t batch = x.batch();
    if (y.batch() != batch || dy.batch() != batch || dx.batch() != batch)
      detail::batches_differ("solder::nn::max_pool2d::backward",
                             {{"x", batch}, {"y", y.batch()}, {"dy", dy.batch()}, {"dx", dx.batch()}});
    if (saved_y == 0)
      solder::detail::fail("solder::nn::max_pool2d::backward: no forward has run; backward needs the argmax the "
                           "forward on this batch saved");
    if (x.size() != saved_x || y.size() != saved_y)
      solder::detail::fail("solder::nn::max_pool2d::backward: the last forward saw x of " + std::to_string(saved_x) +
                           " and y of " + std::to_string(saved_y) + " elements but backward got " +
                           std::to_string(x.size()) + " and " + std::to_string(y.size()) +
                           "; run forward on this batch first");
    constexpr pool2d::geometry g = geometry_of<SX, SY>();
    const std::size_t planes = x.size() / (SX::extents[2] * SX::extents[3]);
    // A gather per input element: no two threads write one dx, and each sum has a fixed order.
    exec::planes(planes, g.h, g.w, g.h * g.w, backward_body{dy.data(), argmax.data(), dx.data(), g, false});
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX, Space>& x, const tensor<float, SY, Space>& y, const tensor<float, SY, Space>& dy,
                tensor<float, SX, Space>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

 private:
  static constexpr fixed_string who = [] {
    fixed_string s("solder::nn::max_pool2d<");
    s.append(K).append(", ").append(Stride).append(", ").append(Pad).append(">");
    return s;
  }();

  template <class SX, class SY>
  static constexpr pool2d::geometry geometry_of() {
    static_assert(SX::extents[2] * SX::extents[3] <= std::size_t(std::numeric_limits<std::int32_t>::max()),
                  "solder::nn::max_pool2d: an input plane H * W must fit the int32 argmax; split the image");
    return {pool2d::index(SX::extents[1]), pool2d::index(SX::extents[2]), pool2d::index(SX::extents[3]),
            pool2d::index(SY::extents[2]), pool2d::index(SY::extents[3]), pool2d::index(K), pool2d::index(Stride),
            pool2d::index(Pad)};
  }

  using exec = executor<backend_of_t<Space>>;
  using forward_body = ops::pool2d::forward_planes<ops::pool2d::pool_kind::max>;
  using backward_body = ops::pool2d::backward_planes<ops::pool2d::pool_kind::max>;

  // Saved rather than recomputed from x: backward then reads Ho*Wo indices per plane instead of
  // H*W inputs and K*K compares per output, and routes exactly where forward chose, as torch.
  tensor<std::int32_t, shape<dyn>, Space> argmax{1};  // per output of the last forward: ih * W + iw in its plane
  std::size_t saved_x = 0, saved_y = 0;  // its x and y elements; 0: no forward yet
};

/// y [batch, C, Ho, Wo] = the mean of x [batch, C, H, W] over K x K windows at stride S with P
/// rows and columns of zero padding: torch's nn.AvgPool2d(K, S, P, ceil_mode=False,
/// count_include_pad). The divisor is the window clipped to the padded input [-P, H + P) when
/// CountIncludePad, to the input itself otherwise. Backward spreads dy / divisor over the window.
template <std::size_t K, std::size_t Stride = K, std::size_t Pad = 0, bool CountIncludePad = true, class Space = host>
class avg_pool2d : public block_defaults<Space> {
  static_assert(K >= 1 && Stride >= 1, "solder::nn::avg_pool2d: the kernel size and the stride must be at least 1");
  static_assert(Pad <= K / 2, "solder::nn::avg_pool2d: the padding must be at most half the kernel size (Pad <= K / 2), "
                              "as torch requires; use a larger kernel or less padding");

 public:
  using space = Space;
  /// The same layer over memory space S.
  template <class S>
  using in_space = avg_pool2d<K, Stride, Pad, CountIncludePad, S>;
  static constexpr const char* name = "avg_pool2d";

  struct planner_traits : pool2d::window_traits<K, Stride, Pad> {
    // K*K - 1 adds and a divide per output; backward a divide and K*K adds per output.
    static constexpr double forward_flops(std::size_t out_features) { return double(K * K) * double(out_features); }
    static constexpr double backward_flops(std::size_t out_features) { return double(K * K + 1) * double(out_features); }
    static constexpr std::size_t saved_floats(std::size_t) { return 0; }
  };

  /// No parameters.
  std::vector<optim::basic_param<Space>> params(const std::string& /*prefix*/ = "") { return {}; }

  /// y = avg_pool2d(x) for x [batch, C, H, W], y [batch, C, Ho, Wo] (not overlapping x).
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y) {
    static_assert(pool2d::check_shapes<who, planner_traits, SX, SY>());
    if (x.batch() != y.batch())
      detail::batches_differ("solder::nn::avg_pool2d::forward", {{"x", x.batch()}, {"y", y.batch()}});
    constexpr pool2d::geometry g = geometry_of<SX, SY>();
    const std::size_t planes = x.size() / (SX::extents[2] * SX::extents[3]);
    exec::planes(planes, g.ho, g.wo, g.h * g.w, forward_body{x.data(), y.data(), nullptr, g, CountIncludePad});
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX, Space>& x, tensor<float, SY, Space>& y) {
    forward(x.ref(), y.ref());
  }

  /// dx = dL/dx (overwritten), dx not overlapping dy; x and y are not read.
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX, Space> x, tensor_ref<const float, SY, Space> y,
                tensor_ref<const float, SY, Space> dy, tensor_ref<float, SX, Space> dx) {
    static_assert(pool2d::check_shapes<who, planner_traits, SX, SY>());
    const std::size_t batch = x.batch();
    if (y.batch() != batch || dy.batch() != batch || dx.batch() != batch)
      detail::batches_differ("solder::nn::avg_pool2d::backward",
                             {{"x", batch}, {"y", y.batch()}, {"dy", dy.batch()}, {"dx", dx.batch()}});
    constexpr pool2d::geometry g = geometry_of<SX, SY>();
    const std::size_t planes = x.size() / (SX::extents[2] * SX::extents[3]);
    // A gather per input element: no two threads write one dx, and each sum has a fixed order.
    exec::planes(planes, g.h, g.w, g.h * g.w, backward_body{dy.data(), nullptr, dx.data(), g, CountIncludePad});
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX, Space>& x, const tensor<float, SY, Space>& y, const tensor<float, SY, Space>& dy,
                tensor<float, SX, Space>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

 private:
  using exec = executor<backend_of_t<Space>>;
  using forward_body = ops::pool2d::forward_planes<ops::pool2d::pool_kind::avg>;
  using backward_body = ops::pool2d::backward_planes<ops::pool2d::pool_kind::avg>;

  static constexpr fixed_string who = [] {
    fixed_string s("solder::nn::avg_pool2d<");
    s.append(K).append(", ").append(Stride).append(", ").append(Pad);
    s.append(CountIncludePad ? ", true>" : ", false>");
    return s;
  }();

  template <class SX, class SY>
  static constexpr pool2d::geometry geometry_of() {
    return {pool2d::index(SX::extents[1]), pool2d::index(SX::extents[2]), pool2d::index(SX::extents[3]),
            pool2d::index(SY::extents[2]), pool2d::index(SY::extents[3]), pool2d::index(K), pool2d::index(Stride),
            pool2d::index(Pad)};
  }
};

/// y [batch, C, Oh, Ow] = the mean of x [batch, C, H, W] over adaptive windows: torch's
/// nn.AdaptiveAvgPool2d((Oh, Ow)), rows [floor(i H / Oh), ceil((i + 1) H / Oh)) and likewise
/// columns (windows overlap when Oh does not divide H). Any H, W >= 1.
template <std::size_t Oh, std::size_t Ow = Oh, class Space = host>
class adaptive_avg_pool2d : public block_defaults<Space> {
  static_assert(Oh >= 1 && Ow >= 1, "solder::nn::adaptive_avg_pool2d: the output size Oh, Ow must be at least 1");

 public:
  using space = Space;
  /// The same layer over memory space S.
  template <class S>
  using in_space = adaptive_avg_pool2d<Oh, Ow, S>;
  static constexpr const char* name = "adaptive_avg_pool2d";

  struct planner_traits {
    static constexpr layer_kind kind = layer_kind::block;
    static constexpr std::size_t in = 0, out = 0;
    static constexpr std::size_t parameters = 0;
    // Per output, its two divides. The window adds (about H*W/(Oh*Ow) per output) depend on the
    // input size, which out_features alone does not give: a lower bound.
    static constexpr double forward_flops(std::size_t out_features) { return 2.0 * double(out_features); }
    static constexpr double backward_flops(std::size_t out_features) { return 2.0 * double(out_features); }
    static constexpr std::size_t saved_floats(std::size_t) { return 0; }
    static constexpr bool takes(sample_shape s) { return s.rank == 3 && s[0] >= 1 && s[1] >= 1 && s[2] >= 1; }
    static constexpr sample_shape gives(sample_shape s) {
      if (!takes(s)) return {};
      return sample_shape(s[0], Oh, Ow);
    }
    static constexpr void append_takes(fixed_string& m) { m.append("[C, H, W]"); }
  };

  /// No parameters.
  std::vector<optim::basic_param<Space>> params(const std::string& /*prefix*/ = "") { return {}; }

  /// y = adaptive_avg_pool2d(x) for x [batch, C, H, W], y [batch, C, Oh, Ow] (not overlapping x).
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y) {
    static_assert(pool2d::check_shapes<who, planner_traits, SX, SY>());
    if (x.batch() != y.batch())
      detail::batches_differ("solder::nn::adaptive_avg_pool2d::forward", {{"x", x.batch()}, {"y", y.batch()}});
    constexpr pool2d::geometry g = geometry_of<SX>();
    const std::size_t planes = x.size() / (SX::extents[2] * SX::extents[3]);
    exec::planes(planes, g.ho, g.wo, g.h * g.w, forward_body{x.data(), y.data(), nullptr, g, false});
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX, Space>& x, tensor<float, SY, Space>& y) {
    forward(x.ref(), y.ref());
  }

  /// dx = dL/dx (overwritten), dx not overlapping dy; x and y are not read.
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX, Space> x, tensor_ref<const float, SY, Space> y,
                tensor_ref<const float, SY, Space> dy, tensor_ref<float, SX, Space> dx) {
    static_assert(pool2d::check_shapes<who, planner_traits, SX, SY>());
    const std::size_t batch = x.batch();
    if (y.batch() != batch || dy.batch() != batch || dx.batch() != batch)
      detail::batches_differ("solder::nn::adaptive_avg_pool2d::backward",
                             {{"x", batch}, {"y", y.batch()}, {"dy", dy.batch()}, {"dx", dx.batch()}});
    constexpr pool2d::geometry g = geometry_of<SX>();
    const std::size_t planes = x.size() / (SX::extents[2] * SX::extents[3]);
    // A gather per input element: no two threads write one dx, and each sum has a fixed order.
    exec::planes(planes, g.h, g.w, g.h * g.w, backward_body{dy.data(), nullptr, dx.data(), g, false});
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX, Space>& x, const tensor<float, SY, Space>& y, const tensor<float, SY, Space>& dy,
                tensor<float, SX, Space>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

 private:
  using exec = executor<backend_of_t<Space>>;
  using forward_body = ops::pool2d::forward_planes<ops::pool2d::pool_kind::adaptive_avg>;
  using backward_body = ops::pool2d::backward_planes<ops::pool2d::pool_kind::adaptive_avg>;

  static constexpr fixed_string who = [] {
    fixed_string s("solder::nn::adaptive_avg_pool2d<");
    s.append(Oh).append(", ").append(Ow).append(">");
    return s;
  }();

  template <class SX>
  static constexpr pool2d::geometry geometry_of() {
    return {pool2d::index(SX::extents[1]), pool2d::index(SX::extents[2]), pool2d::index(SX::extents[3]),
            pool2d::index(Oh), pool2d::index(Ow)};
  }
};

/// The mean over each whole plane, y [batch, C, 1, 1]: adaptive_avg_pool2d<1, 1>.
using global_avg_pool2d = adaptive_avg_pool2d<1, 1>;

}  // namespace solder::nn
