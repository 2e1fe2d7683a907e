// tests/optim/state.test.cpp: the optimizers' state as checkpoints see it: state() names and
// shapes (torch's state_dict names), restore_state + set_steps + set_hyperparameters giving an
// optimizer that continues bit for bit as the one it was copied from, and the errors of
// restoring, each leaving the optimizer unchanged.
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/optim/adam.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/optim/sgd.hpp"
#include "support/data.hpp"

namespace {

using Catch::Matchers::Contains;
using solder::dyn;
using solder::shape;
using solder::tensor;
using solder::test::bit_differences;
namespace optim = solder::optim;

/// Weights and gradients of 3, 37 and 257 elements (vector tails) and a [4, 5] matrix.
struct net {
  tensor<float, shape<dyn>> w0{3}, w1{37}, w2{257}, g0{3}, g1{37}, g2{257};
  tensor<float, shape<4, 5>> w3, g3;
  std::vector<optim::param> params;
  explicit net(std::uint32_t seed) {
    solder::test::fill_uniform(w0, -1, 1, seed);
    solder::test::fill_uniform(w1, -1, 1, seed + 1);
    solder::test::fill_uniform(w2, -1, 1, seed + 2);
    solder::test::fill_uniform(w3, -1, 1, seed + 3);
    params = {optim::make_param("a", w0, g0), optim::make_param("b", w1, g1), optim::make_param("c", w2, g2),
              optim::make_param("d", w3, g3)};
  }
  /// Gradients of step t, the same for every net.
  void gradients(std::uint32_t t) {
    std::uint32_t s = 1000 + 10 * t;
    for (optim::param& p : params) solder::test::fill_uniform(p.grad, -1, 1, s++);
  }
  std::vector<float> weights() const {
    std::vector<float> out;
    for (const optim::param& p : params) out.insert(out.end(), p.value.begin(), p.value.end());
    return out;
  }
};

template <class Opt>
std::vector<float> state_values(Opt& opt) {
  std::vector<float> out;
  for (const optim::state_tensor& s : opt.state()) out.insert(out.end(), s.value.begin(), s.value.end());
  return out;
}

/// The state of `from` as restore_state takes it (views of from's buffers).
template <class Opt>
std::vector<optim::saved_state> saved_from(Opt& from) {
  std::vector<optim::saved_state> out;
  for (const optim::state_tensor& s : from.state()) out.push_back({s.name, std::span<const float>(s.value.data(), s.value.size())});
  return out;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && bit_differences(a.data(), b.data(), a.size()) == 0;
}

/// Runs `a` 3 steps, copies weights, state, steps and hyperparameters into `b` (built with
/// other hyperparameters over other weights), then both run 4 more: the same bits throughout.
template <class Opt>
void check_continues(const typename Opt::options& saved_options, const typename Opt::options& other_options) {
  net na(1), nb(50);
  Opt a(na.params, saved_options), b(nb.params, other_options);
  for (std::uint32_t t = 0; t < 3; ++t) {
    na.gradients(t);
    a.step();
  }
  for (std::size_t k = 0; k < na.params.size(); ++k)
    std::memcpy(nb.params[k].value.data(), na.params[k].value.data(), na.params[k].value.size() * sizeof(float));
  b.set_hyperparameters(a.hyperparameters());
  optim::restore_state(b, saved_from(a), a.steps());
  CHECK(b.steps() == 3);
  CHECK(same(state_values(a), state_values(b)));
  for (std::uint32_t t = 3; t < 7; ++t) {
    na.gradients(t);
    nb.gradients(t);
    a.step();
    b.step();
  }
  CHECK(same(na.weights(), nb.weights()));
  CHECK(same(state_values(a), state_values(b)));
}

}  // namespace

TEST_CASE("optim state: names and shapes follow torch's state_dict", "[optim]") {
  net n(3);
  optim::adamw adamw(n.params);
  const auto s = adamw.state();
  REQUIRE(s.size() == 8);
  CHECK(s[0].name == "state.0.exp_avg");
  CHECK(s[1].name == "state.0.exp_avg_sq");
  CHECK(s[7].name == "state.3.exp_avg_sq");
  CHECK(s[6].dims == std::vector<std::size_t>{4, 5});
  CHECK(s[2].value.size() == 37);
  CHECK(s[0].value.data() == adamw.exp_avg(0).data());  // views of the optimizer's own buffers
  CHECK(s[1].value.data() == adamw.exp_avg_sq(0).data());
  optim::sgd momentum(n.params, {.lr = 0.1f, .momentum = 0.9f});
  const auto m = momentum.state();
  REQUIRE(m.size() == 4);
  CHECK(m[3].name == "state.3.momentum_buffer");
  CHECK(m[3].dims == std::vector<std::size_t>{4, 5});
  CHECK(m[1].value.data() == momentum.momentum_buffer(1).data());
  optim::sgd plain(n.params, {.lr = 0.1f});
  CHECK(plain.state().empty());  // torch keeps no momentum buffer without momentum either
  CHECK(optim::sgd::kind == "sgd");
  CHECK(optim::adam::kind == "adam");
  CHECK(optim::adamw::kind == "adamw");
}

