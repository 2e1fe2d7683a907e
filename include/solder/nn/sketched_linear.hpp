// nn/sketched_linear.hpp: the sketched linear layer (Panther's SKLinear, the SK-FC layer of
// Kasiviswanathan et al., IJCAI 2018) and the block it runs as with the elementwise layers after
// it. With L = Terms, k = Rank and x [batch, In]:
//
//   y = 1/(2L) sum_i (x S1_i U1_i + x U2_i S2_i) + b
//     = (x [S1 | U2]) [U1; S2] / (2L) + b                        two products (training)
//     = x W_eff + b,  W_eff = [S1 | U2] [U1; S2] / (2L)           folded (inference)
//
// S1_i [In, k] and S2_i [k, Out] are learned; the sign sketches U1_i [k, Out] and U2_i [In, k]
// (entries +-1/sqrt(k)) are generated from Philox while the products pack them, never stored, so
// the layer holds L k (In + Out) + Out parameters and nothing else. Which form inference uses is
// chosen at compile time from the two forms' FLOPs and bytes (or forced by the user), and is
// shown by plan_report.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "solder/assign.hpp"
#include "solder/autodiff/product.hpp"
#include "solder/expr/contract.hpp"
#include "solder/expr/operators.hpp"
#include "solder/nn/batch_check.hpp"
#include "solder/nn/block.hpp"
#include "solder/nn/elementwise_block.hpp"
#include "solder/nn/layer_kind.hpp"
#include "solder/nn/linear.hpp"
#include "solder/nn/product_tail.hpp"
#include "solder/random/seed.hpp"

namespace solder::nn {

/// How a sketched layer runs in inference: as two products with concatenated factors, as one
/// product with the folded dense weight, or whichever costs fewer FLOPs (then fewer bytes).
/// Training always runs the two products (the sketches' factors are what it learns).
enum class sketch_strategy { automatic, two_products, folded };

template <class Layer, class... Tail>
class sketched_block;

namespace detail {

template <std::size_t In, std::size_t Out, std::size_t Terms, std::size_t Rank, bool AllowLarger>
constexpr bool check_sketch_sizes() {
  constexpr std::size_t sketched = 2 * Terms * Rank * (In + Out), dense = In * Out;
  if constexpr (Terms == 0 || Rank == 0) {
    return diagnostic<"solder::nn::sketched_linear: Terms and Rank must be at least 1",
                      std::integral_constant<std::size_t, Terms>, std::integral_constant<std::size_t, Rank>>::reported;
  } else if constexpr (sketched >= dense && !AllowLarger) {
    constexpr fixed_string m = [] {
      fixed_string s("solder::nn::sketched_linear: 2 L k (In + Out) = ");
      s.append(sketched).append(" >= In Out = ").append(dense);
      s.append(": larger and slower than a dense layer; lower Terms or Rank, or set AllowLarger");
      return s;
    }();
    return diagnostic<m>::reported;
  } else {
    return true;
  }
}

}  // namespace detail

/// y = 1/(2L) sum_i (x S1_i U1_i + x U2_i S2_i) + b; x [batch, In], y [batch, Out], L = Terms,
/// k = Rank. Learned: S1 = [S1_1 | ... | S1_L] [In, L k], S2 = [S2_1; ...; S2_L] [L k, Out] and
/// b [Out] (Panther's S1s[i] is S1's columns [i k, (i + 1) k), its S2s[i] S2's rows). A layer
/// whose factors hold as many values as a dense one (2 L k (In + Out) >= In Out) is a compile
/// error unless AllowLarger. The factors and b live in Space (host memory by default).
template <std::size_t In, std::size_t Out, std::size_t Terms, std::size_t Rank, bool Bias = true,
          sketch_strategy Strategy = sketch_strategy::automatic, bool AllowLarger = false, class Space = host>
struct sketched_linear {
  static_assert(detail::check_sketch_sizes<In, Out, Terms, Rank, AllowLarger>());
  using space = Space;
  /// The same layer with its parameters in memory space S.
  template <class S>
  using in_space = sketched_linear<In, Out, Terms, Rank, Bias, Strategy, AllowLarger, S>;
  static constexpr std::size_t in_features = In, out_features = Out, terms = Terms, rank = Rank;
  static constexpr std::size_t lk = Terms * Rank;  // columns of S1, rows of S2
  static constexpr bool has_bias = Bias;
  static constexpr const char* name = "sketched_linear";
  static constexpr const char* param_names[] = {"S1", "S2", "bias"};
  /// 1/(2L), applied in the epilogue of the second product.
  static constexpr float scale = float(0.5 / double(Terms));

