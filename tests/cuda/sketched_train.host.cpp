// tests/cuda/sketched_train.host.cpp: the CPU side of sketched_train.cu: kernels/chains.hpp's
// sketched_mlp trained and run by the CPU chain, the example's data and schedule, compiled by the
// C++ compiler.
#include "sketched_train.hpp"

#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>

#include "chains.hpp"
#include "solder/solder.hpp"

namespace solder::test::sketched_train {

namespace {

using X = tensor_ref<const float, shape<dyn, features>>;

/// examples/data/digits.csv, found from this source file's path (which CMake passes to the
/// compiler as an absolute path): the test reads nothing outside the repository.
std::filesystem::path digits_path() {
  return std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "examples" / "data" / "digits.csv";
}

/// The flat parameters of a chain, in params() order.
std::vector<float> flatten(::sketched_mlp& model, bool grads) {
  std::vector<float> out;
  for (const optim::param& p : model.params()) {
    const auto& t = grads ? p.grad : p.value;
    out.insert(out.end(), t.data(), t.data() + t.size());
  }
  if (out.size() != param_floats) throw std::logic_error("sketched_train: the chain has another parameter count");
  return out;
}

void load(::sketched_mlp& model, const std::vector<float>& params) {
  if (params.size() != param_floats) throw std::logic_error("sketched_train: a parameter array of another size");
  std::size_t at = 0;
  for (const optim::param& p : model.params()) {
    std::memcpy(p.value.data(), params.data() + at, p.value.size() * sizeof(float));
    at += p.value.size();
  }
  model.parameters_changed();
}

}  // namespace

// ---- the data ---------------------------------------------------------------------------------

struct digits::impl {
  data::labeled_dataset train, test;
  std::unique_ptr<data::batch_loader> loader;
};

digits::digits() : p_(std::make_unique<impl>()) {
  data::labeled_dataset all = data::load_labeled_csv(digits_path(), features, features);
  data::divide_features(all, 16.0f);  // pixels 0..16 -> [0, 1], as the example
  auto [train, test] = data::train_test_split(all, 0.2, data_seed);
  p_->train = std::move(train);
  p_->test = std::move(test);
  p_->loader = std::make_unique<data::batch_loader>(p_->train, batch, data::last_batch::drop);
}
digits::~digits() = default;

std::size_t digits::batches() const { return p_->loader->size(); }

void digits::epoch(int epoch, std::vector<float>& x, std::vector<std::int32_t>& y) const {
  p_->loader->shuffle(data_seed, std::uint64_t(epoch));
  x.clear();
  y.clear();
  for (const data::batch_view b : *p_->loader) {
    x.insert(x.end(), b.x, b.x + b.rows * features);
    y.insert(y.end(), b.y.begin(), b.y.end());
  }
}

const std::vector<float>& digits::test_x() const { return p_->test.x; }
const std::vector<std::int32_t>& digits::test_y() const { return p_->test.y; }

// ---- the CPU chain ------------------------------------------------------------------------------

struct cpu_chain::impl {
  ::sketched_mlp model;
  std::unique_ptr<optim::sgd> sgd;
  std::unique_ptr<optim::adam> adam;
  std::unique_ptr<optim::adamw> adamw;
  explicit impl(std::uint64_t seed) : model(seed) {}
};

cpu_chain::cpu_chain(std::uint64_t seed, const optimizer_settings& opt) : p_(std::make_unique<impl>(seed)) {
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
std::vector<param_info> cpu_chain::layout() const {
  std::vector<param_info> out;
  for (const optim::param& p : p_->model.params()) out.push_back({p.name, p.value.size()});
  return out;
}

float cpu_chain::train_step(const float* x, const std::int32_t* y, std::size_t rows, float lr, float label_smoothing) {
  const X xr(x, rows);
  const std::span<const std::int32_t> yr(y, rows);
  const nn::cross_entropy_loss loss{label_smoothing};
  if (p_->adamw) {
    p_->adamw->set_lr(lr);
    return p_->model.train_step(xr, yr, *p_->adamw, loss);
  }
  if (p_->adam) {
    p_->adam->set_lr(lr);
    return p_->model.train_step(xr, yr, *p_->adam, loss);
  }
  p_->sgd->set_lr(lr);
  return p_->model.train_step(xr, yr, *p_->sgd, loss);
}

std::vector<float> cpu_chain::forward_backward(const float* x, const float* dy, std::size_t rows) {
  const auto logits = p_->model.forward(X(x, rows));
  p_->model.backward(::sketched_mlp::output_ref(dy, rows));
  return std::vector<float>(logits.data(), logits.data() + rows * classes);
}

// ---- references ----------------------------------------------------------------------------------

std::vector<float> eval_forward(std::uint64_t seed, const std::vector<float>& params, const float* x, std::size_t rows) {
  ::sketched_mlp model(seed);
  load(model, params);
  model.eval();
  const auto logits = model.forward(X(x, rows));
  return std::vector<float>(logits.data(), logits.data() + rows * classes);
}

std::vector<float> schedule(std::int64_t steps) {
  const auto schedule = optim::warmup_cosine_lr(2e-3, steps / 20 + 1, steps, 0.1);
  std::vector<float> lr;
  for (std::int64_t t = 0; t < steps; ++t) lr.push_back(float(schedule(t)));  // as optim::adamw::set_lr takes it
  return lr;
}

double accuracy(const std::vector<float>& params, const std::vector<float>& x, const std::vector<std::int32_t>& y) {
  ::sketched_mlp model(model_seed);  // the sketches the trained chain was drawn with
  load(model, params);
  model.eval();
  return nn::accuracy(model.forward(X(x.data(), y.size())), y);
}

}  // namespace solder::test::sketched_train
