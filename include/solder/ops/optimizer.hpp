// ops/optimizer.hpp: the math of training, written once for every value type and backend: the
// SGD, Adam and AdamW hyperparameters (torch's names, defaults and checks) and per-element
// updates, gradient clipping's sum of squares and scale, and the gradient-accumulation fold.
//
// Each is a functor whose members are its hyperparameters (or the per-step scalars derived from
// them) and whose `operator()` updates one element, or one vector of elements, held in
// registers: the caller loads the weight, gradient and state, calls it, and stores what changed.
// The element bodies at the end (sgd_elements, adam_elements, ...) load, update and store at
// index i through simd::load and simd::store; optim/ hands them to the backend's
// `elements` verb, which runs them over vectors on the CPU and one float per thread on CUDA.
// The operation order is part of the contract: it fixes the bits.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "solder/config.hpp"
#include "solder/simd.hpp"

namespace solder::ops {

namespace detail {
/// Throws solder::error, naming the optimizer `who`, for a learning rate torch refuses
/// (negative or NaN).
inline void check_lr(const char* who, float lr) {
  if (!(lr >= 0.0f)) solder::detail::fail_message({who, ": lr must be >= 0, got ", lr});
}
}  // namespace detail

/// torch.optim.SGD's hyperparameters, with its names and defaults (lr has none): what
/// optim::sgd takes and the CUDA backend's train steps are given.
struct sgd_options {
  /// The optimizer named in messages.
  static constexpr const char* name = "solder::optim::sgd";

  float lr;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;

  /// Calls f(name, field) for every hyperparameter, in declaration order, with the names of
  /// torch's param_groups; o is an sgd_options or a const one (checkpoints write them so).
  template <class O, class F>
  static void for_each_field(O& o, F&& f) {
    f("lr", o.lr);
    f("momentum", o.momentum);
    f("dampening", o.dampening);
    f("weight_decay", o.weight_decay);
    f("nesterov", o.nesterov);
  }

  /// Throws solder::error for a learning rate torch refuses (negative or NaN).
  static void check_lr(float lr) { detail::check_lr(name, lr); }
  /// Throws solder::error, naming the option, for settings torch refuses (Nesterov momentum
  /// needs momentum > 0 and zero dampening).
  static void check(const sgd_options& opt) {
    check_lr(opt.lr);
    if (!(opt.momentum >= 0.0f)) solder::detail::fail_message({name, ": momentum must be >= 0, got ", opt.momentum});
    if (!(opt.weight_decay >= 0.0f))
      solder::detail::fail_message({name, ": weight_decay must be >= 0, got ", opt.weight_decay});
    if (!(opt.dampening == opt.dampening)) solder::detail::fail_message({name, ": dampening is NaN"});
    if (opt.nesterov && (opt.momentum <= 0.0f || opt.dampening != 0.0f))
      solder::detail::fail_message({name, ": Nesterov momentum requires momentum > 0 and dampening = 0"});
  }
};

/// torch.optim.Adam's (Decoupled = false) and torch.optim.AdamW's hyperparameters, with their
/// names and defaults (AdamW decays by 1e-2 by default; betas as beta1, beta2).
template <bool Decoupled>
struct adam_options {
  /// The optimizer named in messages.
  static constexpr const char* name = Decoupled ? "solder::optim::adamw" : "solder::optim::adam";

  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = Decoupled ? 1e-2f : 0.0f;

  /// Calls f(name, field) for every hyperparameter, in declaration order, with the names of
  /// torch's param_groups (its betas as beta1, beta2); o is an adam_options or a const one.
  template <class O, class F>
  static void for_each_field(O& o, F&& f) {
    f("lr", o.lr);
    f("beta1", o.beta1);
    f("beta2", o.beta2);
    f("eps", o.eps);
    f("weight_decay", o.weight_decay);
  }

  /// Throws solder::error for a learning rate torch refuses (negative or NaN).
  static void check_lr(float lr) { detail::check_lr(name, lr); }
  /// Throws solder::error, naming the option, for settings torch refuses.
  static void check(const adam_options& opt) {
    check_lr(opt.lr);
    if (!(opt.beta1 >= 0.0f && opt.beta1 < 1.0f))
      solder::detail::fail_message({name, ": beta1 must be in [0, 1), got ", opt.beta1});
    if (!(opt.beta2 >= 0.0f && opt.beta2 < 1.0f))
      solder::detail::fail_message({name, ": beta2 must be in [0, 1), got ", opt.beta2});
    if (!(opt.eps >= 0.0f)) solder::detail::fail_message({name, ": eps must be >= 0, got ", opt.eps});
    if (!(opt.weight_decay >= 0.0f))
      solder::detail::fail_message({name, ": weight_decay must be >= 0, got ", opt.weight_decay});
  }
};

/// torch.optim.SGD, one element (w the weight, g its gradient, b its momentum buffer):
///   g = g + weight_decay w
///   b = g on the first step, else momentum b + (1 - dampening) g     (when momentum != 0)
///   g = nesterov ? g + momentum b : b                                 (when momentum != 0)
///   w = w - lr g
/// Called with (w, g) where momentum is 0 (torch keeps no buffer then), with (w, g, b) otherwise.
struct sgd_update {
  float lr, momentum;
  /// 1 - dampening
  float damping;
  float weight_decay;
  bool nesterov;
  /// The first step of the optimizer: the buffer starts as the gradient itself (torch clones it).
  bool first;
  bool has_decay;

