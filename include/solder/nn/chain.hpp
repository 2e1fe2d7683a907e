// nn/chain.hpp: a model as a type.
//
//   using mlp = nn::chain<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>,
//                         nn::linear<256, 10>>;
//   mlp model(/*seed=*/1);
//   auto logits = model.forward(x);               // x [batch, 64] -> [batch, 10]
//   model.backward(dlogits);                      // every parameter's gradient
//   optim::adamw opt(model.params());
//   float loss = model.train_step(x, labels, opt);  // forward, loss, backward, update
//
// The layer list is planned into kernels at compile time (nn/plan.hpp): here one GEMM with
// relu and dropout in its epilogue, then one GEMM. Neighbours that do not fit are a compile
// error naming both layers and sample shapes. The chain owns its parameters, gradients and every
// activation; buffers are sized to the largest batch seen and reused, so a training step
// allocates nothing after the first.
//
// The same model over CUDA memory, parameters and activations on the device (in code nvcc
// compiles, after solder/cuda.hpp):
//
//   using gpu_mlp = nn::chain_in<device, nn::linear<64, 256>, nn::relu, nn::linear<256, 10>>;
#pragma once

#include <concepts>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "solder/nn/block.hpp"
#include "solder/nn/buffer.hpp"
#include "solder/nn/criterion.hpp"
#include "solder/nn/plan.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/random/seed.hpp"

namespace solder::nn {

namespace detail {
template <class T>
inline constexpr bool is_owning_tensor = false;
template <class T, class S, class Space>
inline constexpr bool is_owning_tensor<tensor<T, S, Space>> = true;

/// Seconds on the monotonic clock, for the profile (POSIX's clock: <chrono> would bring the
/// iostreams into every translation unit that includes a chain).
inline double seconds_now() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
}  // namespace detail

/// Per-kernel timings of a chain's forward and backward (chain::profile()).
struct profile_entry {
  std::string name;
  double forward_seconds = 0, backward_seconds = 0;
  std::size_t forward_calls = 0, backward_calls = 0;
  double forward_flops = 0, backward_flops = 0;  // accumulated over the timed calls
};

/// How a chain is planned: fused or one kernel per layer, the shape of its input (Input: an
/// nn::input<...>, or unstated_input: fixed by its first layers), and the memory space its
/// parameters, activations and inputs live in.
template <bool Fused, class Input = unstated_input, class Space = host>
struct chain_config {
  static constexpr bool fused = Fused;
  using input = Input;
  using space = Space;
};

/// Layer L over memory space S (L::in_space<S>); every layer as written is the host's.
template <class L, class S>
struct layer_in_space {
  using type = L;
};
template <class L, class S>
  requires(!std::is_same_v<S, host>) && requires { typename L::template in_space<S>; }
struct layer_in_space<L, S> {
  using type = typename L::template in_space<S>;
};
template <class L, class S>
using layer_in_space_t = typename layer_in_space<L, S>::type;

namespace detail {
/// Whether layer L runs over memory of Space: it says so (L::space), or Space is the host's.
template <class L, class Space>
constexpr bool runs_in_space() {
  if constexpr (std::is_same_v<Space, host>)
    return true;
  else if constexpr (requires { typename L::space; })
    return std::is_same_v<typename L::space, Space>;
  else
    return false;
}
/// One error naming the first layer that has no form in Space.
template <class Space, class... Layers>
constexpr bool check_layers_in_space() {
  constexpr std::size_t bad = [] {
    std::size_t i = 0;
    bool found = false;
    ((found = found || !runs_in_space<Layers, Space>(), i += !found), ...);
    return i;
  }();
  if constexpr (bad == sizeof...(Layers)) {
    return true;
  } else {
    using L = std::tuple_element_t<bad, std::tuple<Layers...>>;
    constexpr fixed_string m = [] {
      fixed_string s("solder::chain_in: layer ");
      s.append(bad).append(" (").append(L::name).append(
          ") has no form in this memory space yet; docs/models.md lists the layers that have");
      return s;
    }();
    return diagnostic<m>::reported;
  }
}
}  // namespace detail

/// The sample shape of a chain's input, when its first layer does not fix it (a convolution
/// takes images of any height and width): nn::chain<nn::input<1, 8, 8>, nn::conv2d<1, 16, 3, 3>, ...>.
/// It is not a layer: layer<0>() and the parameter names start at the layer after it.
template <std::size_t... Extents>
struct input {
  static_assert(sizeof...(Extents) >= 1 && sizeof...(Extents) <= sample_shape::max_rank && ((Extents >= 1) && ...),
                "solder::nn::input: give the extents of one sample, 1 to 4 of them, each at least 1 (e.g. input<1, 8, 8>)");
  static constexpr sample_shape shape{Extents...};
};

template <class Config, class... Layers>
class basic_chain {
  static_assert(sizeof...(Layers) >= 1, "solder::chain: a chain needs at least one layer");

