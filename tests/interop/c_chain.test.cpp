// tests/interop/c_chain.test.cpp: interop::c_chain, what solder-gen's C functions call, over
// chains in host memory: every member against the chain's own (the same bits: the same code
// runs), the optimizer kept from step to step and started afresh as torch's would be, and what
// it refuses (a bad label, kind or setting) refused before anything moves.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "solder/interop/c_chain.hpp"
#include "solder/solder.hpp"
#include "support/data.hpp"

namespace {

using namespace solder;
using mlp = nn::chain<nn::linear<16, 24>, nn::relu, nn::dropout<0.2f>, nn::linear<24, 5>>;
using cnn = nn::chain<nn::input<2, 6, 6>, nn::conv2d<2, 3, 3, 3, 1, 1>, nn::batch_norm<3>, nn::relu, nn::flatten<>,
                      nn::linear<108, 5>>;
constexpr std::size_t batch = 9;

template <class Chain>
std::vector<float> flat(Chain& model) {
  std::vector<float> out;
  for (const auto& p : model.params()) out.insert(out.end(), p.value.data(), p.value.data() + p.value.size());
  return out;
}
template <class Chain>
std::vector<float> flat_grads(Chain& model) {
  std::vector<float> out;
  for (const auto& p : model.params()) out.insert(out.end(), p.grad.data(), p.grad.data() + p.grad.size());
  return out;
}

template <class Chain>
struct batch_data {
  std::vector<float> x = std::vector<float>(batch * Chain::in_features);
  std::vector<std::int32_t> labels = std::vector<std::int32_t>(batch);
  batch_data() {
    test::fill_uniform(x, -1.0, 1.0, 3);
    for (std::size_t r = 0; r < batch; ++r) labels[r] = std::int32_t((r * 2 + 1) % Chain::out_features);
  }
  typename Chain::input_ref input() const { return typename Chain::input_ref(x.data(), batch); }
};

interop::optimizer_settings sgd(float lr, float momentum) {
  interop::optimizer_settings s;
  s.kind = interop::optimizer_settings::sgd;
  s.lr = lr;
  s.momentum = momentum;
  return s;
}
interop::optimizer_settings adamw(float lr) {
  interop::optimizer_settings s;
  s.kind = interop::optimizer_settings::adamw;
  s.lr = lr;
  s.weight_decay = 0.01f;
  return s;
}

}  // namespace

TEST_CASE("c_chain: parameters, forward and backward are the chain's", "[interop]") {
  const batch_data<mlp> d;
  interop::c_chain<mlp> c(7);
  mlp ref(7);
  std::vector<float> params(c.param_floats());
  c.read_params(params.data());
  CHECK(params == flat(ref));
  REQUIRE(c.tensors().size() == 4);
  CHECK(std::string(c.tensors()[2].name) == "3.weight");
  CHECK(c.tensors()[2].floats == 5 * 24);
  CHECK(c.tensors()[0].value == c.model.params()[0].value.data());

  std::vector<float> y(batch * 5), dy(batch * 5);
  test::fill_uniform(dy, -1.0, 1.0, 4);
  c.forward(d.x.data(), y.data(), batch);
  const auto yr = ref.forward(d.input());
  CHECK(std::vector<float>(yr.data(), yr.data() + yr.size()) == y);  // training mode: the same masks
  c.backward(dy.data(), batch);
  ref.backward(typename mlp::output_ref(dy.data(), batch));
  std::vector<float> grads(c.param_floats());
  c.read_grads(grads.data());
  CHECK(grads == flat_grads(ref));

  // Parameters written from host memory are the ones the next forward uses.
  for (float& v : params) v *= 0.5f;
  c.write_params(params.data());
  std::vector<float> back(params.size());
  c.read_params(back.data());
  CHECK(back == params);
  c.model.eval();
  ref.eval();
  std::size_t at = 0;
  for (auto& p : ref.params()) {
    std::memcpy(p.value.data(), params.data() + at, p.value.size() * sizeof(float));
    at += p.value.size();
  }
  ref.parameters_changed();
  c.forward(d.x.data(), y.data(), batch);
  const auto ye = ref.forward(d.input());
  CHECK(std::vector<float>(ye.data(), ye.data() + ye.size()) == y);
  CHECK_THROWS_WITH(c.forward(d.x.data(), y.data(), 0), Catch::Contains("batch must be at least 1"));
}

