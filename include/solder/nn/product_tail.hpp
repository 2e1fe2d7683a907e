// nn/product_tail.hpp: what a block of a product layer and the elementwise layers after it
// (activation, dropout) does around its products, whatever the product layer is (linear,
// sketched): the tail's layers and the mode, the forward's store of y = tail(z) from the last
// product's epilogue (and of z, when the tail's derivative does not follow from y), and the
// backward's gate pass, g = dL/dz with the bias gradient reduced in the same pass (without a
// tail g is dy, and the pass reduces the bias gradient only). The products themselves are the
// block's; each product block derives from this.
#pragma once

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>

#include "solder/assign.hpp"
#include "solder/autodiff/vjp.hpp"
#include "solder/nn/elementwise_block.hpp"

namespace solder::nn {

/// The elementwise layers after a product of Out features, the block's mode, and the buffers
/// kept between forward and backward (in the block's memory space): the gate g = dL/dz and,
/// when the tail's derivative needs it, the pre-activation z of the last training forward.
/// Grown to the largest batch, reused.
template <class Space, std::size_t Out, class... Tail>
class product_tail {
  static_assert((std::tuple_size_v<decltype(std::declval<Tail&>().params())> + ... + 0) == 0,
                "solder::nn: the layers after a product layer in its block must have no parameters (activations, dropout)");

 public:
  using tail_type = elementwise_block<Tail...>;
  /// Whether the block keeps z = the product (+ b) for backward (else it needs only x and y).
  static constexpr bool keeps_preactivation = !tail_type::output_backward;

  tail_type tail;

  void train() {
    current = mode::train;
    tail.train();
  }
  void eval() {
    current = mode::eval;
    tail.eval();
  }
  mode current_mode() const { return current; }

 protected:
  mode current = mode::train;

  /// Rows of Out floats in Space where a block needs them (grown by workspace), else nothing.
  template <bool Used>
  using rows_if = std::conditional_t<Used, tensor<float, shape<dyn, Out>, Space>, std::tuple<>>;
  template <bool Used>
  static rows_if<Used> one_row_if() {
    if constexpr (Used) return rows_if<Used>(1);
    else return {};
  }

  /// f(std::integral_constant<mode, M>) in the current mode M; a training call first moves the
  /// dropout streams on, so every training forward draws fresh masks.
  template <class F>
  void in_current_mode(F&& f) {
    if (current == mode::train) {
      tail.advance();
      f(std::integral_constant<mode, mode::train>{});
    } else {
      f(std::integral_constant<mode, mode::eval>{});
    }
  }

  /// A view of shape SY (batch `batch`) of a workspace of rows of W floats, grown (never shrunk).
  template <class SY, std::size_t W>
  static tensor_ref<float, SY, Space> workspace(tensor<float, shape<dyn, W>, Space>& t, std::size_t batch) {
    const std::size_t rows = SY::elements(batch) / W;
    if (t.batch() < rows) t = tensor<float, shape<dyn, W>, Space>(rows);
    return tensor_ref<float, SY, Space>(t.data(), batch);
  }

  /// y = tail(z) for the product expression z (with its bias), in mode M: one product, the
  /// tail in its epilogue; in training z is stored beside y when keeps_preactivation (from the
  /// same epilogue where the backend's product can write twice, else y in a pass over z).
  template <mode M, class SY, class Z>
  void store(tensor_ref<float, SY, Space> y, const Z& z) {
    if constexpr (keeps_preactivation && M == mode::train) {
      auto saved = workspace<SY>(pre, y.batch());
      if constexpr (executor<backend_of_t<Space>>::product_writes_several) {
        assign_all(write(y, tail.template expression<M>(z)), write(saved, z));
      } else {
        assign(saved, z);
        assign(y, tail.template expression<M>(tensor_ref<const float, SY, Space>(saved)));
      }
      pre_batch = y.batch();
    } else {
      assign(y, tail.template expression<M>(z));
    }
  }

  /// g = dL/dz into the gate buffer and, when db is a tensor, db = the column sums of g, in one
  /// pass, in the current mode; returns g. y and dy are the last forward's output and its gradient.
  /// Without a tail g is dy itself: no copy, db alone is a pass.
  template <class SY, class DB>
  tensor_ref<const float, SY, Space> gate(tensor_ref<const float, SY, Space> y, tensor_ref<const float, SY, Space> dy,
                                          DB& db, const char* who) {
    if constexpr (sizeof...(Tail) == 0) {
      if constexpr (!std::is_same_v<DB, std::tuple<>>) assign(db, sum_to<shape<Out>>(dy));
      return dy;
    } else {
      if (current == mode::train) return gate_as<mode::train>(y, dy, db, who);
      return gate_as<mode::eval>(y, dy, db, who);
    }
  }

 private:
  static constexpr bool has_gate_buffer = sizeof...(Tail) > 0;
  [[no_unique_address]] rows_if<has_gate_buffer> gate_buffer = one_row_if<has_gate_buffer>();  // g = dL/dz
  [[no_unique_address]] rows_if<keeps_preactivation> pre = one_row_if<keeps_preactivation>();   // z of the last training forward
  std::size_t pre_batch = 0;  // its batch; 0: none

  template <mode M, class SY, class DB>
  tensor_ref<const float, SY, Space> gate_as(tensor_ref<const float, SY, Space> y, tensor_ref<const float, SY, Space> dy,
                                             DB& db, const char* who) {
    const std::size_t batch = dy.batch();
    auto g = workspace<SY>(gate_buffer, batch);
    auto finish = [&](const auto& ge) {
      if constexpr (std::is_same_v<DB, std::tuple<>>)
        assign(g, ge);
      else
        assign_all(write(g, ge), write(db, sum_to<shape<Out>>(ge)));
    };
    if constexpr (tail_type::template output_backward_in<M>) {
      finish(tail.template gate_from_output<M>(y, dy));
    } else {
      if (M == mode::eval || pre_batch != batch)
        solder::detail::fail(std::string(who) + ": this layer's backward needs the pre-activation of a training-mode "
                             "forward on the same batch (" + std::to_string(batch) + " rows)");
      if constexpr (keeps_preactivation) {
        const tensor_ref<const float, SY, Space> z(pre.data(), batch);
        const auto grads = vjp([&](const auto& zv) { return tail.template expression<M>(zv); }, dy, z);
        finish(std::get<0>(grads));
      }
    }
    return tensor_ref<const float, SY, Space>(gate_buffer.data(), batch);
  }
};

}  // namespace solder::nn