  /// Floats the layer stores (its parameters), and what Panther's layer stores for the same
  /// configuration: the same factors plus U1 and U2 as large as them.
  static constexpr std::size_t stored_floats = lk * (In + Out) + (Bias ? Out : 0);
  static constexpr std::size_t panther_floats = 2 * lk * (In + Out) + (Bias ? Out : 0);

  /// Forward FLOPs per sample of each form (2 per multiply-add), and the bytes of weights each
  /// reads per call: the factors (the signs are generated), or the folded weight.
  static constexpr double two_products_flops = 4.0 * double(lk) * double(In + Out) + (Bias ? Out : 0);
  static constexpr double folded_flops = 2.0 * double(In) * double(Out) + (Bias ? Out : 0);
  static constexpr double two_products_bytes = 4.0 * double(lk) * double(In + Out);
  static constexpr double folded_bytes = 4.0 * double(In) * double(Out);
  /// The form inference runs: Strategy, or the cheaper one.
  static constexpr sketch_strategy inference_strategy =
      Strategy != sketch_strategy::automatic ? Strategy
      : (folded_flops < two_products_flops || (folded_flops == two_products_flops && folded_bytes < two_products_bytes))
          ? sketch_strategy::folded
          : sketch_strategy::two_products;

  template <class... Tail>
  using block = sketched_block<sketched_linear, Tail...>;
  /// What the planner and cost.hpp know of the layer (nn/layer_info.hpp): the training form.
  struct planner_traits {
    static constexpr layer_kind kind = layer_kind::product;
    static constexpr std::size_t in = In, out = Out;
    static constexpr std::size_t parameters = stored_floats;
    static constexpr double forward_flops(std::size_t) { return two_products_flops; }
    // dS2 [Lk, Out] and dh [2Lk] from the second product, dS1 [In, Lk] and dx [In] from the first.
    static constexpr double backward_flops(std::size_t) { return 6.0 * double(lk) * double(In + Out) + (Bias ? Out : 0); }
    static constexpr double input_grad_flops(std::size_t) { return 4.0 * double(lk) * double(In); }  // dx = dh [S1 | U2]^T
    static constexpr std::size_t saved_floats(std::size_t) { return 2 * lk; }  // h = x [S1 | U2]
  };

  using u1_type = sign_sketch<Rank, Out, Terms, sketch_stack::rows>;     // [U1_1; ...; U1_L]: [L k, Out]
  using u2_type = sign_sketch<In, Rank, Terms, sketch_stack::columns>;  // [U2_1 | ... | U2_L]: [In, L k]
  // Not constexpr: std::sqrt is constexpr in GCC alone.
  static inline const float sign_scale = float(1.0 / std::sqrt(double(Rank)));

  tensor<float, shape<In, lk>, Space> s1, s1_grad;   // [S1_1 | ... | S1_L]
  tensor<float, shape<lk, Out>, Space> s2, s2_grad;  // [S2_1; ...; S2_L]
  [[no_unique_address]] std::conditional_t<Bias, tensor<float, shape<Out>, Space>, std::tuple<>> bias{};
  [[no_unique_address]] std::conditional_t<Bias, tensor<float, shape<Out>, Space>, std::tuple<>> bias_grad{};
  std::uint64_t sketch_seed = 0;  // the sketches' Philox keys derive from it
  /// The sketches' Philox rounds (random::philox_default_rounds, or 10). S1 and S2 are drawn
  /// against the sketches: set it, then reset_parameters.
  std::uint32_t sketch_rounds = random::philox_default_rounds;

  explicit sketched_linear(std::uint64_t seed = 0) { reset_parameters(seed); }

