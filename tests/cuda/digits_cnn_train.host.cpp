// tests/cuda/digits_cnn_train.host.cpp: the CPU side of digits_cnn_train.cu: kernels/chains.hpp's
// digits_cnn trained by the CPU chain, the example's data and schedule, the chain's blocks one by
// one and its second convolution block alone; compiled by the C++ compiler.
#include "digits_cnn_train.hpp"

#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <tuple>

#include "chains.hpp"
#include "solder/solder.hpp"

namespace solder::test::digits_cnn_train {

namespace {

using X = tensor_ref<const float, shape<dyn, features>>;
template <std::size_t... E>
using images = tensor<float, shape<dyn, E...>>;
template <std::size_t... E>
tensor_ref<const float, shape<dyn, E...>> cview(const images<E...>& t) {
  return tensor_ref<const float, shape<dyn, E...>>(t.data(), t.batch());
}

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

std::vector<float> running_of(::digits_cnn& model) {
  std::vector<float> out;
  for (const auto& b : model.buffers()) out.insert(out.end(), b.value.data(), b.value.data() + b.value.size());
  if (out.size() != running_floats) throw std::logic_error("digits_cnn_train: the chain has another buffer count");
  return out;
}

void load(::digits_cnn& model, const std::vector<float>& params, const std::vector<float>& running) {
  if (params.size() != param_floats || running.size() < running_floats)
    throw std::logic_error("digits_cnn_train: arrays of another size");
  std::size_t at = 0;
  for (const optim::param& p : model.params()) {
    std::memcpy(p.value.data(), params.data() + at, p.value.size() * sizeof(float));
    at += p.value.size();
  }
  at = 0;
  for (const auto& b : model.buffers()) {
    std::memcpy(b.value.data(), running.data() + at, b.value.size() * sizeof(float));
    at += b.value.size();
  }
  model.parameters_changed();
}

template <class T>
void append_at(std::vector<float>& out, std::size_t at, std::size_t rows, const T& t, std::size_t width) {
  std::memcpy(out.data() + rows * at, t.data(), rows * width * sizeof(float));
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
  ::digits_cnn model{model_seed};
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
std::vector<float> cpu_chain::running() const { return running_of(p_->model); }
std::vector<std::uint64_t> cpu_chain::seeds() const { return {p_->model.layer<8>().rng.seed}; }
std::vector<std::uint64_t> cpu_chain::offsets() const { return {p_->model.layer<8>().rng.offset}; }

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

forward_result forward(const std::vector<float>& params, const std::vector<float>& running, const float* x,
                       std::size_t rows, std::uint64_t seed, std::uint64_t offset) {
  ::digits_cnn model(model_seed);
  load(model, params, running);
  model.train();
  model.layer<8>().rng = {seed, offset - 1};  // a training forward moves it on, then draws (seed, offset)
  auto& [b0, b1, pool, flat, drop, linear] = model.blocks;
  const tensor_ref<const float, shape<dyn, 1, 8, 8>> xi(x, rows);
  images<16, 8, 8> z0(rows), y0(rows);
  images<32, 8, 8> z1(rows), y1(rows);
  images<32, 4, 4> p(rows);
  images<512> f(rows), d(rows);
  images<classes> logits(rows);
  b0.conv.forward(xi, z0.ref());  // z: the convolution alone, with its bias
  b0.forward(xi, y0.ref());
  b1.conv.forward(cview(y0), z1.ref());
  b1.forward(cview(y0), y1.ref());
  pool.forward(cview(y1), p.ref());
  flat.forward(cview(p), f.ref());
  drop.forward(cview(f), d.ref());
  linear.forward(cview(d), logits.ref());
  if (model.layer<8>().rng.offset != offset) throw std::logic_error("digits_cnn_train: the dropout drew another stream");
  forward_result r;
  r.hidden.assign(rows * hidden_floats, 0.0f);
  append_at(r.hidden, z0_at, rows, z0, 1024);
  append_at(r.hidden, y0_at, rows, y0, 1024);
  append_at(r.hidden, z1_at, rows, z1, 2048);
  append_at(r.hidden, y1_at, rows, y1, 2048);
  append_at(r.hidden, pool_at, rows, p, 512);
  append_at(r.hidden, dropout_at, rows, d, 512);
  r.logits.assign(logits.data(), logits.data() + rows * classes);
  r.running = running_of(model);
  return r;
}

block_result second_block(const std::vector<float>& x, const std::vector<float>& dy, std::size_t rows,
                          const std::vector<float>& bn_weight, const std::vector<float>& bn_bias) {
  ::digits_cnn model(model_seed);
  auto& block = std::get<1>(model.blocks);
  std::memcpy(block.norm.weight.data(), bn_weight.data(), 32 * sizeof(float));
  std::memcpy(block.norm.bias.data(), bn_bias.data(), 32 * sizeof(float));
  images<16, 8, 8> xt(rows), dx(rows);
  images<32, 8, 8> y(rows), dyt(rows), y_eval(rows);
  std::memcpy(xt.data(), x.data(), xt.size() * sizeof(float));
  std::memcpy(dyt.data(), dy.data(), dyt.size() * sizeof(float));
  block_result r;
  r.w.assign(block.conv.weight.begin(), block.conv.weight.end());
  r.b.assign(block.conv.bias.begin(), block.conv.bias.end());
  block.train();
  block.forward(xt, y);
  block.backward(xt, y, dyt, dx);
  r.y.assign(y.begin(), y.end());
  r.dx.assign(dx.begin(), dx.end());
  r.dw.assign(block.conv.weight_grad.begin(), block.conv.weight_grad.end());
  r.db.assign(block.conv.bias_grad.begin(), block.conv.bias_grad.end());
  r.dbn_weight.assign(block.norm.weight_grad.begin(), block.norm.weight_grad.end());
  r.dbn_bias.assign(block.norm.bias_grad.begin(), block.norm.bias_grad.end());
  r.running_mean.assign(block.norm.running_mean.begin(), block.norm.running_mean.end());
  r.running_var.assign(block.norm.running_var.begin(), block.norm.running_var.end());
  block.eval();
  block.pack_weights();
  block.forward(xt, y_eval);
  r.y_eval.assign(y_eval.begin(), y_eval.end());
  return r;
}

std::vector<unsigned char> dropout_mask(std::uint64_t seed, std::uint64_t offset, std::size_t rows) {
  nn::dropout<0.1f> drop;
  drop.rng = {seed, offset};
  images<512> ones(rows), mask(rows);
  for (std::size_t i = 0; i < ones.size(); ++i) ones.data()[i] = 1.0f;
  assign(mask, drop.apply<nn::mode::train>(ones.ref()));
  std::vector<unsigned char> keep(rows * 512);
  for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = mask.data()[i] != 0.0f;
  return keep;
}

std::vector<float> schedule(std::int64_t steps) {
  const auto s = optim::warmup_cosine_lr(3e-3, steps / 20 + 1, steps, 0.1);
  std::vector<float> lr;
  for (std::int64_t t = 0; t < steps; ++t) lr.push_back(float(s(t)));
  return lr;
}

double accuracy(const std::vector<float>& params, const std::vector<float>& running, const std::vector<float>& x,
                const std::vector<std::int32_t>& y) {
  ::digits_cnn model(model_seed);
  load(model, params, running);
  model.eval();
  return nn::accuracy(model.forward(X(x.data(), y.size())), y);
}

}  // namespace solder::test::digits_cnn_train
