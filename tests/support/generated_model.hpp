// support/generated_model.hpp: what the programs that call solder-gen's C interfaces
// (kernels/<stem>.h) share: a chain's functions as a traits struct, a device model that owns its
// handle, solder_optimizer from a test's settings, and the comparisons of what they read back.
// Plain C++ on the toolkit's cuda_runtime.h, so that the host compiler builds it alone too.
// Include it after a generated header: it uses the types they all declare (SOLDER_GEN_COMMON).
#pragma once

#ifndef SOLDER_GEN_COMMON
#error "include a generated kernels/<stem>.h before support/generated_model.hpp"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_vector.hpp"
#include "gpu_program.hpp"
#include "solder/eval/cuda/error.hpp"

/// struct <stem>_api: the functions and sizes of kernels/<stem>.h, one template argument for all.
/// STEM is the stem in capitals, as the header's macros spell it.
#define SOLDER_TEST_GENERATED_API_MEMBERS(stem, STEM)                                                                 \
  using handle = solder_##stem;                                                                                     \
  static constexpr const char* name = #stem;                                                                        \
  static constexpr auto create = &solder_##stem##_create;                                                           \
  static constexpr auto destroy = &solder_##stem##_destroy;                                                         \
  static constexpr auto train = &solder_##stem##_train;                                                             \
  static constexpr auto eval = &solder_##stem##_eval;                                                               \
  static constexpr auto reseed = &solder_##stem##_reseed;                                                           \
  static constexpr auto set_first_sample = &solder_##stem##_set_first_sample;                                       \
  static constexpr auto forward = &solder_##stem##_forward;                                                         \
  static constexpr auto backward = &solder_##stem##_backward;                                                       \
  static constexpr auto optimizer_step = &solder_##stem##_optimizer_step;                                           \
  static constexpr auto reset_optimizer = &solder_##stem##_reset_optimizer;                                         \
  static constexpr auto params = &solder_##stem##_params;                                                           \
  static constexpr auto read_params = &solder_##stem##_read_params;                                                 \
  static constexpr auto write_params = &solder_##stem##_write_params;                                               \
  static constexpr auto read_grads = &solder_##stem##_read_grads;                                                   \
  static constexpr auto read_buffers = &solder_##stem##_read_buffers;                                               \
  static constexpr auto write_buffers = &solder_##stem##_write_buffers;                                             \
  static constexpr auto last_error = &solder_##stem##_last_error;                                                   \
  static constexpr std::size_t in_floats = SOLDER_##STEM##_IN_FLOATS, out_floats = SOLDER_##STEM##_OUT_FLOATS,     \
                               param_tensors = SOLDER_##STEM##_PARAMS, param_floats = SOLDER_##STEM##_PARAM_FLOATS, \
                               buffer_floats = SOLDER_##STEM##_BUFFER_FLOATS, dropouts = SOLDER_##STEM##_DROPOUTS;
#define SOLDER_TEST_GENERATED_API(stem, STEM)   \
  struct stem##_api {                           \
    SOLDER_TEST_GENERATED_API_MEMBERS(stem, STEM) \
    static constexpr bool with_loss = false;    \
  }
/// A chain with a flat output: its header declares loss_and_backward and train_step too.
#define SOLDER_TEST_GENERATED_API_WITH_LOSS(stem, STEM)                           \
  struct stem##_api {                                                           \
    SOLDER_TEST_GENERATED_API_MEMBERS(stem, STEM)                               \
    static constexpr bool with_loss = true;                                     \
    static constexpr auto loss_and_backward = &solder_##stem##_loss_and_backward; \
    static constexpr auto train_step = &solder_##stem##_train_step;             \
  }

namespace solder::test::gpu {

/// A device model behind a generated interface (Api: SOLDER_TEST_GENERATED_API), destroyed with
/// its scope; every call on `stream`, a failed one counted and reported with last_error.
template <class Api>
class generated_model {
 public:
  using handle = typename Api::handle;

  /// Counts and reports a call that did not succeed, with the interface's message; true when it did.
  static bool expect_ok(int status, const char* what) {
    if (status == 0) return true;
    ++failures;
    std::fprintf(stderr, "FAILED: %s: %s returned %d: %s\n", Api::name, what, status, Api::last_error());
    return false;
  }
  /// What solder refuses: cudaErrorInvalidValue, and a message that holds `part`.
  static bool refused(int status, const char* part) {
    return status == int(cudaErrorInvalidValue) && std::string(Api::last_error()).find(part) != std::string::npos;
  }