  SOLDER_HD sgd_update(float lr, float momentum, float dampening, float weight_decay, bool nesterov, bool first)
      : lr(lr),
        momentum(momentum),
        damping(1.0f - dampening),
        weight_decay(weight_decay),
        nesterov(nesterov),
        first(first),
        has_decay(weight_decay != 0.0f) {}

  /// Without momentum.
  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(V& w, V g) const {
    if (has_decay) g = g + V(weight_decay) * w;
    w = w - V(lr) * g;
  }
  /// With the momentum buffer b.
  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(V& w, V g, V& b) const {
    if (has_decay) g = g + V(weight_decay) * w;
    b = first ? g : V(momentum) * b + V(damping) * g;
    g = nesterov ? g + V(momentum) * b : b;
    w = w - V(lr) * g;
  }
};

/// torch.optim.Adam (Decoupled = false: L2 decay through the gradient) and torch.optim.AdamW
/// (Decoupled = true: decoupled decay), one element at step t = 1, 2, ... (w the weight, g its
/// gradient, m and v its moments):
///   w = w (1 - lr weight_decay)              (AdamW)
///   g = g + weight_decay w                   (Adam)
///   m = m + (1 - beta1) (g - m)              (torch's lerp, = beta1 m + (1 - beta1) g)
///   v = beta2 v + (1 - beta2) g^2
///   w = w - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
/// eps is added outside the square root, after the bias correction, as PyTorch does.
template <bool Decoupled>
struct adam_update {
  /// lr / (1 - beta1^t)
  float step_size;
  /// sqrt(1 - beta2^t)
  float bias2_sqrt;
  /// AdamW: the factor 1 - lr weight_decay; Adam: weight_decay.
  float decay;
  bool has_decay;
  float one_minus_beta1, beta2, one_minus_beta2, eps;

  /// The scalars of step t from the hyperparameters: in double, rounded once to float, as
  /// PyTorch's Python floats are.
  SOLDER_HD adam_update(float lr, float beta1, float beta2, float eps, float weight_decay, std::int64_t t)
      : step_size(float(double(lr) / (1.0 - ::pow(double(beta1), double(t))))),
        bias2_sqrt(float(::sqrt(1.0 - ::pow(double(beta2), double(t))))),
        decay(Decoupled ? float(1.0 - double(lr) * double(weight_decay)) : weight_decay),
        has_decay(weight_decay != 0.0f),
        one_minus_beta1(float(1.0 - double(beta1))),
        beta2(beta2),
        one_minus_beta2(float(1.0 - double(beta2))),
        eps(eps) {}

  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(V& w, V g, V& m, V& v) const {
    if (has_decay) {
      if constexpr (Decoupled)
        w = w * V(decay);
      else
        g = g + V(decay) * w;
    }
    m = m + V(one_minus_beta1) * (g - m);
    v = v * V(beta2) + V(one_minus_beta2) * g * g;
    const V denom = simd::sqrt(v) / V(bias2_sqrt) + V(eps);
    w = w - V(step_size) * (m / denom);
  }
};

/// The sum of squares sum x_i^2 of n floats that gradient-norm clipping takes the root of, in
/// double, cut into blocks of `block` elements: a block sums with four interleaved accumulators
/// (independent additions keep the adder busy), and the backend adds the block sums in an order
/// fixed by n, so the bits do not depend on threads. Squares of floats are exact in double; a NaN
/// or infinity in x makes the sum NaN or infinite.
struct square_sum {
  static constexpr std::size_t block = 1024;

