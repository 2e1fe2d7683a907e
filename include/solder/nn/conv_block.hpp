// nn/conv_block.hpp: a convolution, the batch_norm right after it (if any) and the elementwise
// layers after those, as one block: the planner's rewrite of conv2d -> batch_norm.
//
//   nn::conv_block<nn::conv2d<64, 64, 3, 3, 1, 1>, nn::batch_norm<64>, nn::relu> block;
//
// In evaluation mode the normalization is folded into the convolution once, when the model is
// frozen (pack_weights: eval() and parameters_changed() call it), per output channel c:
//   s_c = gamma_c / sqrt(running_var_c + eps),  W'[c] = W[c] s_c,  b'_c = (b_c - mean_c) s_c + beta_c
// and the block runs one convolution with W', b' and then its elementwise tail. In training the
// batch statistics are the batch's own, so nothing can be folded: the convolution, the
// statistics, then the normalization; backward runs them the other way. The tail runs on each
// part of the output as the convolution or the normalization stores it, while it is in cache
// (forward_with), so it costs no pass over memory of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "solder/nn/batch_norm.hpp"
#include "solder/nn/block.hpp"
#include "solder/nn/conv2d.hpp"
#include "solder/nn/elementwise_block.hpp"
#include "solder/ops/batch_norm.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/random/seed.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

namespace detail {
/// The same convolution with a bias: what a folded normalization needs.
template <class Conv>
struct with_bias;
template <std::size_t Cin, std::size_t Cout, std::size_t Kh, std::size_t Kw, std::size_t S, std::size_t P,
          std::size_t D, std::size_t G, bool B, class Space>
struct with_bias<conv2d<Cin, Cout, Kh, Kw, S, P, D, G, B, Space>> {
  using type = conv2d<Cin, Cout, Kh, Kw, S, P, D, G, true, Space>;
};
}  // namespace detail

template <class Conv, class... Tail>
class conv_block {
  using split = detail::leading_norm<elementwise_block, Tail...>;

 public:
  /// Where the parameters, the buffers and the tensors it takes live: the convolution's space.
  using space = typename Conv::space;
  static constexpr bool has_norm = split::has_norm;
  using norm_type = typename split::norm;
  using tail_type = typename split::rest;
  static constexpr std::size_t tail_size = split::rest_size;
  /// The index in the block of the tail's first layer (the convolution is 0).
  static constexpr std::size_t tail_first = has_norm ? 2 : 1;
  /// Whether the block keeps tensors of its output's size for backward beyond x and y (the
  /// convolution's output before the normalization, the normalization's before the tail).
  static constexpr bool keeps_preactivation = has_norm || tail_size > 0;
  /// How many: the convolution's output with a normalization, the tail's input with a tail.
  static constexpr std::size_t kept_outputs = (has_norm ? 1 : 0) + (tail_size > 0 ? 1 : 0);
  static_assert(!has_norm || split::channels == Conv::out_channels,
                "solder::nn::conv_block: the batch_norm after a convolution must have its output channels");

  Conv conv;
  [[no_unique_address]] norm_type norm;
  tail_type tail;
  /// Whether eval mode runs the folded convolution (default) or the convolution and the
  /// normalization as written (the unfolded form, for comparisons; the same values within
  /// rounding).
  bool fold_in_eval = true;

  explicit conv_block(std::uint64_t seed = 0) : conv(seed) {}

  /// The convolution (what the planner and the chain address as the block's head).
  Conv& head() { return conv; }
  const Conv& head() const { return conv; }

  /// Layer At of the block as the user wrote it: the convolution, the batch_norm, the tail's layers.
  template <std::size_t At>
  auto& layer() {
    return layer_of<At>(*this);
  }
  template <std::size_t At>
  const auto& layer() const {
    return layer_of<At>(*this);
  }

  /// Training changes the weights every step: they are packed per call again.
  void train() {
    current = mode::train;
    weights_changed();
    if constexpr (has_norm) norm.train();
    tail.train();
  }
  void eval() {
    current = mode::eval;
    if constexpr (has_norm) norm.eval();
    tail.eval();
  }
  mode current_mode() const { return current; }

