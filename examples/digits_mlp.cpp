// examples/digits_mlp.cpp: the flagship. A 64 -> 256 -> 128 -> 10 MLP (ReLU, dropout 0.1) as a
// type, trained on the digits data set (examples/data/digits.csv: 1797 8x8 images, 10 classes)
// with AdamW and a warmup + cosine learning rate; prints the model summary, the kernels it
// compiles to, the training progress, the held-out accuracy, and the time of one training step
// fused against the same model run one kernel per layer.
//
// Usage: digits_mlp [path/to/digits.csv] [epochs]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "solder/cost.hpp"
#include "solder/data/csv.hpp"
#include "solder/data/dataset.hpp"
#include "solder/host_report.hpp"
#include "solder/nn/chain.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/schedule.hpp"

#ifndef SOLDER_EXAMPLES_DATA
#define SOLDER_EXAMPLES_DATA "examples/data"
#endif

namespace {

using namespace solder;

template <template <class...> class Chain>
using digits_mlp = Chain<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>,  //
                         nn::linear<256, 128>, nn::relu, nn::dropout<0.1f>,  //
                         nn::linear<128, 10>>;
using model_type = digits_mlp<nn::chain>;
using unfused_type = digits_mlp<nn::unfused_chain>;
static_assert(cost<model_type>::params == 50826);

using X = tensor_ref<const float, shape<dyn, 64>>;
X rows_of(const data::labeled_dataset& d) { return X(d.x.data(), d.size()); }

template <class Model>
double accuracy_of(Model& model, const data::labeled_dataset& d) {
  model.eval();
  const double acc = nn::accuracy(model.forward(rows_of(d)), d.y);
  model.train();
  return acc;
}

std::string bar(int done, int total, int width = 24) {
  const int filled = done * width / total;
  return "[" + std::string(std::size_t(filled), '=') + std::string(std::size_t(width - filled), ' ') + "]";
}

/// Median time of one training step (forward, loss, backward, AdamW) of a model on batch b.
template <class Model>
double step_microseconds(const data::batch_view& b, int reps = 200) {
  Model model(7);
  optim::adamw opt(model.params());
  for (int i = 0; i < 20; ++i) model.train_step(b.features_as<64>(), b.y, opt);  // warm: buffers sized
  std::vector<double> t;
  for (int r = 0; r < 9; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) model.train_step(b.features_as<64>(), b.y, opt);
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / reps);
  }
  std::nth_element(t.begin(), t.begin() + 4, t.end());
  return t[4];
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string path = argc > 1 ? argv[1] : std::string(SOLDER_EXAMPLES_DATA) + "/digits.csv";
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 40;
  if (epochs < 1) throw solder::error("digits_mlp: epochs must be at least 1");
  constexpr std::size_t batch = 32;
  constexpr std::uint64_t seed = 2026;

  data::labeled_dataset all = data::load_labeled_csv(path, 64, 64);
  data::divide_features(all, 16.0f);  // pixels 0..16 -> [0, 1]
  const auto [train, test] = data::train_test_split(all, 0.2, seed);
  std::printf("digits: %zu samples (%zu train, %zu held out), 64 features, 10 classes\n\n", all.size(), train.size(),
              test.size());
  std::cout << solder::host_report{} << "\n";
  std::cout << "model\n" << summary<model_type>{} << "\n" << plan_report<model_type>{} << "\n";

  model_type model(1);
  optim::adamw opt(model.params(), {.lr = 2e-3f, .weight_decay = 1e-2f});
  data::batch_loader loader(train, batch, data::last_batch::drop);
  const std::int64_t total = std::int64_t(epochs) * std::int64_t(loader.size());
  const auto schedule = optim::warmup_cosine_lr(2e-3, total / 20 + 1, total, 0.1);

  std::printf("training: AdamW (lr 2e-3, weight decay 1e-2), warmup + cosine, batch %zu, %d epochs\n", batch, epochs);
  using clock = std::chrono::steady_clock;
  double train_seconds = 0;
  std::int64_t t = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    loader.shuffle(seed, std::uint64_t(epoch));
    double loss_sum = 0;
    const auto start = clock::now();
    for (const data::batch_view b : loader) {
      opt.set_lr(schedule(t++));
      loss_sum += model.train_step(b.features_as<64>(), b.y, opt);
    }
    train_seconds += std::chrono::duration<double>(clock::now() - start).count();
    std::printf("epoch %3d/%d %s loss %.4f  train acc %.4f  held-out acc %.4f\n", epoch + 1, epochs,
                bar(epoch + 1, epochs).c_str(), loss_sum / double(loader.size()), accuracy_of(model, train),
                accuracy_of(model, test));
  }
  const double acc = accuracy_of(model, test);
  std::printf("\nheld-out accuracy: %.2f%% of %zu samples; training took %.2f s (%.0f us per step)\n\n", 100.0 * acc,
              test.size(), train_seconds, 1e6 * train_seconds / double(total));

  // One training step, fused against one kernel per layer, on the same batch.
  loader.shuffle(seed, 0);
  const data::batch_view b = loader[0];
  const double fused_us = step_microseconds<model_type>(b);
  const double unfused_us = step_microseconds<unfused_type>(b);
  std::printf("one training step (batch %zu, forward + loss + backward + AdamW), median of 9 x 200:\n", batch);
  std::printf("  %-34s %9.1f us  (%zu kernels forward)\n", "fused (solder::nn::chain)", fused_us, model_type::kernels);
  std::printf("  %-34s %9.1f us  (%zu kernels forward)\n", "unfused (one kernel per layer)", unfused_us, unfused_type::kernels);
  std::printf("  speed-up %.2fx\n\n", unfused_us / fused_us);

  // Where the fused step's time goes.
  model.enable_profiling();
  for (int i = 0; i < 200; ++i) model.train_step(b.features_as<64>(), b.y, opt);
  std::printf("per-kernel profile of the fused step (200 steps):\n");
  model.print_profile(std::cout);
  return acc >= 0.97 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "digits_mlp: %s\n", e.what());
  return 2;
}