  /// Blocks of n elements: ceil(n / block).
  SOLDER_HD static constexpr std::size_t blocks(std::size_t n) { return (n + block - 1) / block; }
  /// The sum of x_i^2 over block b of x[0, n): (a0 + a1) + (a2 + a3), where a_k sums the
  /// elements k, k + 4, ... of the block's whole groups of four, and a0 also its last few.
  SOLDER_HD static double of_block(const float* x, std::size_t n, std::size_t b) {
    const std::size_t begin = b * block, end = n < begin + block ? n : begin + block;
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    std::size_t i = begin;
    for (; i + 4 <= end; i += 4) {
      a0 += double(x[i]) * x[i];
      a1 += double(x[i + 1]) * x[i + 1];
      a2 += double(x[i + 2]) * x[i + 2];
      a3 += double(x[i + 3]) * x[i + 3];
    }
    for (; i < end; ++i) a0 += double(x[i]) * x[i];
    return (a0 + a1) + (a2 + a3);
  }
};

/// Gradient-norm clipping (torch.nn.utils.clip_grad_norm_), one gradient element:
///   coefficient = max_norm / (norm + 1e-6)   (in double)
///   g = g * coefficient                      (rounded to float), where scales()
struct clip_scale {
  double coefficient;
  float scale;

  SOLDER_HD clip_scale(float max_norm, double norm) : coefficient(double(max_norm) / (norm + 1e-6)), scale(float(coefficient)) {}
  /// Whether the gradients are scaled: the coefficient is below 1, or NaN (torch's
  /// clamp(coefficient, max=1) passes a NaN on).
  SOLDER_HD bool scales() const { return !(coefficient >= 1.0); }

  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(V& g) const {
    g = g * V(scale);
  }
};

/// Gradient accumulation over N micro-batches, one element: `acc` holds the running sum of the
/// earlier micro-batches' gradients (unread on the first) and g this micro-batch's gradient;
/// afterwards acc holds
///   g                    on the first micro-batch
///   acc + g              on the middle ones
///   (acc + g) / N        on the last: the mean gradient, which the caller stores as the gradient
struct grad_fold {
  float micro_batches;
  bool first = false;
  bool last = false;

  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(V& acc, const V& g) const {
    if (first)
      acc = g;
    else if (!last)
      acc = acc + g;
    else
      acc = (acc + g) / V(micro_batches);
  }
};

// ---- element bodies: body.template operator()<V>(i) updates the V at element i -------------

/// Weights w by sgd_update without momentum, from gradients g.
struct sgd_elements {
  sgd_update update;
  float* w;
  const float* g;
  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const {
    V wi = simd::load<V>(w + i);
    update(wi, simd::load<V>(g + i));
    simd::store(w + i, wi);
  }
};

/// Weights w and their momentum buffer b by sgd_update, from gradients g.
struct sgd_momentum_elements {
  sgd_update update;
  float* w;
  const float* g;
  float* b;
  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const {
    V wi = simd::load<V>(w + i);
    const V gi = simd::load<V>(g + i);
    V bi = simd::load<V>(b + i);
    update(wi, gi, bi);
    simd::store(b + i, bi);
    simd::store(w + i, wi);
  }
};

/// Weights w and their moments m, v by adam_update (Decoupled: AdamW), from gradients g.
template <bool Decoupled>
struct adam_elements {
  adam_update<Decoupled> update;
  float* w;
  const float* g;
  float* m;
  float* v;
  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const {
    V wi = simd::load<V>(w + i);
    const V gi = simd::load<V>(g + i);
    V mi = simd::load<V>(m + i), vi = simd::load<V>(v + i);
    update(wi, gi, mi, vi);
    simd::store(m + i, mi);
    simd::store(v + i, vi);
    simd::store(w + i, wi);
  }
};

/// Gradients g scaled by clip_scale.
struct clip_elements {
  clip_scale clip;
  float* g;
  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const {
    V gi = simd::load<V>(g + i);
    clip(gi);
    simd::store(g + i, gi);
  }
};

/// out = grad_fold of the running sum (not read on the first fold) and the gradients g.
struct fold_elements {
  grad_fold fold;
  const float* sum;
  const float* g;
  float* out;
  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const {
    V acc = fold.first ? V(0.0f) : simd::load<V>(sum + i);
    fold(acc, simd::load<V>(g + i));
    simd::store(out + i, acc);
  }
};

/// x = value (zero_grad).
struct fill_elements {
  float* x;
  float value;
  SOLDER_EXEC_CHECK_OFF
  template <class V>
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const {
    simd::store(x + i, V(value));
  }
};

/// Block b's sum of squares of x[0, n) (square_sum::of_block): the body of a backend's
/// sum_blocks over square_sum::blocks(n) blocks.
struct square_sum_blocks {
  const float* x;
  std::size_t n;
  SOLDER_HD double operator()(std::size_t b) const { return square_sum::of_block(x, n, b); }
};

}  // namespace solder::ops
