// tests/nn/chain_shapes.test.cpp: per-sample shapes through a chain: the shapes the planner
// computes (nn::input, shape-preserving layers, flatten), the summary that prints them, and a
// chain over images against the same layers run by hand on the flat data.
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>

#include <catch2/catch.hpp>

#include "solder/cost.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/flatten.hpp"
#include "support/data.hpp"

namespace {

using namespace solder;
using nn::sample_shape;

using image_mlp = nn::chain<nn::input<3, 4, 5>, nn::relu, nn::dropout<0.25f>, nn::flatten<>, nn::linear<60, 10>>;
using W = image_mlp::widths;
static_assert(image_mlp::input_shape == sample_shape(3, 4, 5));
static_assert(image_mlp::in_features == 60 && image_mlp::out_features == 10);
static_assert(W::shapes[0] == sample_shape(3, 4, 5) && W::shapes[1] == sample_shape(3, 4, 5));
static_assert(W::shapes[2] == sample_shape(60) && W::shapes[3] == sample_shape(10));
static_assert(std::is_same_v<image_mlp::input_ref, tensor_ref<const float, shape<dyn, 3, 4, 5>>>);
static_assert(std::is_same_v<image_mlp::output_tensor, tensor<float, shape<dyn, 10>>>);
static_assert(image_mlp::kernels == 3);  // relu+dropout, flatten, linear
// The activations kept per sample: each kernel's output.
static_assert(cost<image_mlp>::activation_floats == 60 + 60 + 10);

// An MLP's shapes are what they were: features, rank 1, the input fixed by its first layer
// (here after two shape-preserving layers), and nn::input<N> says the same.
using mlp = nn::chain<nn::relu, nn::tanh, nn::linear<7, 3>>;
static_assert(mlp::input_shape == sample_shape(7) && mlp::output_shape == sample_shape(3));
static_assert(std::is_same_v<mlp::input_ref, tensor_ref<const float, shape<dyn, 7>>>);
static_assert(std::is_same_v<nn::chain<nn::input<7>, nn::relu, nn::tanh, nn::linear<7, 3>>::input_ref, mlp::input_ref>);
// flatten with its extents takes the image or its flat features.
static_assert(nn::chain<nn::input<60>, nn::flatten<3, 4, 5>, nn::linear<60, 2>>::in_features == 60);
static_assert(nn::chain<nn::input<3, 4, 5>, nn::flatten<3, 4, 5>, nn::linear<60, 2>>::in_features == 60);

TEST_CASE("chain shapes: the summary prints each layer's sample shape", "[chain][shape]") {
  std::ostringstream s;
  s << summary<image_mlp>{};
  CHECK(s.str().find("[-1, 3, 4, 5]") != std::string::npos);
  CHECK(s.str().find("[-1, 60]") != std::string::npos);
  CHECK(s.str().find("[-1, 10]") != std::string::npos);
}

TEST_CASE("chain shapes: a chain over images equals its layers run by hand on the flat data", "[chain][shape]") {
  image_mlp model(5);
  nn::chain<nn::linear<60, 10>> head(1);
  std::memcpy(head.layer<0>().weight.data(), model.layer<3>().weight.data(), 600 * sizeof(float));
  std::memcpy(head.layer<0>().bias.data(), model.layer<3>().bias.data(), 10 * sizeof(float));
  model.eval();  // dropout off: relu then the linear layer
  tensor<float, shape<dyn, 3, 4, 5>> x(6);
  solder::test::fill_uniform(x, -1, 1, 17);
  tensor<float, shape<dyn, 60>> rx(6);
  for (std::size_t i = 0; i < x.size(); ++i) rx.data()[i] = x.data()[i] > 0 ? x.data()[i] : 0.0f;
  const auto y = model.forward(x);
  const auto ref = head.forward(rx);
  CHECK(std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)) == 0);

  // A flat batch of as many features is the same input.
  const tensor<float, shape<dyn, 60>> flat(tensor_ref<const float, shape<dyn, 60>>(x.data(), 6));
  const auto y2 = model.forward(flat);
  CHECK(std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)) == 0);

  // Gradients: the linear layer's are the head's on relu(x).
  tensor<float, shape<dyn, 10>> dy(6);
  solder::test::fill_uniform(dy, -1, 1, 18);
  model.forward(x);
  model.backward(dy);
  head.backward(dy);
  CHECK(std::memcmp(model.layer<3>().weight_grad.data(), head.layer<0>().weight_grad.data(), 600 * sizeof(float)) == 0);
  CHECK(std::memcmp(model.layer<3>().bias_grad.data(), head.layer<0>().bias_grad.data(), 10 * sizeof(float)) == 0);

  // Training mode draws dropout masks over the image shape and trains.
  model.train();
  const auto yt = model.forward(x);
  CHECK(yt.batch() == 6);
}

}  // namespace