 public:
  using layer_list = std::tuple<Layers...>;
  using widths = chain_shapes<typename Config::input, Layers...>;

 private:
  static_assert(check_chain<widths, Layers...>());

 public:
  static constexpr bool fused = Config::fused;
  /// Where the parameters, the activations and the tensors it takes live.
  using space = typename Config::space;
  static_assert(MemorySpace<space>, "solder::chain: the space must be solder::host or solder::device");
  static_assert(detail::check_layers_in_space<space, Layers...>());
  using groups = typename plan_groups<fused, Layers...>::type;
  using blocks_type = typename blocks_of<groups>::type;
  static constexpr std::size_t kernels = std::tuple_size_v<groups>;
  /// Elements of one input and one output sample, and their shapes ([features] for an MLP).
  static constexpr std::size_t in_features = widths::input;
  static constexpr std::size_t out_features = widths::output;
  static constexpr sample_shape input_shape = widths::input_shape;
  static constexpr sample_shape output_shape = widths::output_shape;
  using input_ref = tensor_ref<const float, typename widths::input_batch, space>;
  using output_ref = tensor_ref<const float, typename widths::output_batch, space>;
  using input_tensor = tensor<float, typename widths::input_batch, space>;
  using output_tensor = tensor<float, typename widths::output_batch, space>;
  using param_type = optim::basic_param<space>;
  /// The same chain over memory space S: each layer's form there (its in_space<S>).
  template <class S>
  using in_space = basic_chain<chain_config<Config::fused, typename Config::input, S>, layer_in_space_t<Layers, S>...>;

  blocks_type blocks;

  static constexpr std::size_t layer_count = sizeof...(Layers);

  /// Layer I as the user wrote it (0-based, as torch's model[I]), whichever block the planner
  /// put it in: model.layer<0>().weight is the first linear layer's weight.
  template <std::size_t I>
  auto& layer() {
    if constexpr (check_layer_index<I>())
      return layer_in<I>(std::get<block_of_layer<I>>(blocks));
    else
      return blocks;  // not reached: the index check failed to compile
  }
  template <std::size_t I>
  const auto& layer() const {
    if constexpr (check_layer_index<I>())
      return layer_in<I>(std::get<block_of_layer<I>>(blocks));
    else
      return blocks;
  }

  /// Parameters drawn as PyTorch initializes them, layer i from Philox stream (seed, i); each
  /// dropout draws its masks from its own stream.
  explicit basic_chain(std::uint64_t seed = 0) {
    if constexpr (check_blocks(std::make_index_sequence<kernels>{})) reseed(seed);
  }

  void reseed(std::uint64_t seed) {
    for_each_block([&]<class G>(auto& b, std::type_identity<G>) {
      b.reset(seed, G::first);
      b.for_each_dropout([&](std::size_t k, auto& d) { d.rng = {random::derive_seed(seed, G::first + k), 0}; });
    });
  }

  void train() {
    current = mode::train;
    for_each_block([](auto& b, auto) {
      b.train();
      b.weights_changed();
    });
  }
  /// Evaluation mode: dropout off, and every weight packed once into the GEMM's layout for the
  /// forward calls that follow (call pack_weights() again if weights change in this mode).
  void eval() {
    current = mode::eval;
    for_each_block([](auto& b, auto) { b.eval(); });
    pack_weights();
  }
  mode current_mode() const { return current; }
  /// Whether forward, backward and train_step flush denormals to zero (default: yes; the CPU
  /// backend's flush_denormals says why; the CUDA kernels keep denormals either way). Off: IEEE
  /// gradual underflow, slower late in training.
  void set_flush_denormals(bool on) { flush = on; }
  /// Whether forward keeps the images between two convolution blocks channels-last when both
  /// can run so (frozen, the normalization folded; default: yes), and whether the last forward
  /// did. The values are the same bits either way.
  void set_channels_last(bool on) { channels_last_between = on; }
  bool kept_channels_last() const { return images_channels_last; }
  /// Call after changing parameters outside train_step (loading them, editing them): the
  /// packed weights of eval mode are made again.
  void parameters_changed() {
    if (current == mode::eval)
      pack_weights();
    else
      for_each_block([](auto& b, auto) { b.weights_changed(); });
  }
  void pack_weights() {
    for_each_block([](auto& b, auto) { b.pack_weights(); });
  }

