// tests/support/chain_gradients.hpp: a whole chain's parameter gradients against central finite
// differences of the loss sum(r * model(x)).
#pragma once

#include <cstddef>
#include <vector>

#include <catch2/catch.hpp>

namespace solder::test {

/// How the differences are taken: every `stride`-th value of each parameter, moved by +-h,
/// compared with Approx(fd).margin(margin).epsilon(epsilon).
struct difference_check {
  std::size_t stride;
  float h;
  double margin, epsilon;
};

/// Runs forward and backward for dL/dy = r, then checks each parameter's gradient against the
/// central difference of L = sum(r * model(x)) (forward in double over the float outputs).
template <class Model, class X, class R>
void check_chain_gradients(Model& model, const X& x, const R& r, const difference_check& c) {
  auto loss = [&] {
    const auto y = model.forward(x);
    double L = 0;
    for (std::size_t i = 0; i < y.size(); ++i) L += double(r.data()[i]) * double(y.data()[i]);
    return L;
  };
  loss();
  model.backward(r);
  std::vector<std::vector<float>> grads;
  auto params = model.params();
  for (auto& p : params) grads.emplace_back(p.grad.begin(), p.grad.end());
  for (std::size_t k = 0; k < params.size(); ++k)
    for (std::size_t i = 0; i < params[k].value.size(); i += c.stride) {
      float& w = params[k].value[i];
      const float w0 = w;
      w = w0 + c.h;
      model.parameters_changed();
      const double lp = loss();
      w = w0 - c.h;
      model.parameters_changed();
      const double lm = loss();
      w = w0;
      model.parameters_changed();
      const double fd = (lp - lm) / (2.0 * double(c.h));
      INFO(params[k].name << "[" << i << "]");
      CHECK(grads[k][i] == Approx(fd).margin(c.margin).epsilon(c.epsilon));
    }
}

}  // namespace solder::test
