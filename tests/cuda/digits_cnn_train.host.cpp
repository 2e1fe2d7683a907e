// tests/cuda/digits_cnn_train.host.cpp: the CPU side of digits_cnn_train.cu: kernels/chains.hpp's
// digits_cnn trained and run by the CPU chain, the example's data and schedule, compiled by the
// C++ compiler.
#include "digits_cnn_train.hpp"

#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>

#include "chains.hpp"
#include "solder/solder.hpp"

namespace solder::test::digits_cnn_train {

namespace {

using X = tensor_ref<const float, shape<dyn, features>>;

/// examples/data/digits.csv, found from this source file's path: the test reads nothing outside
/// the repository.
std::filesystem::path digits_path() {
  return std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "examples" / "data" / "digits.csv";
}

std::vector<float> flatten(::digits_cnn& model, bool grads) {
  std::vector<float> out;
  for (const optim::param& p : model.params()) {
    const auto& t = grads ? p.grad : p.value;
    out.insert(out.end(), t.data(), t.data() + t.size());
  }
  if (out.size() != param_floats) throw std::logic_error("digits_cnn_train: the chain has another parameter count");
  return out;
}

std::vector<float> buffers_of(::digits_cnn& model) {
  std::vector<float> out;
  for (const auto& b : model.buffers()) out.insert(out.end(), b.value.data(), b.value.data() + b.value.size());
  if (out.size() != buffer_floats) throw std::logic_error("digits_cnn_train: the chain has another buffer count");
  return out;
}

void load(::digits_cnn& model, const std::vector<float>& params, const std::vector<float>& buffers) {
  if (params.size() != param_floats || buffers.size() != buffer_floats)
    throw std::logic_error("digits_cnn_train: arrays of another size");
  std::size_t at = 0;
  for (const optim::param& p : model.params()) {
    std::memcpy(p.value.data(), params.data() + at, p.value.size() * sizeof(float));
    at += p.value.size();
  }
  at = 0;
  for (const auto& b : model.buffers()) {
    std::memcpy(b.value.data(), buffers.data() + at, b.value.size() * sizeof(float));
    at += b.value.size();
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
  data::divide_features(all, 16.0f);
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
  ::digits_cnn model;
  std::unique_ptr<optim::adamw> adamw;
  std::unique_ptr<optim::adam> adam;
  std::unique_ptr<optim::sgd> sgd;
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
    p_->sgd = std::make_unique<optim::sgd>(
        p_->model.params(), optim::sgd::options{.lr = opt.lr, .momentum = opt.momentum, .weight_decay = opt.weight_decay});
}
cpu_chain::~cpu_chain() = default;

std::vector<float> cpu_chain::params() const { return flatten(p_->model, false); }
std::vector<float> cpu_chain::grads() const { return flatten(p_->model, true); }
std::vector<float> cpu_chain::buffers() const { return buffers_of(p_->model); }
std::vector<param_info> cpu_chain::layout() const {
  std::vector<param_info> out;
  for (const optim::param& p : p_->model.params()) out.push_back({p.name, p.value.size()});
  return out;
}

float cpu_chain::train_step(const float* x, const std::int32_t* y, std::size_t rows, float lr) {
  const X xr(x, rows);
  const std::span<const std::int32_t> yr(y, rows);
  if (p_->adamw) {
    p_->adamw->set_lr(lr);
    return p_->model.train_step(xr, yr, *p_->adamw);
  }
  if (p_->adam) {
    p_->adam->set_lr(lr);
    return p_->model.train_step(xr, yr, *p_->adam);
  }
  p_->sgd->set_lr(lr);
  return p_->model.train_step(xr, yr, *p_->sgd);
}

std::vector<float> cpu_chain::forward_backward(const float* x, const float* dy, std::size_t rows) {
  const auto logits = p_->model.forward(X(x, rows));
  p_->model.backward(::digits_cnn::output_ref(dy, rows));
  return std::vector<float>(logits.data(), logits.data() + rows * classes);
}

void cpu_chain::set_first_sample(std::uint64_t s) { p_->model.set_first_sample(s); }

// ---- references ----------------------------------------------------------------------------------

std::vector<float> eval_forward(const std::vector<float>& params, const std::vector<float>& buffers, const float* x,
                                std::size_t rows) {
  ::digits_cnn model(model_seed);
  load(model, params, buffers);
  model.eval();
  const auto logits = model.forward(X(x, rows));
  return std::vector<float>(logits.data(), logits.data() + rows * classes);
}

std::vector<float> schedule(std::int64_t steps) {
  const auto s = optim::warmup_cosine_lr(3e-3, steps / 20 + 1, steps, 0.1);
  std::vector<float> lr;
  for (std::int64_t t = 0; t < steps; ++t) lr.push_back(float(s(t)));
  return lr;
}

double accuracy(const std::vector<float>& params, const std::vector<float>& buffers, const std::vector<float>& x,
                const std::vector<std::int32_t>& y) {
  ::digits_cnn model(model_seed);
  load(model, params, buffers);
  model.eval();
  return nn::accuracy(model.forward(X(x.data(), y.size())), y);
}

}  // namespace solder::test::digits_cnn_train