  /// The batches that follow are part of a larger one, starting at its sample s: every dropout
  /// draws the masks the larger batch's samples s, s + 1, ... draw, so a data-parallel shard or
  /// a micro-batch drops what the whole batch would (default 0: a batch of its own).
  void set_first_sample(std::uint64_t s) {
    for_each_dropout([&](std::size_t layer, auto& d) { d.rng.first = s * widths::after[layer]; });
  }
  /// Every dropout's stream (seed, offset: where its next training forward draws, first), in
  /// layer order: what a checkpoint keeps so a resumed run draws the masks it would have.
  std::vector<philox_state> dropout_streams() {
    std::vector<philox_state> out;
    for_each_dropout([&](std::size_t, auto& d) { out.push_back(d.rng); });
    return out;
  }
  /// Sets the streams dropout_streams() returned; a list of another length is a solder::error.
  void set_dropout_streams(std::span<const philox_state> streams) {
    std::size_t n = 0;
    for_each_dropout([&](std::size_t, auto&) { ++n; });
    if (streams.size() != n)
      solder::detail::fail("solder::chain::set_dropout_streams: got " + std::to_string(streams.size()) +
                           " streams, the chain has " + std::to_string(n) + " dropout layers");
    std::size_t k = 0;
    for_each_dropout([&](std::size_t, auto& d) { d.rng = streams[k++]; });
  }

  /// The model's output for x [batch, In]: an owned [batch, Out] tensor, which later calls
  /// never change. backward reads x (dW of the first layer), so a view x must stay valid until
  /// then; a temporary tensor is moved into the chain and kept there.
  output_tensor forward(input_ref x) {
    run(x);
    return output_tensor(output_view(batch));
  }
  template <class S>
    requires(S::rank >= 2 && S::inner_size == in_features)
  output_tensor forward(tensor_ref<const float, S, space> x) {
    return forward(as_input(x));
  }
  template <class S>
  output_tensor forward(const tensor<float, S, space>& x) {
    return forward(x.ref());
  }
  template <class S>
  output_tensor forward(tensor<float, S, space>&& x) {
    if constexpr (std::is_same_v<S, typename input_tensor::shape_type>) {
      held = std::move(x);
    } else {
      const input_ref view = as_input(x.ref());
      held = input_tensor(view.batch(), uninitialized);
      exec::copy(held.data(), view.data(), view.size());
    }
    return forward(input_ref(held.ref()));
  }

  /// forward without allocating: the output is written into out [batch, Out] (the chain keeps
  /// its own copy, which backward reads). x as for forward, but a temporary tensor is refused:
  /// backward would read it after it is gone.
  template <class X>
  void forward_into(X&& x, tensor_ref<float, typename widths::output_batch, space> out) {
    static_assert(std::is_lvalue_reference_v<X> || !detail::is_owning_tensor<std::remove_cvref_t<X>>,
                  "solder::chain::forward_into: the batch is a temporary tensor, but backward reads it after forward; "
                  "keep it in a variable (or call forward, which keeps a temporary batch)");
    run(as_input(x));
    if (out.batch() != batch)
      solder::detail::fail_counts("solder::chain::forward_into: out has ", out.batch(), " rows, the batch has ", batch);
    exec::copy(out.data(), output_view(batch).data(), batch * out_features);
  }

  /// Gradients of every parameter (overwritten) for dL/d(output) = dy, [batch, Out], after the
  /// forward of that batch.
  void backward(output_ref dy) {
    backward(dy, [](std::size_t) {});
  }
  /// backward, calling block_done(k) as soon as kernel k's backward has run (the last kernel
  /// first): block_params(k) then hold their gradients, so a data-parallel trainer can start
  /// reducing them while the earlier kernels run.
  template <class F>
    requires std::invocable<F&, std::size_t>
  void backward(output_ref dy, F&& block_done) {
    const typename exec::flush_denormals guard(flush);
    const std::size_t n = dy.batch();
    if (n != batch)
      solder::detail::fail_counts("solder::chain::backward: dy has ", n, " rows, the last forward had ", batch);
    upstream = dy.data();
    // Backward reads every block's input as NCHW: a forward that kept images channels-last
    // runs again without.
    if (images_channels_last) run_forward(n, false, std::make_index_sequence<kernels>{});
    run_backward(n, block_done, std::make_index_sequence<kernels>{});
  }

