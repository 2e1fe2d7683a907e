// tests/cuda/sketched_train.host.cpp: the CPU side of sketched_train.cu: kernels/chains.hpp's
// sketched_mlp trained by the CPU chain, the example's data and schedule, its first sketched block
// alone; compiled by the C++ compiler.
#include "sketched_train.hpp"

#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <tuple>

#include "chains.hpp"
#include "solder/solder.hpp"

namespace solder::test::sketched_train {

namespace {

using X = tensor_ref<const float, shape<dyn, features>>;

/// examples/data/digits.csv, found from this source file's path: the test reads nothing outside
/// the repository.
std::filesystem::path digits_path() {
  return std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "examples" / "data" / "digits.csv";
}

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

template <class T>
void append(std::vector<float>& out, const T& t, std::size_t n) {
  out.insert(out.end(), t.data(), t.data() + n);
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
  ::sketched_mlp model{model_seed};
  std::unique_ptr<optim::adamw> adamw;
  std::unique_ptr<optim::sgd> sgd;
};

cpu_chain::cpu_chain(const optimizer_settings& opt) : p_(std::make_unique<impl>()) {
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
std::vector<std::uint64_t> cpu_chain::sketch_seeds() const {
  return {p_->model.layer<0>().sketch_seed, p_->model.layer<3>().sketch_seed};
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

forward_result forward(const std::vector<float>& params, const float* x, std::size_t rows,
                       const std::vector<std::uint64_t>& seeds, const std::vector<std::uint64_t>& offsets) {
  ::sketched_mlp model(model_seed);  // the same sketches as the trained chain
  load(model, params);
  // A training forward moves each dropout's stream on before drawing: it then draws (seed, offset).
  model.layer<2>().rng = {seeds[0], offsets[0] - 1};
  model.layer<5>().rng = {seeds[1], offsets[1] - 1};
  tensor<float, shape<dyn, h0>> hx0(rows);
  tensor<float, shape<dyn, hidden0>> y0(rows);
  tensor<float, shape<dyn, h1>> hx1(rows);
  tensor<float, shape<dyn, hidden1>> y1(rows);
  tensor<float, shape<dyn, classes>> logits(rows);
  const X xr(x, rows);
  assign(hx0, model.layer<0>().first_product(xr));
  std::get<0>(model.blocks).forward(xr, y0.ref());
  const tensor_ref<const float, shape<dyn, hidden0>> y0c(y0.data(), rows);
  assign(hx1, model.layer<3>().first_product(y0c));
  std::get<1>(model.blocks).forward(y0c, y1.ref());
  std::get<2>(model.blocks).forward(tensor_ref<const float, shape<dyn, hidden1>>(y1.data(), rows), logits.ref());
  if (model.layer<2>().rng.offset != offsets[0] || model.layer<5>().rng.offset != offsets[1])
    throw std::logic_error("sketched_train: the CPU blocks drew other streams");
  // Blocks of rows, as the launchers' hidden: each group's h, then its output.
  forward_result r;
  append(r.hidden, hx0, rows * h0);
  append(r.hidden, y0, rows * hidden0);
  append(r.hidden, hx1, rows * h1);
  append(r.hidden, y1, rows * hidden1);
  append(r.logits, logits, rows * classes);
  return r;
}

block_result first_block(const std::vector<float>& x, const std::vector<float>& dy, std::size_t rows, std::uint64_t seed,
                         std::uint64_t offset) {
  ::sketched_mlp model(model_seed);
  auto& block = std::get<0>(model.blocks);
  auto& layer = model.layer<0>();
  model.layer<2>().rng = {seed, offset - 1};
  tensor<float, shape<dyn, features>> xt(rows), dx(rows);
  tensor<float, shape<dyn, hidden0>> y(rows), dyt(rows);
  std::memcpy(xt.data(), x.data(), rows * features * sizeof(float));
  std::memcpy(dyt.data(), dy.data(), rows * hidden0 * sizeof(float));
  block.train();
  block.forward(xt, y);
  block.backward(xt, y, dyt, dx);
  block_result r;
  append(r.s1, layer.s1, layer.s1.size());
  append(r.s2, layer.s2, layer.s2.size());
  append(r.b, layer.bias, layer.bias.size());
  r.sketch_seed = layer.sketch_seed;
  append(r.y, y, y.size());
  append(r.dx, dx, dx.size());
  append(r.ds1, layer.s1_grad, layer.s1_grad.size());
  append(r.ds2, layer.s2_grad, layer.s2_grad.size());
  append(r.db, layer.bias_grad, layer.bias_grad.size());
  return r;
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
  throw std::logic_error("sketched_train: no dropout of that width");
}

std::vector<float> schedule(std::int64_t steps) {
  const auto s = optim::warmup_cosine_lr(2e-3, steps / 20 + 1, steps, 0.1);
  std::vector<float> lr;
  for (std::int64_t t = 0; t < steps; ++t) lr.push_back(float(s(t)));  // as optim::adamw::set_lr takes it
  return lr;
}

double accuracy(const std::vector<float>& params, const std::vector<float>& x, const std::vector<std::int32_t>& y) {
  ::sketched_mlp model(model_seed);
  load(model, params);
  model.eval();
  return nn::accuracy(model.forward(X(x.data(), y.size())), y);
}

}  // namespace solder::test::sketched_train