  /// W [In, Out] drawn as PyTorch draws a linear layer's weight (uniform in +-1/sqrt(In), from
  /// Philox stream (seed, 0)), then S1_i = W U1_i^T and S2_i = U2_i^T W, so that each term's
  /// expectation is W; b from stream (seed, 1); the sketches from derive_seed(seed, 2). Drawn
  /// and multiplied on the host, then copied into Space: every space starts from the same bits.
  void reset_parameters(std::uint64_t seed) {
    if (!random::philox_rounds_supported(sketch_rounds))
      solder::detail::fail_message({"solder::nn::sketched_linear: sketch_rounds is ", std::size_t(sketch_rounds),
                                    "; a sketch's Philox stream runs 7 or 10 rounds"});
    sketch_seed = random::derive_seed(seed, 2);
    const float bound = float(1.0 / std::sqrt(double(In)));
    using exec = executor<backend_of_t<Space>>;
    auto w = std::make_unique<tensor<float, shape<In, Out>>>(uninitialized);
    detail::fill_uniform_philox(w->data(), w->size(), bound, seed, 0);
    const tensor<float, shape<In, lk>> h1 = matmul(*w, transpose(u1()));
    const tensor<float, shape<lk, Out>> h2 = matmul(transpose(u2()), *w);
    exec::copy_from_host(s1.data(), h1.data(), h1.size());
    exec::copy_from_host(s2.data(), h2.data(), h2.size());
    if constexpr (Bias) detail::fill_uniform_philox(bias, bound, seed, 1);
  }

  /// U1 and U2, generated operands (+-1/sqrt(k)).
  u1_type u1() const { return {random::derive_seed(sketch_seed, 0), sign_scale, sketch_rounds}; }
  u2_type u2() const { return {random::derive_seed(sketch_seed, 1), sign_scale, sketch_rounds}; }
  /// The factors of the two products: [S1 | U2] [In, 2 L k] and [U1; S2] [2 L k, Out].
  auto left_factor() const { return hcat(s1, u2()); }
  auto right_factor() const { return vcat(u1(), s2); }

  /// The first product, h = x [S1 | U2] [batch, 2 L k].
  template <class X>
  auto first_product(const X& x) const {
    static_assert(linear<In, Out>::template check_input<shape_of<X>>());
    return matmul(x, left_factor());
  }
  /// The second product, h [U1; S2] [batch, Out] (scale and bias are the caller's).
  template <class H>
  auto second_product(const H& h) const {
    return matmul(h, right_factor());
  }
  /// W_eff = [S1 | U2] [U1; S2] / (2L) [In, Out], the dense weight the layer equals.
  auto folded() const { return matmul(left_factor(), right_factor()) * scale; }
  /// Whether inference runs the folded weight: the form chosen, in host memory (in device
  /// memory the two products run, each staged from the factors and the generated signs).
  static constexpr bool folds = inference_strategy == sketch_strategy::folded && std::is_same_v<Space, host>;

  auto params() {
    if constexpr (Bias)
      return std::tie(s1, s2, bias);
    else
      return std::tie(s1, s2);
  }
  auto grads() {
    if constexpr (Bias)
      return std::tie(s1_grad, s2_grad, bias_grad);
    else
      return std::tie(s1_grad, s2_grad);
  }
};

/// A sketched layer and the parameter-free elementwise layers after it (activation, dropout):
/// forward as two products, the tail, the 1/(2L) scale and the bias in the second one's epilogue
/// (or, in inference with the folded form, one product); backward from the products' derived
/// rules: the gate pass (with db), then dh = g [U1; S2]^T / (2L) and dS2 = h[:, Lk:]^T g / (2L)
/// from the second product, dS1 = x^T dh[:, :Lk] and dx = dh [S1 | U2]^T from the first.
template <class Layer, class... Tail>
class sketched_block : public product_tail<typename Layer::space, Layer::out_features, Tail...> {
  using base = product_tail<typename Layer::space, Layer::out_features, Tail...>;

 public:
  /// Where the factors, the buffers and the tensors it takes live: the sketched layer's space.
  using space = typename Layer::space;
  static constexpr std::size_t in_features = Layer::in_features;
  static constexpr std::size_t out_features = Layer::out_features;
  static constexpr std::size_t lk = Layer::lk;
  using typename base::tail_type;
  using base::keeps_preactivation;
  using base::tail;