  /// dL/d(output) buffer of the chain (the loss writes into it; train_step does).
  tensor_ref<float, typename widths::output_batch, space> output_grad() {
    return tensor_ref<float, typename widths::output_batch, space>(dout.data(), batch);
  }

  /// One training step: forward, the loss and its gradient (one pass), backward, the
  /// optimizer's step. Returns the mean loss. `loss` is any loss of nn/criterion.hpp with the
  /// target it takes: cross_entropy_loss (integer labels, the default), mse_loss or
  /// bce_with_logits_loss (a target tensor of the output's shape); targets live in the chain's
  /// space (in device memory, cross_entropy_loss with device labels).
  template <class Target, class Optimizer, class Loss = cross_entropy_loss>
  float train_step(input_ref x, const Target& target, Optimizer& opt, const Loss& loss = {}) {
    const float value = loss_and_backward(x, target, loss);
    opt.step();
    return value;
  }

  /// train_step without the optimizer's step: forward, the loss and its gradient, backward
  /// (calling block_done(k) after kernel k's, as backward does). Returns the mean loss.
  template <class Target, class Loss = cross_entropy_loss, class F = void (*)(std::size_t)>
    requires std::invocable<F&, std::size_t>
  float loss_and_backward(input_ref x, const Target& target, const Loss& loss = {}, F&& block_done = [](std::size_t) {}) {
    const typename exec::flush_denormals guard(flush);
    run(x, false);
    const float value = loss(output_view(batch), target, output_grad());
    backward(output_ref(dout.data(), batch), block_done);
    return value;
  }

  /// train_step on a batch of another shape with the elements of one input sample per row (a
  /// [batch, 64] batch for a chain over [1, 8, 8] images).
  template <class S, class Target, class Optimizer, class Loss = cross_entropy_loss>
    requires(!std::is_same_v<S, typename widths::input_batch> && S::rank >= 2 && S::inner_size == in_features)
  float train_step(tensor_ref<const float, S, space> x, const Target& target, Optimizer& opt, const Loss& loss = {}) {
    return train_step(as_input(x), target, opt, loss);
  }

  /// Every parameter with its gradient, named as PyTorch's nn.Sequential names them ("0.weight",
  /// "0.bias", ... by layer position), for optimizers and parameter files.
  std::vector<param_type> params() {
    std::vector<param_type> out;
    for_each_block([&]<class G>(auto& b, std::type_identity<G>) {
      for (auto& p : b.params_from(G::first)) out.push_back(std::move(p));
    });
    return out;
  }
  /// The parameters of kernel k (0 <= k < kernels), as params() names them; params() is every
  /// kernel's in order.
  std::vector<param_type> block_params(std::size_t k) {
    if (k >= kernels)
      solder::detail::fail("solder::chain::block_params: kernel " + std::to_string(k) + " is out of range; the chain has " +
                           std::to_string(kernels) + " kernels");
    std::vector<param_type> out;
    std::size_t i = 0;
    for_each_block([&]<class G>(auto& b, std::type_identity<G>) {
      if (i++ == k) out = b.params_from(G::first);
    });
    return out;
  }

  /// The state besides parameters (batch_norm's running statistics), named as torch's
  /// state_dict names them ("1.running_mean", ...); nn::save and nn::load include them.
  std::vector<basic_buffer<space>> buffers() {
    std::vector<basic_buffer<space>> out;
    for_each_block([&]<class G>(auto& b, std::type_identity<G>) {
      for (auto& t : b.buffers_from(G::first)) out.push_back(std::move(t));
    });
    return out;
  }

