// tests/cuda/linear_chain.host.cpp: the CPU side of linear_chain.cu: kernels/chains.hpp's
// linear_relu_dropout chain's forward (training and evaluation), backward and training steps,
// compiled by the C++ compiler.
#include "linear_chain.hpp"

#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>

#include "chains.hpp"
#include "solder/solder.hpp"

namespace solder::test::linear_chain {

namespace {

using X = tensor<float, shape<dyn, in>>;
using Y = tensor<float, shape<dyn, out>>;

std::vector<float> flatten(::linear_relu_dropout& model, bool grads) {
  std::vector<float> v;
  for (const optim::param& p : model.params()) {
    const auto& t = grads ? p.grad : p.value;
    v.insert(v.end(), t.data(), t.data() + t.size());
  }
  if (v.size() != param_floats) throw std::logic_error("linear_chain: the chain has another parameter count");
  return v;
}

void load(::linear_relu_dropout& model, const std::vector<float>& params) {
  if (params.size() != param_floats) throw std::logic_error("linear_chain: a parameter array of another size");
  std::size_t at = 0;
  for (const optim::param& p : model.params()) {
    std::memcpy(p.value.data(), params.data() + at, p.value.size() * sizeof(float));
    at += p.value.size();
  }
  model.parameters_changed();
}

X rows_of(const std::vector<float>& x, std::size_t batch) {
  X t(batch);
  std::memcpy(t.data(), x.data(), batch * in * sizeof(float));
  return t;
}

}  // namespace

reference run(const std::vector<float>& x, const std::vector<float>& dy, std::size_t batch) {
  ::linear_relu_dropout model(model_seed);
  const X xt = rows_of(x, batch);
  Y dyt(batch);
  std::memcpy(dyt.data(), dy.data(), dy.size() * sizeof(float));
  reference r;
  r.params = flatten(model, false);
  const Y y = model.forward(xt);
  model.backward(dyt.ref());
  r.y.assign(y.data(), y.data() + batch * out);
  r.grads = flatten(model, true);

  // The mask alone: the same dropout layer on ones, with the stream the forward drew.
  nn::dropout<0.1f> drop;
  drop.rng = model.layer<2>().rng;
  r.scale = drop.scale();
  Y ones(batch), mask(batch);
  for (std::size_t i = 0; i < ones.size(); ++i) ones.data()[i] = 1.0f;
  assign(mask, drop.apply<nn::mode::train>(ones.ref()));
  r.keep.resize(batch * out);
  for (std::size_t i = 0; i < r.keep.size(); ++i) r.keep[i] = mask.data()[i] != 0.0f;

  r.y_eval = eval_forward(r.params, x, batch);
  return r;
}

std::vector<float> initial_params(std::uint64_t seed) {
  ::linear_relu_dropout model(seed);
  return flatten(model, false);
}

std::vector<param_info> layout() {
  ::linear_relu_dropout model(model_seed);
  std::vector<param_info> v;
  for (const optim::param& p : model.params()) v.push_back({p.name, p.value.size()});
  return v;
}

std::vector<float> eval_forward(const std::vector<float>& params, const std::vector<float>& x, std::size_t batch) {
  ::linear_relu_dropout model(model_seed);
  load(model, params);
  model.eval();
  const Y y = model.forward(rows_of(x, batch));
  return std::vector<float>(y.data(), y.data() + batch * out);
}

struct cpu_chain::impl {
  ::linear_relu_dropout model{model_seed};
  std::unique_ptr<optim::sgd> sgd;
  std::unique_ptr<optim::adam> adam;
  std::unique_ptr<optim::adamw> adamw;
};

cpu_chain::cpu_chain(const optimizer_settings& opt) : p_(std::make_unique<impl>()) {
  if (opt.kind == optimizer_settings::adamw)
    p_->adamw = std::make_unique<optim::adamw>(p_->model.params(),
                                               optim::adamw::options{.lr = opt.lr, .weight_decay = opt.weight_decay});
  else if (opt.kind == optimizer_settings::adam)
    p_->adam = std::make_unique<optim::adam>(p_->model.params(),
                                             optim::adam::options{.lr = opt.lr, .weight_decay = opt.weight_decay});
  else
    p_->sgd = std::make_unique<optim::sgd>(p_->model.params(),
                                           optim::sgd::options{.lr = opt.lr, .momentum = opt.momentum,
                                                               .weight_decay = opt.weight_decay, .nesterov = opt.nesterov});
}
cpu_chain::~cpu_chain() = default;

std::vector<float> cpu_chain::params() const { return flatten(p_->model, false); }
std::vector<float> cpu_chain::grads() const { return flatten(p_->model, true); }

float cpu_chain::train_step(const float* x, const std::int32_t* labels, std::size_t rows, float label_smoothing) {
  const tensor_ref<const float, shape<dyn, in>> xr(x, rows);
  const std::span<const std::int32_t> lr(labels, rows);
  const nn::cross_entropy_loss loss{label_smoothing};
  if (p_->adamw) return p_->model.train_step(xr, lr, *p_->adamw, loss);
  if (p_->adam) return p_->model.train_step(xr, lr, *p_->adam, loss);
  return p_->model.train_step(xr, lr, *p_->sgd, loss);
}

}  // namespace solder::test::linear_chain
