// nn/flatten.hpp: torch's nn.Flatten: a sample of extents [C, H, W] read as C*H*W features.
// The memory is the same, so it is a view or a copy.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "solder/config.hpp"
#include "solder/diagnostic.hpp"
#include "solder/nn/batch_check.hpp"
#include "solder/nn/block.hpp"
#include "solder/nn/layer_kind.hpp"
#include "solder/nn/sample_shape.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

/// y [batch, E0*E1*...] = x [batch, E0, E1, ...] (or x already [batch, E0*E1*...]) in the same
/// row-major order: torch's nn.Flatten(). Forward copies x to y and backward dy to dx, unless
/// they are the same memory; view() gives the flat view with no copy at all. flatten<> (no
/// extents) takes a sample of any shape, as a chain hands it over. basic_flatten<Space, ...> is
/// the same layer over memory of Space; flatten<...> is the host one.
template <class Space, std::size_t... Extents>
struct basic_flatten : block_defaults<Space> {
  static_assert(((Extents >= 1) && ...), "solder::nn::flatten: each extent of a sample must be at least 1 (e.g. flatten<3, 8, 8>)");
  static_assert(sizeof...(Extents) <= sample_shape::max_rank, "solder::nn::flatten: at most 4 extents");

  static constexpr bool any_shape = sizeof...(Extents) == 0;
  /// Features per sample: the product of the extents.
  static constexpr std::size_t features = (Extents * ... * std::size_t(1));
  static constexpr const char* name = "flatten";

  struct planner_traits {
    static constexpr layer_kind kind = layer_kind::block;
    static constexpr std::size_t in = 0, out = 0;
    static constexpr std::size_t parameters = 0;
    static constexpr double forward_flops(std::size_t) { return 0; }
    static constexpr double backward_flops(std::size_t) { return 0; }
    static constexpr std::size_t saved_floats(std::size_t) { return 0; }
    static constexpr bool takes(sample_shape s) {
      if constexpr (any_shape)
        return s.fixed();
      else
        return s == sample_shape(Extents...) || s == sample_shape(features);
    }
    static constexpr sample_shape gives(sample_shape s) { return sample_shape(s.size()); }
    static constexpr void append_takes(fixed_string& m) {
      if constexpr (any_shape) {
        m.append("any shape");
      } else {
        append_sample_shape(m, sample_shape(Extents...));
        m.append(" or [").append(features).append("]");
      }
    }
  };

  using space = Space;

  /// No parameters.
  std::vector<optim::basic_param<Space>> params(const std::string& /*prefix*/ = "") { return {}; }

  /// The [batch, features] view of x [batch, Extents...]: the same memory, nothing copied.
  template <class T, std::size_t B>
    requires(!any_shape)
  static tensor_ref<T, shape<B, features>> view(tensor_ref<T, shape<B, Extents...>> x) {
    return tensor_ref<T, shape<B, features>>(x.data(), x.batch());
  }
  template <class T, std::size_t B>
    requires(!any_shape)
  static tensor_ref<T, shape<B, features>> view(tensor<T, shape<B, Extents...>>& x) {
    return view(x.ref());
  }

  /// y = x for x [batch, Extents...] or [batch, features] and y [batch, features] (flatten<>: x
  /// of any shape, y [batch, its elements per sample]).
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y) {
    static_assert(check_shapes<SX, SY>());
    if (x.batch() != y.batch())
      detail::batches_differ("solder::nn::flatten::forward", {{"x", x.batch()}, {"y", y.batch()}});
    copy(y.data(), x.data(), y.size());
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX, Space>& x, tensor<float, SY, Space>& y) {
    forward(x.ref(), y.ref());
  }

  /// dx = dy, reshaped back to x's shape (x and y are not read).
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX, Space> x, tensor_ref<const float, SY, Space> y,
                tensor_ref<const float, SY, Space> dy, tensor_ref<float, SX, Space> dx) {
    static_assert(check_shapes<SX, SY>());
    const std::size_t batch = x.batch();
    if (y.batch() != batch || dy.batch() != batch || dx.batch() != batch)
      detail::batches_differ("solder::nn::flatten::backward",
                             {{"x", batch}, {"y", y.batch()}, {"dy", dy.batch()}, {"dx", dx.batch()}});
    copy(dx.data(), dy.data(), dx.size());
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX, Space>& x, const tensor<float, SY, Space>& y, const tensor<float, SY, Space>& dy,
                tensor<float, SX, Space>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

 private:
  static void copy(float* to, const float* from, std::size_t n) {
    executor<backend_of_t<Space>>::copy(to, from, n);  // nothing where a chain hands over the same buffer
  }

  template <class SX, class SY>
  static constexpr bool check_shapes() {
    constexpr bool ok = [] {
      if constexpr (SX::rank < 2) {
        return false;
      } else if constexpr (any_shape) {
        return std::is_same_v<SY, shape<SX::extents[0], SX::inner_size>>;
      } else {
        using flat = shape<SX::extents[0], features>;
        return (std::is_same_v<SX, shape<SX::extents[0], Extents...>> || std::is_same_v<SX, flat>) &&
               std::is_same_v<SY, flat>;
      }
    }();
    if constexpr (ok) {
      return true;
    } else {
      constexpr fixed_string m = [] {
        fixed_string s("solder::nn::flatten<");
        std::size_t k = 0;
        ((s.append(k++ ? ", " : "").append(Extents)), ...);
        if constexpr (any_shape) {
          s.append(">: y must be [batch, the elements of one sample of x]");
        } else {
          s.append(">: x must be [batch");
          ((s.append(", ").append(Extents)), ...);
          s.append("] or [batch, ").append(features).append("] and y [batch, ").append(features).append("]");
        }
        s.append("; got x ");
        solder::detail::append_shape<SX>(s);
        s.append(" and y ");
        solder::detail::append_shape<SY>(s);
        return s;
      }();
      return diagnostic<m>::reported;
    }
  }
};

/// torch's nn.Flatten over host memory; in_space<S> is the same layer over memory of S.
template <std::size_t... Extents>
struct flatten : basic_flatten<host, Extents...> {
  template <class S>
  using in_space = basic_flatten<S, Extents...>;
};

}  // namespace solder::nn