  // ---- profiling --------------------------------------------------------------------------
  /// Times every kernel of forward and backward from now on (the monotonic clock around each
  /// call).
  void enable_profiling(bool on = true) {
    profiling = on;
    if (on) reset_profile();
  }
  void reset_profile() {
    timings.assign(kernels, {});
    std::size_t k = 0;
    for_each_block([&]<class G>(auto&, std::type_identity<G>) { timings[k++].name = kernel_name<G>(); });
  }
  const std::vector<profile_entry>& profile() const { return timings; }
  /// The profile as a table: time per call, share of the total, GFLOP/s per kernel, written
  /// to os (a std::ostream, or any stream taking C strings with <<).
  template <class Stream>
  void print_profile(Stream& os) const;

  /// The name of the kernel group G runs as, e.g. "linear+relu+dropout".
  template <class G>
  static std::string kernel_name() {
    return group_name<G>();
  }

 private:
  template <std::size_t I>
  static constexpr bool check_layer_index() {
    if constexpr (I < layer_count) {
      return true;
    } else {
      constexpr fixed_string m = [] {
        fixed_string s("solder::chain::layer: index ");
        s.append(I).append(" is out of range; the chain has ").append(layer_count).append(" layers (0 to ");
        s.append(layer_count - 1).append(")");
        return s;
      }();
      return diagnostic<m>::reported;
    }
  }
  /// The block that holds layer I.
  template <std::size_t I>
  static constexpr std::size_t block_of_layer = [] {
    return []<std::size_t... K>(std::index_sequence<K...>) {
      std::size_t found = 0;
      ((std::tuple_element_t<K, groups>::first <= I ? found = K : found), ...);
      return found;
    }(std::make_index_sequence<kernels>{});
  }();
  /// Layer I inside its block b: the block's layer I - first, or a layer that is a block of its own.
  template <std::size_t I, class B>
  static auto& layer_in(B& b) {
    using G = std::tuple_element_t<block_of_layer<I>, groups>;
    if constexpr (G::kind == layer_kind::block)
      return b;
    else
      return b.template layer<I - G::first>();
  }

  /// Runs every block on x; the output stays in the last block's buffer. With channels_last,
  /// the images between two convolution blocks that can run channels-last (frozen, folded) stay
  /// channels-last (docs/convolution.md, "Layouts").
  void run(input_ref x, bool channels_last = true) {
    const typename exec::flush_denormals guard(flush);
    const std::size_t n = x.batch();
    reserve(n);
    input = x.data();
    run_forward(n, channels_last && channels_last_between, std::make_index_sequence<kernels>{});
  }
  /// x as the chain's input: a batch of samples of input_shape, or of as many features.
  template <class S>
  static input_ref as_input(tensor_ref<const float, S, space> x) {
    static_assert(S::rank >= 2 && S::inner_size == in_features,
                  "solder::chain: the input must be [batch, ...] with the elements of one sample of the chain's input "
                  "shape (in_features) after the batch extent");
    return input_ref(x.data(), S::elements(x.batch()) / in_features);
  }
  template <class S>
  static input_ref as_input(tensor_ref<float, S, space> x) {
    return as_input(tensor_ref<const float, S, space>(x));
  }
  template <class S>
  static input_ref as_input(const tensor<float, S, space>& x) {
    return as_input(x.ref());
  }

  using exec = executor<backend_of_t<space>>;

  mode current = mode::train;
  bool flush = true;
  input_tensor held{1};  // a temporary batch forward was given, kept for backward
  std::size_t batch = 0, capacity = 0;
  const float* input = nullptr;     // the last forward's x (views assign elements, so pointers)
  const float* upstream = nullptr;  // the last backward's dy
  bool profiling = false;
  std::vector<profile_entry> timings;
  bool channels_last_between = true;
  bool images_channels_last = false;  // the last forward kept some block outputs channels-last

  template <class G>
  using out_tensor = tensor<float, typename widths::template batch_after<G::first + G::size - 1>, space>;
  template <class Gs>
  struct outputs_of;
  template <class... Gs>
  struct outputs_of<std::tuple<Gs...>> {
    using type = solder::detail::tuple<out_tensor<Gs>...>;
    static type make() { return type{{{out_tensor<Gs>(1)}...}}; }
  };
  using outputs = outputs_of<groups>;
  typename outputs::type acts = outputs::make(), grads = outputs::make();  // each block's output and dL/d(output)
  output_tensor dout{1};  // dL/d(model output), for train_step
  input_tensor dinput{1};  // dL/dx of a first block that must write one