  /// Folds the normalization into the convolution's weights and bias, from the running
  /// statistics as they are now (the model is frozen). Call again after they change.
  /// The convolution's own weights are packed for the forward calls that follow too (the
  /// unfolded form's).
  void pack_weights() {
    if constexpr (has_norm) {
      fold();
      if constexpr (requires { folded.pack_weights(); }) folded.pack_weights();
      folded_current = true;
    }
    if constexpr (requires { conv.pack_weights(); }) conv.pack_weights();
  }
  void weights_changed() {
    folded_current = false;
    if constexpr (requires { conv.weights_changed(); }) conv.weights_changed();
  }
  // The block contract (nn/block.hpp); channels_last_capable is below.
  static constexpr bool input_grad_optional = true;
  /// The convolution drawn as torch draws it from stream (seed, first); a batch_norm's
  /// parameters and statistics as torch starts them.
  void reset(std::uint64_t seed, std::size_t first) {
    conv.reset_parameters(random::derive_seed(seed, first));
    if constexpr (has_norm) {
      norm.reset_parameters();
      norm.reset_running_stats();
    }
    weights_changed();
  }
  /// f(k, d) for every dropout d of the tail, k its index in the block.
  template <class F>
  void for_each_dropout(F&& f) {
    tail.for_each_dropout([&](std::size_t k, auto& d) { f(tail_first + k, d); });
  }

  /// The convolution's and the batch_norm's parameters, named from the index `first` of the
  /// convolution in the chain ("0.weight", "0.bias", "1.weight", "1.bias").
  std::vector<optim::basic_param<space>> params_from(std::size_t first) {
    std::vector<optim::basic_param<space>> out = conv.params(std::to_string(first) + ".");
    if constexpr (has_norm)
      for (auto& p : norm.params(std::to_string(first + 1) + ".")) out.push_back(std::move(p));
    return out;
  }
  /// The batch_norm's running statistics, named as torch's state_dict names them.
  std::vector<basic_buffer<space>> buffers_from(std::size_t first) {
    if constexpr (has_norm)
      return norm.buffers(std::to_string(first + 1) + ".");
    else
      return {};
  }

  static const char* plan_kind() { return has_norm ? "conv, BN folded in eval" : "conv + elementwise"; }
  static std::string plan_note() {
    if constexpr (has_norm)
      return "eval: batch_norm folded into the convolution when frozen (W' = W g/sqrt(var+eps), b' = (b-mean) "
             "g/sqrt(var+eps) + beta); train: convolution, batch statistics, normalization; the tail on each part "
             "of the output as it is stored";
    else
      return "the convolution, its elementwise tail on each part of the output as it is stored";
  }