  Layer sketched;

  explicit sketched_block(std::uint64_t seed = 0) : sketched(seed) {}

  Layer& head() { return sketched; }
  const Layer& head() const { return sketched; }

  /// Freezes the parameters for inference: with the folded form, W_eff is computed (one product)
  /// and packed once; every eval-mode forward then runs the linear kernel on it, until
  /// weights_changed(). The two-products form has nothing to freeze.
  void pack_weights() {
    if constexpr (Layer::folds) {
      if (!folded) folded = std::make_unique<folded_weight>();
      folded->dense = sketched.folded();
      folded->packed.pack(folded->dense.data(), out_features);
      folded_current = true;
    }
  }
  void weights_changed() { folded_current = false; }

  // The block contract (nn/block.hpp).
  static constexpr bool channels_last_capable = false;
  static constexpr bool input_grad_optional = true;
  /// The sketched layer drawn from stream (seed, first).
  void reset(std::uint64_t seed, std::size_t first) {
    sketched.reset_parameters(random::derive_seed(seed, first));
    weights_changed();
  }
  /// S1, S2 and the bias, named from the layer's index `first` ("0.S1", "0.S2", "0.bias").
  std::vector<optim::basic_param<space>> params_from(std::size_t first) {
    return named_params(std::to_string(first) + ".", sketched);
  }
  std::vector<basic_buffer<space>> buffers_from(std::size_t /*first*/) { return {}; }
  /// f(k, d) for every dropout d of the tail, k its index in the block (the sketched layer is 0).
  template <class F>
  void for_each_dropout(F&& f) {
    tail.for_each_dropout([&](std::size_t k, auto& d) { f(1 + k, d); });
  }
  /// Layer At of the block as the user wrote it: the sketched layer, then the tail's layers.
  template <std::size_t At>
  auto& layer() {
    if constexpr (At == 0)
      return sketched;
    else
      return std::get<At - 1>(tail.layers);
  }
  template <std::size_t At>
  const auto& layer() const {
    if constexpr (At == 0)
      return sketched;
    else
      return std::get<At - 1>(tail.layers);
  }

  /// Whether eval-mode forwards run the folded weight now.
  bool runs_folded() const { return folded_current && this->current == mode::eval; }

  /// y = tail((x [S1 | U2]) [U1; S2] / (2L) + b), or tail(x W_eff + b) in eval mode once folded.
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX, space> x, tensor_ref<float, SY, space> y) {
    static_assert(check_shapes<SX, SY>());
    if (x.batch() != y.batch()) detail::batches_differ("solder::nn::sketched_block::forward", {{"x", x.batch()}, {"y", y.batch()}});
    this->in_current_mode([&](auto m) { forward_as<decltype(m)::value>(x, y); });
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX, space>& x, tensor<float, SY, space>& y) {
    forward(x.ref(), y.ref());
  }

