// tests/cuda/blocks.host.cpp: the CPU side of blocks.cu: the blocks in host memory, compiled by
// the C++ compiler.
#include "blocks.hpp"

#include <cstring>

#include "solder/solder.hpp"

namespace solder::test::blocks {

namespace {

template <class Block>
result run(const std::vector<float>& x, const std::vector<float>& dy) {
  constexpr std::size_t in = Block::in_features, out = Block::out_features;
  using X = tensor<float, shape<dyn, in>>;
  using Y = tensor<float, shape<dyn, out>>;
  Block b;
  b.reset(seed, 0);
  result r;
  r.w0.assign(b.linear.weight.data(), b.linear.weight.data() + out * in);
  r.b0.assign(b.linear.bias.data(), b.linear.bias.data() + out);

  X xt(batch), dx(batch);
  Y y(batch), dyt(batch), y_eval(batch);
  std::memcpy(xt.data(), x.data(), x.size() * sizeof(float));
  std::memcpy(dyt.data(), dy.data(), dy.size() * sizeof(float));
  b.forward(xt, y);
  b.backward(xt, y, dyt, dx);
  r.y.assign(y.data(), y.data() + y.size());
  r.dx.assign(dx.data(), dx.data() + dx.size());
  r.dw.assign(b.linear.weight_grad.data(), b.linear.weight_grad.data() + out * in);
  r.db.assign(b.linear.bias_grad.data(), b.linear.bias_grad.data() + out);

  const std::vector<optim::param> params = b.params_from(0);
  r.norm = optim::clip_grad_norm(params, 1e30f);
  optim::adamw opt(params, {.lr = 1e-2f});
  opt.step();
  r.w1.assign(b.linear.weight.data(), b.linear.weight.data() + out * in);
  r.b1.assign(b.linear.bias.data(), b.linear.bias.data() + out);

  b.eval();
  b.pack_weights();
  b.forward(xt, y_eval);
  r.y_eval.assign(y_eval.data(), y_eval.data() + y_eval.size());
  return r;
}

}  // namespace

rows_result host_rows(const std::vector<float>& x, const std::vector<std::int32_t>& labels, const std::vector<float>& dy) {
  using T = tensor<float, shape<dyn, classes>>;
  T xt(batch), dyt(batch), g(batch), y(batch), dx(batch), s(batch);
  std::memcpy(xt.data(), x.data(), x.size() * sizeof(float));
  std::memcpy(dyt.data(), dy.data(), dy.size() * sizeof(float));
  rows_result r;
  r.loss = nn::softmax_cross_entropy(xt, labels, g, 0.1f);
  nn::log_softmax<classes> log_softmax;
  log_softmax.forward(xt, y);
  log_softmax.backward(xt, y, dyt, dx);
  nn::softmax<classes>{}.forward(xt, s);
  nn::layer_norm<classes> norm;
  for (std::size_t j = 0; j < classes; ++j) {
    norm.weight[j] = 1.0f + float(j) / 10.0f;
    norm.bias[j] = float(j) / 20.0f;
  }
  T ny(batch), ndx(batch);
  norm.forward(xt, ny);
  norm.backward(xt, ny, dyt, ndx);
  r.norm_y.assign(ny.data(), ny.data() + ny.size());
  r.norm_dx.assign(ndx.data(), ndx.data() + ndx.size());
  r.norm_dw.assign(norm.weight_grad.data(), norm.weight_grad.data() + classes);
  r.norm_db.assign(norm.bias_grad.data(), norm.bias_grad.data() + classes);
  r.dlogits.assign(g.data(), g.data() + g.size());
  r.log_y.assign(y.data(), y.data() + y.size());
  r.log_dx.assign(dx.data(), dx.data() + dx.size());
  r.soft_y.assign(s.data(), s.data() + s.size());
  return r;
}

namespace {

template <class Model>
chain_result train_chain(const std::vector<float>& x, const std::vector<std::int32_t>& labels) {
  Model model(chain_seed);
  auto flat = [&] {
    std::vector<float> out;
    for (const optim::param& p : model.params()) out.insert(out.end(), p.value.data(), p.value.data() + p.value.size());
    return out;
  };
  chain_result r;
  r.initial = flat();
  tensor<float, shape<dyn, chain_in>> xt(batch);
  std::memcpy(xt.data(), x.data(), x.size() * sizeof(float));
  optim::sgd opt(model.params(), {.lr = 0.05f, .momentum = 0.9f});
  const tensor_ref<const float, shape<dyn, chain_in>> xv(xt.ref());  // [batch, 64] for any input shape
  r.loss1 = model.train_step(xv, labels, opt);
  r.loss2 = model.train_step(xv, labels, opt);
  r.trained = flat();
  model.eval();
  const auto logits = model.forward(xt);
  r.logits.assign(logits.data(), logits.data() + logits.size());
  return r;
}

}  // namespace

chain_result host_chain(const std::vector<float>& x, const std::vector<std::int32_t>& labels) {
  return train_chain<nn::chain<nn::linear<chain_in, 32>, nn::relu, nn::dropout<0.1f>, nn::linear<32, 16>, nn::gelu,
                               nn::linear<16, chain_out>>>(x, labels);
}
chain_result host_image_chain(const std::vector<float>& x, const std::vector<std::int32_t>& labels) {
  return train_chain<nn::chain<nn::input<4, 4, 4>, nn::max_pool2d<2>, nn::flatten<>, nn::linear<16, 32>, nn::relu,
                               nn::layer_norm<32>, nn::linear<32, chain_out>, nn::log_softmax<chain_out>>>(x, labels);
}

chain_result host_cnn_chain(const std::vector<float>& x, const std::vector<std::int32_t>& labels) {
  return train_chain<nn::chain<nn::input<4, 4, 4>, nn::conv2d<4, 8, 3, 3, 1, 1>, nn::batch_norm<8>, nn::relu,
                               nn::max_pool2d<2>, nn::flatten<>, nn::linear<32, chain_out>>>(x, labels);
}

pool_result host_pool(const std::vector<float>& x, const std::vector<float>& dy_max, const std::vector<float>& dy_avg) {
  using X = tensor<float, shape<dyn, 4, 8, 8>>;
  X xt(batch), dx(batch), y_avg(batch), dy_a(batch);
  tensor<float, shape<dyn, 4, 4, 4>> y_max(batch), dy_m(batch);
  std::memcpy(xt.data(), x.data(), x.size() * sizeof(float));
  std::memcpy(dy_m.data(), dy_max.data(), dy_max.size() * sizeof(float));
  std::memcpy(dy_a.data(), dy_avg.data(), dy_avg.size() * sizeof(float));
  pool_result r;
  nn::max_pool2d<2> max_pool;
  max_pool.forward(xt, y_max);
  max_pool.backward(xt, y_max, dy_m, dx);
  r.max_y.assign(y_max.data(), y_max.data() + y_max.size());
  r.max_dx.assign(dx.data(), dx.data() + dx.size());
  nn::avg_pool2d<3, 1, 1> avg_pool;
  avg_pool.forward(xt, y_avg);
  avg_pool.backward(xt, y_avg, dy_a, dx);
  r.avg_y.assign(y_avg.data(), y_avg.data() + y_avg.size());
  r.avg_dx.assign(dx.data(), dx.data() + dx.size());
  return r;
}

chain_result host_sketched_chain(const std::vector<float>& x, const std::vector<std::int32_t>& labels) {
  return train_chain<nn::chain<nn::sketched_linear<chain_in, 48, 2, 4>, nn::relu, nn::dropout<0.1f>,
                               nn::linear<48, chain_out>>>(x, labels);
}

result host_run(int kind, const std::vector<float>& x, const std::vector<float>& dy) {
  if (kind == 0) return run<nn::linear_block<nn::linear<48, 40>, nn::gelu, nn::dropout<0.25f>>>(x, dy);
  return run<nn::linear_block<nn::linear<64, 32>, nn::relu, nn::dropout<0.1f>>>(x, dy);
}

}  // namespace solder::test::blocks