TEST_CASE("optim state: a restored optimizer continues bit for bit", "[optim]") {
  SECTION("adamw") {
    check_continues<optim::adamw>({.lr = 3e-3f, .beta1 = 0.8f, .weight_decay = 0.05f}, {.lr = 1e-1f});
  }
  SECTION("adam") {
    check_continues<optim::adam>({.lr = 2e-3f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 1e-3f}, {});
  }
  SECTION("sgd, Nesterov momentum") {
    check_continues<optim::sgd>({.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f, .nesterov = true},
                                {.lr = 0.5f, .momentum = 0.3f});
  }
  SECTION("sgd, momentum with dampening") {
    check_continues<optim::sgd>({.lr = 0.05f, .momentum = 0.7f, .dampening = 0.25f}, {.lr = 0.1f, .momentum = 0.1f});
  }
  SECTION("sgd without momentum") {
    check_continues<optim::sgd>({.lr = 0.05f, .weight_decay = 1e-2f}, {.lr = 0.2f});
  }
}

TEST_CASE("optim state: bad state, steps or hyperparameters are errors that change nothing", "[optim]") {
  net na(1), nb(2);
  optim::adamw a(na.params), b(nb.params);
  for (std::uint32_t t = 0; t < 2; ++t) {
    na.gradients(t);
    nb.gradients(t + 7);
    a.step();
    b.step();
  }
  const std::vector<float> before = state_values(b);
  const auto unchanged = [&] {
    CHECK(same(state_values(b), before));
    CHECK(b.steps() == 2);
    CHECK(b.hyperparameters().lr == 1e-3f);
  };
  std::vector<optim::saved_state> saved = saved_from(a);

  SECTION("a tensor missing") {
    saved.pop_back();
    CHECK_THROWS_WITH(optim::restore_state(b, saved, 5), Contains("state tensor 'state.3.exp_avg_sq' is missing"));
  }
  SECTION("a tensor of another size") {
    saved[2].values = saved[2].values.first(36);
    CHECK_THROWS_WITH(optim::restore_state(b, saved, 5),
                      Contains("state tensor 'state.1.exp_avg' has 36 elements; the optimizer's has 37"));
  }
  SECTION("a tensor the optimizer does not have") {
    saved.push_back({"state.0.momentum_buffer", saved[0].values});
    CHECK_THROWS_WITH(optim::restore_state(b, saved, 5), Contains("no state tensor 'state.0.momentum_buffer'"));
  }
  SECTION("a tensor given twice") {
    saved.push_back(saved[1]);
    CHECK_THROWS_WITH(optim::restore_state(b, saved, 5), Contains("'state.0.exp_avg_sq' is given twice"));
  }
  SECTION("a negative step count") {
    CHECK_THROWS_WITH(optim::restore_state(b, saved, -1), Contains("step count must be >= 0, got -1"));
    CHECK_THROWS_WITH(b.set_steps(-3), Contains("solder::optim::adamw::set_steps"));
  }
  SECTION("refused hyperparameters") {
    CHECK_THROWS_WITH(b.set_hyperparameters({.lr = -1.0f}), Contains("lr must be >= 0"));
    CHECK_THROWS_WITH(b.set_hyperparameters({.beta1 = 1.0f}), Contains("beta1 must be in [0, 1)"));
  }
  unchanged();
}

TEST_CASE("optim state: sgd's momentum cannot change between zero and non-zero", "[optim]") {
  net n(4);
  optim::sgd with(n.params, {.lr = 0.1f, .momentum = 0.9f}), without(n.params, {.lr = 0.1f});
  CHECK_THROWS_WITH(with.set_hyperparameters({.lr = 0.1f}), Contains("momentum is non-zero; it cannot become 0"));
  CHECK_THROWS_WITH(without.set_hyperparameters({.lr = 0.1f, .momentum = 0.5f}),
                    Contains("momentum is 0; it cannot become non-zero"));
  CHECK_THROWS_WITH(with.set_hyperparameters({.lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f, .nesterov = true}),
                    Contains("Nesterov"));
  CHECK(with.hyperparameters().momentum == 0.9f);
  CHECK(without.hyperparameters().momentum == 0.0f);
  with.set_hyperparameters({.lr = 0.01f, .momentum = 0.5f, .nesterov = true});
  CHECK(with.lr() == 0.01f);
  CHECK(with.hyperparameters().nesterov);
  CHECK_THROWS_WITH(with.set_steps(-1), Contains("solder::optim::sgd::set_steps: the step count must be >= 0, got -1"));
}