  /// Gradients of the last forward: sketched.s1_grad, s2_grad, bias_grad (overwritten) and dx.
  /// x and y are that forward's input and output (h = x [S1 | U2] is recomputed when that
  /// forward ran the folded weight).
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX, space> x, tensor_ref<const float, SY, space> y,
                tensor_ref<const float, SY, space> dy, tensor_ref<float, SX, space> dx) {
    const auto dh = gradients(x, y, dy);
    assign(dx, autodiff::left_grad(sketched.first_product(x), dh));
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX, space>& x, const tensor<float, SY, space>& y, const tensor<float, SY, space>& dy,
                tensor<float, SX, space>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }
  /// backward without dx (the first layer of a network).
  template <class SX, class SY>
  void backward_params(tensor_ref<const float, SX, space> x, tensor_ref<const float, SY, space> y,
                       tensor_ref<const float, SY, space> dy) {
    gradients(x, y, dy);
  }

  /// plan_report's kind of kernel, and its note: the two forms' costs and the one inference runs.
  static constexpr const char* plan_kind() { return "2 GEMMs + epilogue"; }
  static std::string plan_note() {
    auto form = [](const char* name, double flops, double bytes) {
      char text[96];
      std::snprintf(text, sizeof text, "%s %.1f KFLOP/sample, %.0f KiB of weights", name, flops / 1e3, bytes / 1024);
      return std::string(text);
    };
    const bool folded_wins = Layer::inference_strategy == sketch_strategy::folded;
    return std::string("inference ") + (folded_wins ? "folded" : "two products") + " (" +
           form("two products", Layer::two_products_flops, Layer::two_products_bytes) + "; " +
           form("folded", Layer::folded_flops, Layer::folded_bytes) + "); training two products";
  }

 private:
  struct folded_weight {
    tensor<float, shape<in_features, out_features>> dense;
    packed_matrix<out_features, in_features, false> packed;
  };
  std::unique_ptr<folded_weight> folded;
  bool folded_current = false;
  tensor<float, shape<dyn, 2 * lk>, space> h_buffer{1}, dh_buffer{1};  // h = x [S1 | U2] of the last forward, and dh
  std::size_t h_rows = 0;                                      // the rows h holds; 0: none

  template <class SX, class SY>
  static constexpr bool check_shapes() {
    static_assert(linear<in_features, out_features>::template check_input<SX>());
    static_assert(std::is_same_v<SY, shape<SX::extents[0], out_features>>,
                  "solder::nn::sketched_block: the output must be [batch, out_features] of the input's batch");
    return true;
  }

  template <class SX>
  using h_shape = shape<SX::extents[0], 2 * lk>;  // h and dh for an input of shape SX

  /// h = x [S1 | U2] into h_buffer (the first product), remembered for backward.
  template <class SX>
  tensor_ref<const float, h_shape<SX>, space> first(tensor_ref<const float, SX, space> x) {
    const auto h = this->template workspace<shape<SX::extents[0], 2 * lk>>(h_buffer, x.batch());
    assign(h, sketched.first_product(x));
    h_rows = SX::elements(x.batch()) / in_features;
    return h;
  }

  template <class Z>
  auto with_bias(const Z& z) const {
    if constexpr (Layer::has_bias)
      return z + sketched.bias;
    else
      return z;
  }

  template <mode M, class SX, class SY>
  void forward_as(tensor_ref<const float, SX, space> x, tensor_ref<float, SY, space> y) {
    if constexpr (Layer::folds) {
      if (M == mode::eval && folded_current) {
        this->template store<M>(y, with_bias(matmul(x, folded->packed)));
        h_rows = 0;
        return;
      }
    }
    this->template store<M>(y, with_bias(sketched.second_product(first(x)) * Layer::scale));
  }

  /// The gate (with db), dS2 and dh from the second product, dS1 from the first; returns dh.
  template <class SX, class SY>
  tensor_ref<const float, h_shape<SX>, space> gradients(tensor_ref<const float, SX, space> x,
                                                        tensor_ref<const float, SY, space> y,
                                                        tensor_ref<const float, SY, space> dy) {
    static_assert(check_shapes<SX, SY>());
    const std::size_t batch = dy.batch();
    if (x.batch() != batch || y.batch() != batch)
      detail::batches_differ("solder::nn::sketched_block::backward", {{"x", x.batch()}, {"y", y.batch()}, {"dy", batch}});
    // h of the last forward, or again where that forward ran the folded weight or another batch.
    const auto h = h_rows == SX::elements(batch) / in_features
                       ? tensor_ref<const float, h_shape<SX>, space>(h_buffer.data(), batch)
                       : first(x);
    const auto g = this->gate(y, dy, sketched.bias_grad, "solder::nn::sketched_block::backward");
    const auto dh = this->template workspace<shape<SX::extents[0], 2 * lk>>(dh_buffer, batch);
    const auto second = sketched.second_product(h);
    // Second product: dS2 (the stored part of [U1; S2]) and dh, each scaled by 1/(2L) in its epilogue.
    assign(sketched.s2_grad, std::get<0>(autodiff::right_grads(second, g)) * Layer::scale);
    assign(dh, autodiff::left_grad(second, g) * Layer::scale);
    // First product: dS1 (the stored part of [S1 | U2]).
    const tensor_ref<const float, h_shape<SX>, space> dhc(dh);
    assign(sketched.s1_grad, std::get<0>(autodiff::right_grads(sketched.first_product(x), dhc)));
    return dhc;
  }
};

}  // namespace solder::nn
