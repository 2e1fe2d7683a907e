// tests/cuda/linear_chain.host.cpp: the CPU side of linear_chain.cu: kernels/chains.hpp's
// linear_relu_dropout chain forward and backward, compiled by the C++ compiler.
#include "linear_chain.hpp"

#include <cstring>
#include <stdexcept>

#include "chains.hpp"
#include "solder/solder.hpp"

namespace solder::test::linear_chain {

reference run(const std::vector<float>& x, const std::vector<float>& dy, std::size_t batch, std::uint64_t seed,
              std::uint64_t offset) {
  using X = tensor<float, shape<dyn, in>>;
  using Y = tensor<float, shape<dyn, out>>;
  ::linear_relu_dropout model(7);
  // A training forward moves the dropout's stream on before drawing: it then draws (seed, offset).
  model.layer<2>().rng = {seed, offset - 1};
  X xt(batch), dx(batch);
  Y dyt(batch);
  std::memcpy(xt.data(), x.data(), x.size() * sizeof(float));
  std::memcpy(dyt.data(), dy.data(), dy.size() * sizeof(float));
  const Y y = model.forward(xt);
  if (model.layer<2>().rng.offset != offset) throw std::logic_error("linear_chain: the dropout drew another stream");
  model.backward(dyt.ref());
  std::get<0>(model.blocks).backward(xt, y, dyt, dx);

  reference r;
  const auto& linear = model.layer<0>();
  r.w.assign(linear.weight.data(), linear.weight.data() + out * in);
  r.b.assign(linear.bias.data(), linear.bias.data() + out);
  r.y.assign(y.data(), y.data() + batch * out);
  r.dx.assign(dx.data(), dx.data() + batch * in);
  r.dw.assign(linear.weight_grad.data(), linear.weight_grad.data() + out * in);
  r.db.assign(linear.bias_grad.data(), linear.bias_grad.data() + out);

  // The mask alone: the same dropout layer on ones, with the stream the forward drew.
  nn::dropout<0.1f> drop;
  drop.rng = {seed, offset};
  r.scale = drop.scale();
  Y ones(batch), mask(batch);
  for (std::size_t i = 0; i < ones.size(); ++i) ones.data()[i] = 1.0f;
  assign(mask, drop.apply<nn::mode::train>(ones.ref()));
  r.keep.resize(batch * out);
  for (std::size_t i = 0; i < r.keep.size(); ++i) r.keep[i] = mask.data()[i] != 0.0f;
  return r;
}

}  // namespace solder::test::linear_chain