  /// y = tail(norm(conv(x))) for x [batch, Cin, H, W], y [batch, Cout, Ho, Wo].
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX, space> x, tensor_ref<float, SY, space> y) {
    const std::size_t batch = x.batch();
    u_kept = true;    // in u_buf, or made there again by backward
    saved_batch = 0;  // until this forward has finished
    if constexpr (activation_tail) {
      // Evaluation mode, the normalization folded (or none): one convolution whose stores apply
      // the activation.
      if (current == mode::eval && (!has_norm || folded_in_use())) {
        const auto& op = std::get<0>(tail.layers).op;
        if constexpr (has_norm)
          folded.forward_activated(x, y, op);
        else
          conv.forward_activated(x, y, op);
        saved_batch = batch;
        eval_fused = true;
        folded_last = has_norm;
        return;
      }
    }
    eval_fused = false;
    folded_last = has_norm && folded_in_use();
    if constexpr (tail_size > 0) {
      // A convolution right before the tail (no normalization, or a folded one): the tail runs
      // on each part of the output as the convolution stores it. In evaluation mode in place
      // in y (backward makes the tail's input again); in training the convolution's output
      // is the tail's input u, which backward needs.
      if (!has_norm || folded_in_use()) {
        auto& c = [&]() -> auto& {
          if constexpr (has_norm)
            return folded;
          else
            return conv;
        }();
        if (current == mode::eval) {
          c.forward_with(x, y, write(y, tail.template expression<mode::eval>(cview(y))));
          eval_fused = true;
        } else {
          tail.advance();
          const auto u = view<SY>(u_buf, batch);
          c.forward_with(x, u, write(y, tail.template expression<mode::train>(cview(u))));
        }
        saved_batch = batch;
        return;
      }
    }
    const auto u = tail_size > 0 ? view<SY>(u_buf, batch) : y;  // the tail's input
    if constexpr (has_norm) {
      if (folded_in_use()) {
        folded.forward(x, u);
      } else {
        const auto z = view<SY>(z_buf, batch);
        conv.forward(x, z);
        if constexpr (tail_size > 0) {
          // The tail runs on each plane as the normalization writes it. A tail whose backward
          // reads its output runs in place in y: nothing reads u again (the normalization's
          // backward reads its input z).
          const auto normalize_then_tail = [&]<mode M>() {
            if constexpr (tail_type::template output_backward_in<M>) {
              norm.forward_with(cview(z), y, write(y, tail.template expression<M>(cview(y))));
              u_kept = false;
            } else {
              norm.forward_with(cview(z), u, write(y, tail.template expression<M>(cview(u))));
            }
          };
          if (current == mode::train) {
            tail.advance();
            normalize_then_tail.template operator()<mode::train>();
          } else {
            normalize_then_tail.template operator()<mode::eval>();
          }
          saved_batch = batch;
          return;
        }
        norm.forward(cview(z), u);
      }
    } else {
      conv.forward(x, u);
    }
    if constexpr (tail_size > 0) tail.forward(cview(u), y);
    saved_batch = batch;
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX, space>& x, tensor<float, SY, space>& y) {
    forward(x.ref(), y.ref());
  }

  /// y = tail(norm(conv(x))) in evaluation mode on channels-last tensors, x [batch, H, W,
  /// Cin] and y [batch, Ho, Wo, Cout] (NHWC), as a chain of convolutions keeps its images
  /// between them: the one folded convolution (after pack_weights), its stores applying the
  /// activation, with the same bits as forward on the NCHW tensors. For blocks whose tail is
  /// at most one activation; not for backward (training runs forward).
  template <class SX, class SY>
  void forward_channels_last(tensor_ref<const float, SX, space> x, tensor_ref<float, SY, space> y) {
    check_channels_last("forward_channels_last");
    run_folded([&](auto& conv_used, const auto&... op) { conv_used.forward_channels_last(x, y, op...); });
  }

  /// Whether the block can read or write channels-last images now: channels_last_capable, and
  /// evaluation mode with the normalization folded.
  bool channels_last_ready() const { return channels_last_capable && current == mode::eval && (!has_norm || folded_in_use()); }
  /// forward with x [batch, Cin, H, W] and y [batch, Cout, Ho, Wo] each stored NCHW or
  /// channels-last (NHWC) as x_last and y_last say (channels_last_ready; a chain's choice).
  template <class SX, class SY>
  void forward_layouts(tensor_ref<const float, SX, space> x, tensor_ref<float, SY, space> y, bool x_last, bool y_last) {
    if (!x_last && !y_last) return forward(x, y);
    check_channels_last("forward_layouts");
    run_folded([&](auto& conv_used, const auto&... op) { conv_used.forward_layouts(x, y, x_last, y_last, op...); });
  }

  /// Gradients of the last forward (the convolution's and the batch_norm's, overwritten) and
  /// dx. x and y are that forward's input and output.
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX, space> x, tensor_ref<const float, SY, space> y, tensor_ref<const float, SY, space> dy,
                tensor_ref<float, SX, space> dx) {
    const auto [z, gz] = gradients_to_conv(x, y, dy);
    conv.backward(x, z, gz, dx);
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX, space>& x, const tensor<float, SY, space>& y, const tensor<float, SY, space>& dy, tensor<float, SX, space>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }
  /// backward without dx (the first block of a network).
  template <class SX, class SY>
  void backward_params(tensor_ref<const float, SX, space> x, tensor_ref<const float, SY, space> y, tensor_ref<const float, SY, space> dy) {
    const auto [z, gz] = gradients_to_conv(x, y, dy);
    conv.backward_params(x, z, gz);
  }

 private:
  using folded_type = std::conditional_t<has_norm, typename detail::with_bias<Conv>::type, std::tuple<>>;
  [[no_unique_address]] folded_type folded{};
  bool folded_current = false;
  bool eval_fused = false;   // the last forward applied the tail in the convolution's stores
  bool folded_last = false;  // the last forward ran the folded convolution
  bool u_kept = true;        // backward finds the tail's input u in u_buf
  mode current = mode::train;
  /// Whether the tail is one activation, which the convolution's epilogue can apply.
  static constexpr bool activation_tail = [] {
    if constexpr (tail_size == 1)
      return !std::is_void_v<typename detail::activation_of<
          std::tuple_element_t<0, std::remove_cvref_t<decltype(std::declval<tail_type&>().layers)>>>::type>;
    else
      return false;
  }();

 public:
  /// Whether the block can read or write channels-last images: one group and a tail of at most
  /// one activation.
  static constexpr bool channels_last_capable =
      Conv::own_kernels && Conv::groups == 1 && !Conv::depthwise && (tail_size == 0 || activation_tail);

 private:
  std::size_t saved_batch = 0;
  // Rows of one output sample each, grown to the largest batch: the convolution's output (z),
  // the tail's input (u), and their gradients.
  tensor<float, shape<dyn, 1>, space> z_buf{1}, u_buf{1}, gz_buf{1}, gu_buf{1};

  bool folded_in_use() const { return current == mode::eval && fold_in_eval && folded_current; }

  template <std::size_t At, class Self>
  static auto& layer_of(Self& self) {
    return detail::block_layer<At, has_norm>(self.conv, self.norm, self.tail.layers);
  }

  void check_channels_last(const char* what) const {
    static_assert(channels_last_capable,
                  "solder::nn::conv_block: channels-last images need a convolution with one group and a tail of at most "
                  "one activation");
    if (!channels_last_ready())
      solder::detail::fail(std::string("solder::nn::conv_block::") + what +
                           ": runs the folded block of a frozen model; call eval() (or pack_weights() in evaluation "
                           "mode) first");
  }
  /// f(the convolution that runs, the activation if the tail is one): a forward that leaves
  /// nothing for backward.
  template <class F>
  void run_folded(F&& f) {
    auto& c = [&]() -> auto& {
      if constexpr (has_norm)
        return folded;
      else
        return conv;
    }();
    if constexpr (tail_size == 1)
      f(c, std::get<0>(tail.layers).op);
    else
      f(c);
    saved_batch = 0;
  }

  template <class S>
  static tensor_ref<float, S, space> view(tensor<float, shape<dyn, 1>, space>& t, std::size_t batch) {
    const std::size_t n = S::elements(batch);
    if (t.batch() < n) t = tensor<float, shape<dyn, 1>, space>(n);
    return tensor_ref<float, S, space>(t.data(), batch);
  }
  template <class S>
  static tensor_ref<const float, S, space> cview(tensor_ref<float, S, space> t) {
    return tensor_ref<const float, S, space>(t.data(), t.batch());
  }

  /// The tail's and the normalization's backward: the convolution's output z and dL/dz.
  template <class SX, class SY>
  std::pair<tensor_ref<const float, SY, space>, tensor_ref<const float, SY, space>> gradients_to_conv(tensor_ref<const float, SX, space> x,
                                                                                       tensor_ref<const float, SY, space> y,
                                                                                       tensor_ref<const float, SY, space> dy) {
    const std::size_t batch = dy.batch();
    if (x.batch() != batch || y.batch() != batch)
      detail::batches_differ("solder::nn::conv_block::backward", {{"x", x.batch()}, {"y", y.batch()}, {"dy", batch}});
    if (saved_batch != batch)
      solder::detail::fail("solder::nn::conv_block::backward: the last forward had " + std::to_string(saved_batch) +
                           " samples, dy has " + std::to_string(batch) + "; run forward on this batch first");
    // Without u kept, y stands in its place: the tail's backward reads y and the
    // normalization's its input z, neither u.
    const auto u = tail_size > 0 && u_kept ? cview(view<SY>(u_buf, batch)) : y;
    // A folded forward left neither the convolution's output z nor the normalization's state
    // of this batch, and a fused one not the tail's input u: backward is the unfolded form's,
    // so they are made again here, as the unfolded forward makes them.
    if (folded_last) {
      if constexpr (has_norm) {
        const auto z = view<SY>(z_buf, batch);
        conv.forward(x, z);
        norm.forward(cview(z), tail_size > 0 ? view<SY>(u_buf, batch) : view<SY>(gz_buf, batch));
      }
    } else if (eval_fused) {
      if constexpr (tail_size > 0) conv.forward(x, view<SY>(u_buf, batch));
    }
    const auto gu = [&] {
      if constexpr (tail_size > 0) {
        const auto g = view<SY>(gu_buf, batch);
        tail.backward(u, y, dy, g);
        return cview(g);
      } else {
        return dy;
      }
    }();
    if constexpr (has_norm) {
      const auto z = view<SY>(z_buf, batch);
      const auto gz = view<SY>(gz_buf, batch);
      norm.backward(cview(z), u, gu, gz);
      return {cview(z), cview(gz)};
    } else {
      return {u, gu};
    }
  }

  /// W' and b' from the convolution, the normalization's parameters and its running statistics:
  /// ops::batch_norm_fold per output channel.
  void fold() {
    const float* b = nullptr;
    if constexpr (Conv::has_bias) b = conv.bias.data();
    executor<backend_of_t<space>>::elements(
        Conv::out_channels * Conv::fan_in,  // W [Cout, Cin/Groups, Kh, Kw]
        ops::batch_norm_fold_elements{conv.weight.data(), b, norm.weight.data(), norm.bias.data(),
                                      norm.running_mean.data(), norm.running_var.data(), folded.weight.data(),
                                      folded.bias.data(), Conv::fan_in, norm.eps});
  }
};

}  // namespace solder::nn
