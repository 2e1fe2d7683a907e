// tests/cuda/digits_train.host.cpp: the CPU side of digits_train.cu: kernels/chains.hpp's
// digits_mlp trained by the CPU chain, the demo's data and schedule, compiled by the C++ compiler.
#include "digits_train.hpp"

#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <tuple>

#include "chains.hpp"
#include "solder/solder.hpp"

namespace solder::test::digits_train {

namespace {

using X = tensor_ref<const float, shape<dyn, features>>;

/// examples/data/digits.csv, found from this source file's path (which CMake passes to the
/// compiler as an absolute path): the test reads nothing outside the repository.
std::filesystem::path digits_path() {
  return std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "examples" / "data" / "digits.csv";
}

/// The flat parameters of a chain, in params() order.
std::vector<float> flatten(::digits_mlp& model, bool grads) {
  std::vector<float> out;
  for (const optim::param& p : model.params()) {
    const auto& t = grads ? p.grad : p.value;
    out.insert(out.end(), t.data(), t.data() + t.size());
  }
  if (out.size() != param_floats) throw std::logic_error("digits_train: the chain has another parameter count");
  return out;
}

void load(::digits_mlp& model, const std::vector<float>& params) {
  if (params.size() != param_floats) throw std::logic_error("digits_train: a parameter array of another size");
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
  data::divide_features(all, 16.0f);  // pixels 0..16 -> [0, 1], as the demo
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
  ::digits_mlp model;
  std::unique_ptr<optim::adamw> adamw;
  std::unique_ptr<optim::sgd> sgd;
  explicit impl(std::uint64_t seed) : model(seed) {}
};

cpu_chain::cpu_chain(std::uint64_t seed, const optimizer_settings& opt) : p_(std::make_unique<impl>(seed)) {
  if (opt.adamw)
    p_->adamw = std::make_unique<optim::adamw>(p_->model.params(),
                                               optim::adamw::options{.lr = opt.lr, .weight_decay = opt.weight_decay});
  else
    p_->sgd = std::make_unique<optim::sgd>(
        p_->model.params(), optim::sgd::options{.lr = opt.lr, .momentum = opt.momentum, .weight_decay = opt.weight_decay});
}
cpu_chain::~cpu_chain() = default;

std::vector<float> cpu_chain::params() const { return flatten(p_->model, false); }
std::vector<float> cpu_chain::grads() const { return flatten(p_->model, true); }
std::vector<std::uint64_t> cpu_chain::seeds() const {
  return {p_->model.layer<2>().rng.seed, p_->model.layer<5>().rng.seed};
}
std::vector<std::uint64_t> cpu_chain::offsets() const {
  return {p_->model.layer<2>().rng.offset, p_->model.layer<5>().rng.offset};
}

float cpu_chain::train_step(const float* x, const std::int32_t* y, std::size_t rows, float lr) {
  const X xr(x, rows);
  const std::span<const std::int32_t> yr(y, rows);
  if (p_->adamw) {
    p_->adamw->set_lr(lr);
    return p_->model.train_step(xr, yr, *p_->adamw);
  }
  p_->sgd->set_lr(lr);
  return p_->model.train_step(xr, yr, *p_->sgd);
}

// ---- references ----------------------------------------------------------------------------------

std::vector<float> hidden(const std::vector<float>& params, const float* x, std::size_t rows,
                          const std::vector<std::uint64_t>& seeds, const std::vector<std::uint64_t>& offsets) {
  ::digits_mlp model(0);
  load(model, params);
  // A training forward moves each dropout's stream on before drawing: it then draws (seed, offset).
  model.layer<2>().rng = {seeds[0], offsets[0] - 1};
  model.layer<5>().rng = {seeds[1], offsets[1] - 1};
  tensor<float, shape<dyn, hidden0>> h0(rows);
  tensor<float, shape<dyn, hidden1>> h1(rows);
  std::get<0>(model.blocks).forward(X(x, rows), h0.ref());
  std::get<1>(model.blocks).forward(tensor_ref<const float, shape<dyn, hidden0>>(h0.data(), rows), h1.ref());
  if (model.layer<2>().rng.offset != offsets[0] || model.layer<5>().rng.offset != offsets[1])
    throw std::logic_error("digits_train: the CPU blocks drew other streams");
  std::vector<float> out(h0.data(), h0.data() + rows * hidden0);
  out.insert(out.end(), h1.data(), h1.data() + rows * hidden1);
  return out;
}

namespace {
template <std::size_t W>
std::vector<unsigned char> mask_of(std::uint64_t seed, std::uint64_t offset, std::size_t rows) {
  nn::dropout<0.1f> drop;
  drop.rng = {seed, offset};
  tensor<float, shape<dyn, W>> ones(rows), mask(rows);
  for (std::size_t i = 0; i < ones.size(); ++i) ones.data()[i] = 1.0f;
  assign(mask, drop.apply<nn::mode::train>(ones.ref()));
  std::vector<unsigned char> keep(rows * W);
  for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = mask.data()[i] != 0.0f;
  return keep;
}
}  // namespace

std::vector<unsigned char> dropout_mask(std::uint64_t seed, std::uint64_t offset, std::size_t rows, std::size_t width) {
  if (width == hidden0) return mask_of<hidden0>(seed, offset, rows);
  if (width == hidden1) return mask_of<hidden1>(seed, offset, rows);
  throw std::logic_error("digits_train: no dropout of that width");
}

std::vector<float> demo_schedule(std::int64_t steps) {
  const auto schedule = optim::warmup_cosine_lr(2e-3, steps / 20 + 1, steps, 0.1);
  std::vector<float> lr;
  for (std::int64_t t = 0; t < steps; ++t) lr.push_back(float(schedule(t)));  // as optim::adamw::set_lr takes it
  return lr;
}

double accuracy(const std::vector<float>& params, const std::vector<float>& x, const std::vector<std::int32_t>& y) {
  ::digits_mlp model(0);
  load(model, params);
  model.eval();
  return nn::accuracy(model.forward(X(x.data(), y.size())), y);
}

}  // namespace solder::test::digits_train
