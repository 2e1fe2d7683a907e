// examples/sketched_mlp.cpp: the digits MLP of the flagship with its hidden linear layers replaced
// by sketched ones (nn::sketched_linear: y = 1/(2L) sum_i (x S1_i U1_i + x U2_i S2_i) + b, the
// sign sketches U regenerated from Philox, never stored), trained with AdamW; prints the model,
// the kernels and the inference form each sketched layer runs as, parameter and memory counts
// against the dense model and against Panther's layer (which stores U), and the held-out accuracy.
//
// Usage: sketched_mlp [path/to/digits.csv] [epochs]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "solder/cost.hpp"
#include "solder/data/csv.hpp"
#include "solder/data/dataset.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/sketched_linear.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/schedule.hpp"

#ifndef SOLDER_EXAMPLES_DATA
#define SOLDER_EXAMPLES_DATA "examples/data"
#endif

namespace {

using namespace solder;

using hidden1 = nn::sketched_linear<64, 256, /*Terms=*/2, /*Rank=*/8>;
using hidden2 = nn::sketched_linear<256, 128, /*Terms=*/2, /*Rank=*/8>;
using sketched_model = nn::chain<hidden1, nn::relu, nn::dropout<0.1f>,  //
                                 hidden2, nn::relu, nn::dropout<0.1f>,  //
                                 nn::linear<128, 10>>;
using dense_model = nn::chain<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>,  //
                              nn::linear<256, 128>, nn::relu, nn::dropout<0.1f>,  //
                              nn::linear<128, 10>>;

using X = tensor_ref<const float, shape<dyn, 64>>;
X rows_of(const data::labeled_dataset& d) { return X(d.x.data(), d.size()); }

}  // namespace

int main(int argc, char** argv) try {
  const std::string path = argc > 1 ? argv[1] : std::string(SOLDER_EXAMPLES_DATA) + "/digits.csv";
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 40;
  if (epochs < 1) throw solder::error("sketched_mlp: epochs must be at least 1");
  constexpr std::uint64_t seed = 2026;

  data::labeled_dataset all = data::load_labeled_csv(path, 64, 64);
  data::divide_features(all, 16.0f);
  const auto [train, test] = data::train_test_split(all, 0.2, seed);
  std::printf("digits: %zu samples (%zu train, %zu held out)\n\n", all.size(), train.size(), test.size());
  std::cout << "model\n" << summary<sketched_model>{} << "\n" << plan_report<sketched_model>{} << "\n";

  // What the layers store: solder keeps S1, S2 and b; Panther also keeps U1 and U2.
  constexpr std::size_t sketched_params = cost<sketched_model>::params, dense_params = cost<dense_model>::params;
  constexpr std::size_t panther_params =
      sketched_params - hidden1::stored_floats - hidden2::stored_floats + hidden1::panther_floats + hidden2::panther_floats;
  std::printf("parameters: %zu (%.1f KiB) against %zu (%.1f KiB) for the dense model: %.2fx fewer\n", sketched_params,
              4.0 * double(sketched_params) / 1024, dense_params, 4.0 * double(dense_params) / 1024,
              double(dense_params) / double(sketched_params));
  std::printf("stored floats with Panther's layers (U1, U2 kept): %zu (%.1f KiB); solder's: %.2fx less\n\n",
              panther_params, 4.0 * double(panther_params) / 1024, double(panther_params) / double(sketched_params));

  sketched_model model(1);
  optim::adamw opt(model.params(), {.lr = 2e-3f, .weight_decay = 1e-2f});
  data::batch_loader loader(train, 32, data::last_batch::drop);
  const std::int64_t total = std::int64_t(epochs) * std::int64_t(loader.size());
  const auto schedule = optim::warmup_cosine_lr(2e-3, total / 20 + 1, total, 0.1);
  std::printf("training: AdamW (lr 2e-3, weight decay 1e-2), warmup + cosine, batch 32, %d epochs\n", epochs);
  const auto start = std::chrono::steady_clock::now();
  std::int64_t t = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    loader.shuffle(seed, std::uint64_t(epoch));
    double loss_sum = 0;
    for (const data::batch_view b : loader) {
      opt.set_lr(schedule(t++));
      loss_sum += model.train_step(b.features_as<64>(), b.y, opt);
    }
    if ((epoch + 1) % 10 == 0 || epoch == 0)
      std::printf("epoch %3d/%d  loss %.4f\n", epoch + 1, epochs, loss_sum / double(loader.size()));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  model.eval();  // the sketched layers fold or not, as the plan says
  const double acc = nn::accuracy(model.forward(rows_of(test)), test.y);
  std::printf("\nheld-out accuracy: %.2f%% of %zu samples; training took %.2f s (%.0f us per step)\n", 100.0 * acc,
              test.size(), seconds, 1e6 * seconds / double(total));
  return acc >= 0.95 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "sketched_mlp: %s\n", e.what());
  return 2;
}
