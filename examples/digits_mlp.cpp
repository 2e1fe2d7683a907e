// examples/digits_mlp.cpp: train a 64 -> 256 -> 128 -> 10 MLP (ReLU, dropout 0.1) on the digits
// data set (examples/data/digits.csv: 1797 8x8 images, 10 classes) with AdamW and a warmup +
// cosine learning-rate schedule, then report the held-out accuracy.
//
// Every layer is an nn::dense: its linear product, ReLU and dropout run as ONE GEMM forward; its
// backward is one gate pass (from the saved output: no mask kept, none regenerated) and two
// GEMMs. Usage: digits_mlp [path/to/digits.csv] [epochs]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "solder/data/csv.hpp"
#include "solder/data/dataset.hpp"
#include "solder/nn/dense.hpp"
#include "solder/nn/loss.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/schedule.hpp"

#ifndef SOLDER_EXAMPLES_DATA
#define SOLDER_EXAMPLES_DATA "examples/data"
#endif

namespace {

using namespace solder;
using X = shape<dyn, 64>;

/// The model and the activations of one step, allocated once for the largest batch.
struct mlp {
  nn::dense<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>> l1{1};
  nn::dense<nn::linear<256, 128>, nn::relu, nn::dropout<0.1f>> l2{2};
  nn::dense<nn::linear<128, 10>> l3{3};
  std::size_t capacity;
  tensor<float, shape<dyn, 256>> h1, d1;
  tensor<float, shape<dyn, 128>> h2, d2;
  tensor<float, shape<dyn, 10>> logits, dlogits;

  explicit mlp(std::size_t max_batch)
      : capacity(max_batch), h1(max_batch), d1(max_batch), h2(max_batch), d2(max_batch), logits(max_batch), dlogits(max_batch) {
    // Each dropout its own Philox stream: the same seed would give both layers the same draws.
    l1.tail.layer<1>().rng.seed = 0xd1;
    l2.tail.layer<1>().rng.seed = 0xd2;
  }

  std::vector<optim::param> params() {
    return {optim::make_param("0.weight", l1.linear.weight, l1.linear.weight_grad),
            optim::make_param("0.bias", l1.linear.bias, l1.linear.bias_grad),
            optim::make_param("3.weight", l2.linear.weight, l2.linear.weight_grad),
            optim::make_param("3.bias", l2.linear.bias, l2.linear.bias_grad),
            optim::make_param("6.weight", l3.linear.weight, l3.linear.weight_grad),
            optim::make_param("6.bias", l3.linear.bias, l3.linear.bias_grad)};
  }
  void train() {
    l1.train();
    l2.train();
    l3.train();
  }
  void eval() {
    l1.eval();
    l2.eval();
    l3.eval();
  }

  template <std::size_t N>
  static tensor_ref<float, shape<dyn, N>> rows(tensor<float, shape<dyn, N>>& t, std::size_t n) {
    return tensor_ref<float, shape<dyn, N>>(t.data(), n);
  }
  template <std::size_t N>
  static tensor_ref<const float, shape<dyn, N>> crows(const tensor<float, shape<dyn, N>>& t, std::size_t n) {
    return tensor_ref<const float, shape<dyn, N>>(t.data(), n);
  }

  /// logits of x [n, 64].
  tensor_ref<const float, shape<dyn, 10>> forward(tensor_ref<const float, X> x) {
    const std::size_t n = x.batch();
    l1.forward(x, rows(h1, n));
    l2.forward(crows(h1, n), rows(h2, n));
    l3.forward(crows(h2, n), rows(logits, n));
    return crows(logits, n);
  }

  /// Forward, loss, backward; returns the mean loss. The optimizer step is the caller's.
  float step(tensor_ref<const float, X> x, std::span<const std::int32_t> y) {
    const std::size_t n = x.batch();
    forward(x);
    const float loss = nn::softmax_cross_entropy(crows(logits, n), y, rows(dlogits, n));
    l3.backward(crows(h2, n), crows(logits, n), crows(dlogits, n), rows(d2, n));
    l2.backward(crows(h1, n), crows(h2, n), crows(d2, n), rows(d1, n));
    l1.backward_params(x, crows(h1, n), crows(d1, n));
    return loss;
  }
};

double accuracy_of(mlp& model, const data::labeled_dataset& d) {
  model.eval();
  const tensor_ref<const float, X> x(d.x.data(), d.size());
  const double acc = nn::accuracy(model.forward(x), std::span<const std::int32_t>(d.y));
  model.train();
  return acc;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string path = argc > 1 ? argv[1] : std::string(SOLDER_EXAMPLES_DATA) + "/digits.csv";
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 40;
  constexpr std::size_t batch = 32;
  constexpr std::uint64_t seed = 2026;

  data::labeled_dataset all = data::load_labeled_csv(path, 64, 64);
  data::divide_features(all, 16.0f);  // pixels 0..16 -> [0, 1]
  const auto [train, test] = data::train_test_split(all, 0.2, seed);
  std::printf("digits: %zu samples (%zu train, %zu held out), 64 features, 10 classes\n", all.size(), train.size(),
              test.size());
  std::printf("model: 64 -> 256 (relu, dropout 0.1) -> 128 (relu, dropout 0.1) -> 10; AdamW, warmup + cosine\n\n");

  mlp model(std::max({batch, train.size(), test.size()}));  // accuracy runs whole sets at once
  optim::adamw opt(model.params(), {.lr = 2e-3f, .weight_decay = 1e-2f});
  data::batch_loader loader(train, batch, data::last_batch::drop);
  const std::int64_t total = std::int64_t(epochs) * std::int64_t(loader.size());
  const auto schedule = optim::warmup_cosine_lr(2e-3, total / 20 + 1, total, 0.1);

  using clock = std::chrono::steady_clock;
  double train_seconds = 0;
  std::int64_t t = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    loader.shuffle(seed, std::uint64_t(epoch));
    double loss_sum = 0;
    const auto start = clock::now();
    for (const data::batch_view b : loader) {
      opt.set_lr(schedule(t++));
      loss_sum += model.step(b.features_as<64>(), b.y);
      opt.step();
    }
    train_seconds += std::chrono::duration<double>(clock::now() - start).count();
    if (epoch % 5 == 4 || epoch == 0 || epoch + 1 == epochs)
      std::printf("epoch %3d  loss %.4f  train acc %.4f  held-out acc %.4f  lr %.2e\n", epoch + 1,
                  loss_sum / double(loader.size()), accuracy_of(model, train), accuracy_of(model, test), double(opt.lr()));
  }
  const double acc = accuracy_of(model, test);
  std::printf("\nheld-out accuracy: %.2f%% (%zu samples)\n", 100.0 * acc, test.size());
  std::printf("training time: %.3f s for %d epochs (%.1f us per step of %zu samples)\n", train_seconds, epochs,
              1e6 * train_seconds / double(total), batch);
  return acc >= 0.97 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "digits_mlp: %s\n", e.what());
  return 2;
}