  /// Block I provides the block contract (nn/block.hpp) from its input's shape to its output's.
  template <std::size_t I>
  static constexpr bool check_block() {
    using B = std::tuple_element_t<I, blocks_type>;
    using SY = typename solder::detail::tuple_element_t<I, typename outputs::type>::shape_type;
    using SX = typename std::conditional_t<I == 0, std::type_identity<input_tensor>,
                                           solder::detail::tuple_element<(I == 0 ? 0 : I - 1), typename outputs::type>>::type::shape_type;
    if constexpr (Block<B, SX, SY, space>) {
      return true;
    } else {
      static_assert(Block<B, SX, SY, space>, "solder::chain: this block lacks a member of the block contract (nn/block.hpp); a layer "
                                      "that is a block of its own can derive from nn::block_defaults");
      return false;
    }
  }
  template <std::size_t... I>
  static constexpr bool check_blocks(std::index_sequence<I...>) {
    return (check_block<I>() && ...);
  }

  /// f(layer index, dropout layer) for every dropout, in layer order.
  template <class F>
  void for_each_dropout(F&& f) {
    for_each_block([&]<class G>(auto& b, std::type_identity<G>) {
      b.for_each_dropout([&](std::size_t k, auto& d) { f(G::first + k, d); });
    });
  }

  /// f(block, type_identity<group>) for every block, in order.
  template <class F>
  void for_each_block(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f(std::get<I>(blocks), std::type_identity<std::tuple_element_t<I, groups>>{}), ...);
    }(std::make_index_sequence<kernels>{});
  }

  void reserve(std::size_t n) {
    if (n == 0) solder::detail::fail("solder::chain: a batch needs at least one sample");
    batch = n;
    if (n <= capacity) return;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((solder::detail::get<I>(acts) = solder::detail::tuple_element_t<I, decltype(acts)>(n),
        solder::detail::get<I>(grads) = solder::detail::tuple_element_t<I, decltype(grads)>(n)),
       ...);
    }(std::make_index_sequence<kernels>{});
    dout = output_tensor(n);
    dinput = input_tensor(n);
    capacity = n;
  }

  template <std::size_t I>
  auto act_view(std::size_t n) {
    using T = solder::detail::tuple_element_t<I, decltype(acts)>;
    return tensor_ref<float, typename T::shape_type, space>(solder::detail::get<I>(acts).data(), n);
  }
  template <std::size_t I>
  auto act_cview(std::size_t n) const {
    using T = solder::detail::tuple_element_t<I, decltype(acts)>;
    return tensor_ref<const float, typename T::shape_type, space>(solder::detail::get<I>(acts).data(), n);
  }
  template <std::size_t I>
  auto grad_view(std::size_t n) {
    using T = solder::detail::tuple_element_t<I, decltype(grads)>;
    return tensor_ref<float, typename T::shape_type, space>(solder::detail::get<I>(grads).data(), n);
  }
  output_ref output_view(std::size_t n) const { return act_cview<kernels - 1>(n); }

  /// The input of block I: the model input or the previous block's output.
  template <std::size_t I>
  auto block_input(std::size_t n) const {
    if constexpr (I == 0)
      return input_ref(input, n);
    else
      return act_cview<I - 1>(n);
  }

  template <class F>
  void timed(std::size_t k, bool fwd, double flops, F&& f) {
    if (!profiling) return f();
    const double t0 = detail::seconds_now();
    f();
    const double s = detail::seconds_now() - t0;
    auto& e = timings[k];
    (fwd ? e.forward_seconds : e.backward_seconds) += s;
    (fwd ? e.forward_calls : e.backward_calls) += 1;
    (fwd ? e.forward_flops : e.backward_flops) += flops;
  }

  /// Whether block I can read or write channels-last images (a convolution block that says
  /// so), and whether it can now.
  template <std::size_t I>
  static constexpr bool channels_last_capable = std::tuple_element_t<I, blocks_type>::channels_last_capable;
  template <std::size_t I>
  bool channels_last_ready() const {
    if constexpr (channels_last_capable<I>)
      return std::get<I>(blocks).channels_last_ready();
    else
      return false;
  }

  template <std::size_t... I>
  void run_forward(std::size_t n, bool channels_last, std::index_sequence<I...>) {
    // last[I]: block I's output stays channels-last, read so by block I + 1.
    bool last[kernels + 1] = {};
    if (channels_last) ((last[I + 1] = I + 1 < kernels && channels_last_ready<I>() && channels_last_ready<(I + 1) % kernels>()), ...);
    images_channels_last = false;
    for (std::size_t k = 1; k <= kernels; ++k) images_channels_last = images_channels_last || last[k];
    (timed(I, true, group_flops<std::tuple_element_t<I, groups>, widths>(true) * double(n),
           [&] {
             auto& b = std::get<I>(blocks);
             if constexpr (channels_last_capable<I>) {
               if (last[I] || last[I + 1]) return b.forward_layouts(block_input<I>(n), act_view<I>(n), last[I], last[I + 1]);
             }
             b.forward(block_input<I>(n), act_view<I>(n));
           }),
     ...);
  }

  template <std::size_t I>
  void backward_block(std::size_t n) {
    auto& b = std::get<I>(blocks);
    const auto y = act_cview<I>(n);
    using GT = solder::detail::tuple_element_t<I, decltype(grads)>;
    const auto dy = [&] {
      if constexpr (I + 1 == kernels)
        return output_ref(upstream, n);
      else
        return tensor_ref<const float, typename GT::shape_type, space>(solder::detail::get<I>(grads).data(), n);
    }();
    if constexpr (I == 0) {
      if constexpr (std::remove_cvref_t<decltype(b)>::input_grad_optional)
        b.backward_params(block_input<0>(n), y, dy);
      else
        b.backward(block_input<0>(n), y, dy, tensor_ref<float, typename widths::input_batch, space>(dinput.data(), n));
    } else {
      b.backward(block_input<I>(n), y, dy, grad_view<I - 1>(n));
    }
  }

  template <class F, std::size_t... I>
  void run_backward(std::size_t n, F& block_done, std::index_sequence<I...>) {
    // Last block first.
    constexpr std::size_t K = sizeof...(I);
    ((timed(K - 1 - I, false, group_flops<std::tuple_element_t<K - 1 - I, groups>, widths>(false) * double(n),
            [&] { backward_block<K - 1 - I>(n); }),
      block_done(K - 1 - I)),
     ...);
  }
};