  explicit generated_model(std::uint64_t seed, cudaStream_t stream = nullptr) : stream_(stream) {
    expect_ok(Api::create(seed, &p_), "create");
    if (p_ == nullptr) throw std::runtime_error(std::string("solder_") + Api::name + "_create made no model");
  }
  ~generated_model() { Api::destroy(p_); }
  generated_model(const generated_model&) = delete;
  generated_model& operator=(const generated_model&) = delete;
  handle* get() const { return p_; }

  std::vector<float> params() const { return read(Api::read_params, Api::param_floats, "read_params"); }
  std::vector<float> grads() const { return read(Api::read_grads, Api::param_floats, "read_grads"); }
  std::vector<float> buffers() const { return read(Api::read_buffers, Api::buffer_floats, "read_buffers"); }
  bool write_params(const std::vector<float>& v) const {
    return expect_ok(Api::write_params(p_, v.data(), stream_), "write_params");
  }
  bool write_buffers(const std::vector<float>& v) const {
    return expect_ok(Api::write_buffers(p_, v.data(), stream_), "write_buffers");
  }
  /// params(): each tensor's name, device memory and floats (never an empty array).
  std::vector<solder_param_tensor> tensors() const {
    std::vector<solder_param_tensor> t(std::max<std::size_t>(Api::param_tensors, 1));
    expect_ok(Api::params(p_, t.data()), "params");
    return t;
  }

  bool train() const { return expect_ok(Api::train(p_), "train"); }
  bool eval() const { return expect_ok(Api::eval(p_), "eval"); }
  bool reseed(std::uint64_t seed) const { return expect_ok(Api::reseed(p_, seed), "reseed"); }
  bool set_first_sample(std::uint64_t first) const {
    return expect_ok(Api::set_first_sample(p_, first), "set_first_sample");
  }
  /// The output of x [rows, in_floats] (device memory) in the model's mode.
  std::vector<float> forward(const float* x, std::size_t rows) const {
    const device_vector<float> y(rows * Api::out_floats);
    expect_ok(Api::forward(p_, x, y.get(), rows, stream_), "forward");
    return y.read();
  }
  bool backward(const float* dy, std::size_t rows) const {
    return expect_ok(Api::backward(p_, dy, rows, stream_), "backward");
  }
  bool optimizer_step(solder_optimizer& o, const char* what = "optimizer_step") const {
    return expect_ok(Api::optimizer_step(p_, &o, stream_), what);
  }
  /// The mean loss (-1 where the call failed).
  float loss_and_backward(const float* x, const std::int32_t* labels, std::size_t rows, float label_smoothing,
                          const char* what = "loss_and_backward") const
    requires Api::with_loss
  {
    float loss = -1;
    expect_ok(Api::loss_and_backward(p_, x, labels, rows, label_smoothing, &loss, stream_), what);
    return loss;
  }
  float train_step(const float* x, const std::int32_t* labels, std::size_t rows, solder_optimizer& o,
                   float label_smoothing = 0.0f) const
    requires Api::with_loss
  {
    float loss = -1;
    expect_ok(Api::train_step(p_, x, labels, rows, &o, label_smoothing, &loss, stream_), "train_step");
    return loss;
  }

 private:
  // A host array of at least one float, so that a chain without any still passes a pointer.
  template <class F>
  std::vector<float> read(F f, std::size_t n, const char* what) const {
    std::vector<float> v(std::max<std::size_t>(n, 1));
    expect_ok(f(p_, v.data(), stream_), what);
    v.resize(n);
    return v;
  }