TEST_CASE("c_chain: train steps keep the optimizer's state, as torch's optimizer does", "[interop]") {
  const batch_data<mlp> d;
  interop::c_chain<mlp> c(11);
  mlp ref(11);
  optim::sgd opt(ref.params(), {.lr = 0.1f, .momentum = 0.9f});
  for (int step = 1; step <= 3; ++step) {
    const auto r = c.train_step(d.x.data(), d.labels.data(), batch, sgd(0.1f, 0.9f), 0.1f);
    const float want = ref.train_step(d.input(), std::span<const std::int32_t>(d.labels), opt,
                                      nn::cross_entropy_loss{0.1f});
    CHECK(r.loss == want);
    CHECK(r.steps == step);
  }
  std::vector<float> params(c.param_floats());
  c.read_params(params.data());
  CHECK(params == flat(ref));

  // Another kind starts afresh: AdamW's first step, as a new optim::adamw.
  optim::adamw fresh(ref.params(), {.lr = 1e-3f, .weight_decay = 0.01f});
  const auto r = c.train_step(d.x.data(), d.labels.data(), batch, adamw(1e-3f), 0.0f);
  CHECK(r.steps == 1);
  CHECK(r.loss == ref.train_step(d.input(), std::span<const std::int32_t>(d.labels), fresh));
  c.read_params(params.data());
  CHECK(params == flat(ref));
  // A changed learning rate is taken, the state kept.
  fresh.set_lr(5e-4f);
  CHECK(c.train_step(d.x.data(), d.labels.data(), batch, adamw(5e-4f), 0.0f).steps == 2);
  ref.train_step(d.input(), std::span<const std::int32_t>(d.labels), fresh);
  c.read_params(params.data());
  CHECK(params == flat(ref));
  // SGD without momentum after SGD with it: buffers made anew; reset_optimizer forgets.
  CHECK(c.optimizer_step(sgd(0.1f, 0.9f)) == 1);
  CHECK(c.optimizer_step(sgd(0.1f, 0.0f)) == 1);
  CHECK(c.optimizer_step(sgd(0.2f, 0.0f)) == 2);
  c.reset_optimizer();
  CHECK(c.optimizer_step(sgd(0.2f, 0.0f)) == 1);
}

TEST_CASE("c_chain: what it refuses changes nothing", "[interop]") {
  batch_data<mlp> d;
  interop::c_chain<mlp> c(5), twin(5);
  std::vector<float> before(c.param_floats()), after(c.param_floats());
  c.read_params(before.data());
  auto bad_kind = sgd(0.1f, 0.0f);
  bad_kind.kind = 7;
  CHECK_THROWS_WITH(c.train_step(d.x.data(), d.labels.data(), batch, bad_kind, 0.0f),
                    Catch::Contains("optimizer kind 7"));
  CHECK_THROWS(c.train_step(d.x.data(), d.labels.data(), batch, sgd(-1.0f, 0.0f), 0.0f));
  CHECK_THROWS(c.optimizer_step(adamw(-1.0f)));
  d.labels[4] = 5;
  CHECK_THROWS_WITH(c.train_step(d.x.data(), d.labels.data(), batch, sgd(0.1f, 0.0f), 0.0f),
                    Catch::Contains("label 5 of row 4"));
  d.labels[4] = -1;
  CHECK_THROWS_WITH(c.loss_and_backward(d.x.data(), d.labels.data(), batch, 0.0f), Catch::Contains("label -1 of row 4"));
  d.labels[4] = 0;
  CHECK_THROWS_WITH(c.loss_and_backward(d.x.data(), d.labels.data(), batch, 1.5f),
                    Catch::Contains("label_smoothing must be in [0, 1]"));
  c.read_params(after.data());
  CHECK(after == before);
  // Nothing moved: the next step is the one a model that saw none of this takes (the same
  // dropout masks).
  d.labels[4] = 0;
  CHECK(c.train_step(d.x.data(), d.labels.data(), batch, sgd(0.1f, 0.0f), 0.0f).loss ==
        twin.train_step(d.x.data(), d.labels.data(), batch, sgd(0.1f, 0.0f), 0.0f).loss);
}

TEST_CASE("c_chain: a CNN's buffers (batch_norm's running statistics) to and from host memory", "[interop]") {
  const batch_data<cnn> d;
  interop::c_chain<cnn> c(3);
  cnn ref(3);
  optim::sgd opt(ref.params(), {.lr = 0.05f});
  c.train_step(d.x.data(), d.labels.data(), batch, sgd(0.05f, 0.0f), 0.0f);
  ref.train_step(d.input(), std::span<const std::int32_t>(d.labels), opt);
  REQUIRE(c.buffer_floats() == 6);
  std::vector<float> buffers(6);
  c.read_buffers(buffers.data());
  const auto& norm = ref.layer<1>();
  CHECK(std::vector<float>(buffers.begin(), buffers.begin() + 3) ==
        std::vector<float>(norm.running_mean.data(), norm.running_mean.data() + 3));
  CHECK(std::vector<float>(buffers.begin() + 3, buffers.end()) ==
        std::vector<float>(norm.running_var.data(), norm.running_var.data() + 3));
  // Written statistics fold into the evaluation forward.
  const std::vector<float> stats{0.5f, -0.25f, 1.0f, 2.0f, 0.5f, 1.5f};
  c.write_buffers(stats.data());
  std::memcpy(ref.layer<1>().running_mean.data(), stats.data(), 3 * sizeof(float));
  std::memcpy(ref.layer<1>().running_var.data(), stats.data() + 3, 3 * sizeof(float));
  ref.parameters_changed();
  c.model.eval();
  ref.eval();
  std::vector<float> y(batch * 5);
  c.forward(d.x.data(), y.data(), batch);
  const auto yr = ref.forward(d.input());
  CHECK(std::vector<float>(yr.data(), yr.data() + yr.size()) == y);
}