namespace detail {
template <bool Fused, class Space, class... Layers>
struct chain_of {
  using type = basic_chain<chain_config<Fused, unstated_input, Space>, layer_in_space_t<Layers, Space>...>;
};
template <bool Fused, class Space, std::size_t... Extents, class... Layers>
struct chain_of<Fused, Space, input<Extents...>, Layers...> {
  using type = basic_chain<chain_config<Fused, input<Extents...>, Space>, layer_in_space_t<Layers, Space>...>;
};
}  // namespace detail

/// A model: its layers planned into fused kernels (optionally after an nn::input<...> that
/// gives the shape of one input sample).
template <class... Layers>
using chain = typename detail::chain_of<true, host, Layers...>::type;
/// The same model with one kernel per layer (what an eager framework runs), for comparisons.
template <class... Layers>
using unfused_chain = typename detail::chain_of<false, host, Layers...>::type;
/// The model with its parameters, activations and inputs in memory of Space (solder::device:
/// CUDA memory, run by the CUDA backend): each layer as in_space<Space>.
template <class Space, class... Layers>
using chain_in = typename detail::chain_of<true, Space, Layers...>::type;

template <class Config, class... Layers>
template <class Stream>
void basic_chain<Config, Layers...>::print_profile(Stream& os) const {
  double total = 0;
  for (const auto& e : timings) total += e.forward_seconds + e.backward_seconds;
  char line[160];
  auto row = [&](const std::string& name, double s, std::size_t calls, double flops) {
    if (calls == 0) return;
    std::snprintf(line, sizeof line, "  %-34s%11.2f us%8.1f %%%10.2f GFLOP/s\n", name.c_str(), 1e6 * s / double(calls),
                  total > 0 ? 100.0 * s / total : 0.0, s > 0 ? flops / s * 1e-9 : 0.0);
    os << line;
  };
  std::snprintf(line, sizeof line, "  %-34s%14s%10s%18s", "kernel", "time/call", "share", "rate\n");
  os << line;
  for (const auto& e : timings) row(e.name + " (fwd)", e.forward_seconds, e.forward_calls, e.forward_flops);
  for (auto it = timings.rbegin(); it != timings.rend(); ++it)
    row(it->name + " (bwd)", it->backward_seconds, it->backward_calls, it->backward_flops);
}

}  // namespace solder::nn