  handle* p_ = nullptr;
  cudaStream_t stream_;
};

/// solder_optimizer with a test's settings (kind sgd, adam or adamw, lr, weight_decay, momentum,
/// nesterov where it has one) and PyTorch's defaults for the rest.
template <class Settings>
solder_optimizer optimizer_of(const Settings& s) {
  solder_optimizer o{};
  o.kind = s.kind == Settings::sgd ? solder_sgd : s.kind == Settings::adam ? solder_adam : solder_adamw;
  o.lr = s.lr;
  o.weight_decay = s.weight_decay;
  o.momentum = s.momentum;
  if constexpr (requires { s.nesterov; }) o.nesterov = s.nesterov ? 1 : 0;
  o.beta1 = 0.9f;
  o.beta2 = 0.999f;
  o.eps = 1e-8f;
  return o;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// The largest |v[i]| over [begin, end).
inline double largest(const std::vector<float>& v, std::size_t begin, std::size_t end) {
  double m = 0;
  for (std::size_t i = begin; i < std::min(end, v.size()); ++i) m = std::max(m, std::fabs(double(v[i])));
  return m;
}

/// Elements of got[begin, end) off want by more than tol * (the largest |want| there): float sums
/// in another order on each side may cancel far below their terms, never below the tensor's
/// largest element by more than their count.
inline std::size_t off(const std::vector<float>& want, const std::vector<float>& got, std::size_t begin,
                       std::size_t end, double tol) {
  if (want.size() < end || got.size() < end) return end - begin;
  const double bound = tol * largest(want, begin, end);
  std::size_t n = 0;
  for (std::size_t i = begin; i < end; ++i) n += !(std::fabs(double(want[i]) - double(got[i])) <= bound);
  return n;
}
inline std::size_t off(const std::vector<float>& want, const std::vector<float>& got, double tol) {
  return off(want, got, 0, want.size(), tol);
}
/// off() of each tensor [starts[k], starts[k + 1]), k < tensors, summed.
inline std::size_t off_each(const std::vector<float>& want, const std::vector<float>& got, const std::size_t* starts,
                            std::size_t tensors, double tol) {
  std::size_t n = 0;
  for (std::size_t k = 0; k < tensors; ++k) n += off(want, got, starts[k], starts[k + 1], tol);
  return n;
}
/// |got - want| within tol relative to want: a loss, a mean of rows that both sides sum alike.
inline bool close_to(double got, double want, double tol) { return std::fabs(got - want) <= tol * std::fabs(want); }

/// Weights after optimizer steps: close when within weight_abs + weight_rel |w| (the updates add
/// lr-sized multiples of gradients that agree to 1e-5, and Adam's m / sqrt(v) is a ratio of two
/// such). A pre-activation within rounding of 0 may take the other side of relu on one side, which
/// changes a row of a weight's gradient: at most weight_outliers of them may be further, none by
/// more than a bound of the caller's (what the steps moved a weight, with margin).
constexpr double weight_abs = 1e-6, weight_rel = 1e-5, weight_outliers = 0.005;
struct weight_comparison {
  std::size_t far = 0, compared = 0;
  double worst = 0;
  void add(const std::vector<float>& want, const std::vector<float>& got, std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      ++compared;
      const double d = std::fabs(double(want[i]) - double(got[i]));
      far += !(d <= weight_abs + weight_rel * std::fabs(double(want[i])));
      worst = std::max(worst, d == d ? d : 1e30);
    }
  }
  /// Prints the counts under `what`; true when close.
  bool close(double bound, const std::string& what) const {
    std::printf("  %s: %zu of %zu weights beyond 1e-6 + 1e-5 |w|, largest difference %.3g (bound %.3g)\n", what.c_str(),
                far, compared, worst, bound);
    return double(far) <= weight_outliers * double(compared) && worst <= bound;
  }
};
inline bool weights_close(const std::vector<float>& want, const std::vector<float>& got, double bound,
                          const std::string& what) {
  if (want.size() != got.size()) return false;
  weight_comparison c;
  c.add(want, got, 0, want.size());
  return c.close(bound, what);
}
/// The most any weight moved from `initial` to `trained`.
inline double moved(const std::vector<float>& initial, const std::vector<float>& trained) {
  double m = 0;
  for (std::size_t i = 0; i < trained.size(); ++i) m = std::max(m, std::fabs(double(trained[i]) - double(initial[i])));
  return m;
}

/// Rows of logits [rows, classes] whose largest logit (the first of equal ones) is the label.
inline double accuracy_of(const std::vector<float>& logits, const std::vector<std::int32_t>& labels,
                          std::size_t classes) {
  std::size_t right = 0;
  for (std::size_t r = 0; r < labels.size(); ++r) {
    const float* row = logits.data() + r * classes;
    right += std::size_t(std::max_element(row, row + classes) - row) == std::size_t(labels[r]);
  }
  return double(right) / double(labels.size());
}

/// `floats` floats of device memory (a tensor params() points at), read back.
inline std::vector<float> read_device(const float* p, std::size_t floats) {
  std::vector<float> v(floats);
  eval::cuda::check(cudaMemcpy(v.data(), p, floats * sizeof(float), cudaMemcpyDeviceToHost),
                    "cudaMemcpy of a parameter tensor");
  return v;
}

/// Both ranks' gradients replaced in place, through params()' pointers, by their mean, as an
/// all-reduce would leave them.
template <class Api>
void average_gradients(const generated_model<Api>& r0, const generated_model<Api>& r1) {
  const std::vector<solder_param_tensor> t0 = r0.tensors(), t1 = r1.tensors();
  for (std::size_t k = 0; k < Api::param_tensors; ++k) {
    std::vector<float> a = read_device(t0[k].grad, t0[k].floats);
    const std::vector<float> b = read_device(t1[k].grad, t1[k].floats);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * (a[i] + b[i]);
    for (float* to : {t0[k].grad, t1[k].grad})
      eval::cuda::check(cudaMemcpy(to, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice),
                        "cudaMemcpy of the gradients' average");
  }
}

/// The names, floats and device memory params() gives against the CPU chain's layout (`names`,
/// each `floats`) and the flat array's `starts` (tensors + 1 of them) the header's macros give;
/// `initial`: the parameters read_params gives. The four checks of cuda:digits_train.
template <class Api, class Layout>
void check_param_tensors(const generated_model<Api>& m, const Layout& layout, const char* const* names,
                         const std::size_t* starts, const std::vector<float>& initial) {
  constexpr std::size_t tensors = Api::param_tensors;
  const std::vector<solder_param_tensor> t = m.tensors();
  bool named = layout.size() == tensors, placed = named, values = named, pointers = named;
  for (std::size_t k = 0; named && k < tensors; ++k) {
    const std::size_t at = starts[k];
    named = named && t[k].name != nullptr && layout[k].name == t[k].name && layout[k].name == names[k];
    placed = placed && t[k].floats == layout[k].floats && at + t[k].floats == starts[k + 1];
    pointers = pointers && t[k].value != nullptr && t[k].grad != nullptr && t[k].value != t[k].grad;
    if (pointers && placed)
      values = values && std::memcmp(read_device(t[k].value, t[k].floats).data(), initial.data() + at,
                                     t[k].floats * sizeof(float)) == 0;
  }
  expect(named, "params: the CPU chain's state_dict names, in the header's order");
  expect(placed, "params: each tensor's floats, where the header's macros place it in the flat array");
  expect(pointers, "params: a value and a separate gradient pointer for every tensor");
  expect(pointers && placed && values, "params: the device memory of each value holds read_params' floats there");
}

/// Training steps of a classifier on the GPU and the CPU from the same weights and batches (x and
/// labels: `steps` batches of `batch` rows, on the host). Cpu: a CPU chain seeded as `seed` with
/// params(), grads() and train_step(x, labels, rows, lr, label_smoothing) giving the loss.
/// Checks the loss (within loss_tolerance relative) and the optimizer's step count at every step,
/// the first step's gradients (gradients_off(want, got) == 0) and the weights after the steps
/// (weights_close, none off by more than twice the most a weight moved on the CPU: the two
/// sides' updates of an element, each at most that). `split`: each step as loss_and_backward,
/// then optimizer_step.
template <class Api, class Cpu, class Settings, class GradientsOff>
void compare_training_steps(Cpu& cpu, const Settings& s, std::uint64_t seed, const std::vector<float>& x,
                            const std::vector<std::int32_t>& y, std::size_t batch, float label_smoothing, bool split,
                            int steps, const char* what, double loss_tolerance, GradientsOff gradients_off) {
  std::printf("%s, %d steps:\n", what, steps);
  const std::vector<float> initial = cpu.params();
  const generated_model<Api> m(seed);
  solder_optimizer o = optimizer_of(s);
  const device_vector<float> xd(x);
  const device_vector<std::int32_t> yd(y);
  for (int t = 0; t < steps; ++t) {
    const std::size_t row = std::size_t(t) * batch;
    const float* xr = xd.get() + row * Api::in_floats;
    float gpu_loss = -1;
    if (split) {
      gpu_loss = m.loss_and_backward(xr, yd.get() + row, batch, label_smoothing);
      m.optimizer_step(o);
    } else {
      gpu_loss = m.train_step(xr, yd.get() + row, batch, o, label_smoothing);
    }
    const float cpu_loss = cpu.train_step(x.data() + row * Api::in_floats, y.data() + row, batch, s.lr, label_smoothing);
    std::printf("  step %d: loss %.7f (GPU) %.7f (CPU)\n", t + 1, double(gpu_loss), double(cpu_loss));
    expect(close_to(gpu_loss, cpu_loss, loss_tolerance), "training step: the loss within 1e-5 of the CPU's");
    expect(o.steps == t + 1, "training step: the optimizer's steps advanced by 1");
    // The first step starts from the same weights: its gradients are the CPU's within rounding.
    if (t == 0)
      expect(gradients_off(cpu.grads(), m.grads()) == 0,
             "training step: every gradient of the first step within 1e-5 of its tensor's largest");
  }
  const std::vector<float> trained = cpu.params();
  expect(weights_close(trained, m.params(), 2 * moved(initial, trained), what),
         "training step: the weights after the steps close to the CPU's");
}

/// Two ranks, each a model holding half of every batch (the second from sample batch / 2 on:
/// set_first_sample), their gradients averaged in place through params() as an all-reduce would,
/// then each steps: the mean of their losses and the averaged gradients as the CPU chain's on the
/// whole batch, both ranks the same weights, close to the CPU's after the steps. Cpu, x and y as
/// for compare_training_steps.
template <class Api, class Cpu, class Settings, class GradientsOff>
void compare_data_parallel(Cpu& cpu, const Settings& s, std::uint64_t seed, const std::vector<float>& x,
                           const std::vector<std::int32_t>& y, std::size_t batch, int steps, double loss_tolerance,
                           GradientsOff gradients_off) {
  const std::size_t half = batch / 2;
  std::printf("two data-parallel ranks of %zu samples, %d steps:\n", half, steps);
  const std::vector<float> initial = cpu.params();
  const generated_model<Api> r0(seed), r1(seed);
  r1.set_first_sample(half);
  solder_optimizer o0 = optimizer_of(s), o1 = o0;
  const device_vector<float> xd(x);
  const device_vector<std::int32_t> yd(y);
  for (int t = 0; t < steps; ++t) {
    const std::size_t row = std::size_t(t) * batch;
    const float l0 = r0.loss_and_backward(xd.get() + row * Api::in_floats, yd.get() + row, half, 0.0f,
                                          "rank 0 loss_and_backward");
    const float l1 = r1.loss_and_backward(xd.get() + (row + half) * Api::in_floats, yd.get() + row + half, half,
                                          0.0f, "rank 1 loss_and_backward");
    average_gradients(r0, r1);
    const float cpu_loss = cpu.train_step(x.data() + row * Api::in_floats, y.data() + row, batch, s.lr, 0.0f);
    const double mean = 0.5 * (double(l0) + double(l1));
    std::printf("  step %d: loss %.7f (ranks' mean) %.7f (CPU)\n", t + 1, mean, double(cpu_loss));
    expect(close_to(mean, cpu_loss, loss_tolerance),
           "data parallel: the ranks' mean loss within 1e-5 of the CPU's on the whole batch");
    if (t == 0)
      expect(gradients_off(cpu.grads(), r0.grads()) == 0,
             "data parallel: the averaged gradients of the first step within 1e-5 of the CPU's on the whole batch");
    r0.optimizer_step(o0, "rank 0 optimizer_step");
    r1.optimizer_step(o1, "rank 1 optimizer_step");
  }
  const std::vector<float> w0 = r0.params(), trained = cpu.params();
  expect(same_bits(w0, r1.params()), "data parallel: both ranks hold the same weights, bit for bit");
  expect(weights_close(trained, w0, 2 * moved(initial, trained), "data parallel"),
         "data parallel: the weights after the steps close to the CPU's on the whole batches");
}

}  // namespace solder::test::gpu
