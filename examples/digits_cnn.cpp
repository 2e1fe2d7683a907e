// examples/digits_cnn.cpp: a small CNN with batch normalization on the digits images (1x8x8, 10
// classes), trained with AdamW, then frozen: eval() folds each batch_norm into the convolution
// before it. Prints the model, its plan, the training, the held-out accuracy with the folded
// and the unfolded normalization (the same predictions), and the inference time of each.
//
// Usage: digits_cnn [path/to/digits.csv] [epochs]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "solder/cost.hpp"
#include "solder/data/csv.hpp"
#include "solder/data/dataset.hpp"
#include "solder/nn/batch_norm.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/conv2d.hpp"
#include "solder/nn/flatten.hpp"
#include "solder/nn/pool.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/schedule.hpp"

#ifndef SOLDER_EXAMPLES_DATA
#define SOLDER_EXAMPLES_DATA "examples/data"
#endif

namespace {

using namespace solder;

// [1, 8, 8] -> conv 3x3 -> [16, 8, 8] -> conv 3x3 -> [32, 8, 8] -> max pool 2 -> [32, 4, 4] -> 10.
using model_type = nn::chain<nn::input<1, 8, 8>,                                            //
                             nn::conv2d<1, 16, 3, 3, 1, 1>, nn::batch_norm<16>, nn::relu,   //
                             nn::conv2d<16, 32, 3, 3, 1, 1>, nn::batch_norm<32>, nn::relu,  //
                             nn::max_pool2d<2>, nn::flatten<>, nn::dropout<0.1f>, nn::linear<512, 10>>;

using X = tensor_ref<const float, shape<dyn, 64>>;
X rows_of(const data::labeled_dataset& d) { return X(d.x.data(), d.size()); }

/// Folds (or stops folding) every convolution block's batch_norm in eval mode.
void set_folding(model_type& model, bool on) {
  std::apply([&](auto&... b) { ((void)[&] { if constexpr (requires { b.fold_in_eval; }) b.fold_in_eval = on; }(), ...); },
             model.blocks);
}

std::vector<std::size_t> predictions(const model_type::output_tensor& logits) {
  std::vector<std::size_t> p(logits.batch());
  for (std::size_t n = 0; n < p.size(); ++n)
    for (std::size_t k = 1; k < 10; ++k)
      if (logits(n, k) > logits(n, p[n])) p[n] = k;
  return p;
}

/// Median time of one forward of the held-out set in eval mode.
double inference_microseconds(model_type& model, X x, int reps = 50) {
  for (int i = 0; i < 5; ++i) model.forward(x);
  std::vector<double> t;
  for (int r = 0; r < 9; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) model.forward(x);
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / reps);
  }
  std::nth_element(t.begin(), t.begin() + 4, t.end());
  return t[4];
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string path = argc > 1 ? argv[1] : std::string(SOLDER_EXAMPLES_DATA) + "/digits.csv";
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 20;
  if (epochs < 1) throw solder::error("digits_cnn: epochs must be at least 1");
  constexpr std::size_t batch = 32;
  constexpr std::uint64_t seed = 2026;

  data::labeled_dataset all = data::load_labeled_csv(path, 64, 64);
  data::divide_features(all, 16.0f);  // pixels 0..16 -> [0, 1]
  const auto [train, test] = data::train_test_split(all, 0.2, seed);
  std::printf("digits: %zu samples (%zu train, %zu held out), 1x8x8 images, 10 classes\n\n", all.size(), train.size(),
              test.size());
  std::cout << "model\n" << summary<model_type>{} << "\n" << plan_report<model_type>{} << "\n";

  model_type model(1);
  optim::adamw opt(model.params(), {.lr = 3e-3f, .weight_decay = 1e-2f});
  data::batch_loader loader(train, batch, data::last_batch::drop);
  const std::int64_t total = std::int64_t(epochs) * std::int64_t(loader.size());
  const auto schedule = optim::warmup_cosine_lr(3e-3, total / 20 + 1, total, 0.1);
  std::printf("training: AdamW (lr 3e-3, weight decay 1e-2), warmup + cosine, batch %zu, %d epochs\n", batch, epochs);
  std::int64_t t = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < epochs; ++epoch) {
    loader.shuffle(seed, std::uint64_t(epoch));
    double loss_sum = 0;
    for (const data::batch_view b : loader) {
      opt.set_lr(schedule(t++));
      loss_sum += model.train_step(b.features_as<64>(), b.y, opt);
    }
    if ((epoch + 1) % 5 == 0 || epoch == 0) std::printf("epoch %3d/%d  loss %.4f\n", epoch + 1, epochs, loss_sum / double(loader.size()));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("training took %.2f s (%.0f us per step)\n\n", seconds, 1e6 * seconds / double(total));

  // Frozen: eval() folds each batch_norm into its convolution (from the running statistics).
  model.eval();
  const X x = rows_of(test);
  const auto folded = model.forward(x);
  const double folded_acc = nn::accuracy(folded, test.y);
  const double folded_us = inference_microseconds(model, x);
  set_folding(model, false);
  const auto unfolded = model.forward(x);
  const double unfolded_acc = nn::accuracy(unfolded, test.y);
  const double unfolded_us = inference_microseconds(model, x);
  set_folding(model, true);
  const auto pf = predictions(folded), pu = predictions(unfolded);
  const auto same = std::size_t(std::count_if(pf.begin(), pf.end(), [&, i = std::size_t(0)](std::size_t p) mutable { return p == pu[i++]; }));

  std::printf("held-out accuracy, batch_norm folded into the convolutions: %.2f%%\n", 100.0 * folded_acc);
  std::printf("held-out accuracy, batch_norm run as written (unfolded):   %.2f%%\n", 100.0 * unfolded_acc);
  std::printf("the same prediction for %zu of %zu held-out samples\n\n", same, pf.size());
  std::printf("inference of the %zu held-out samples (eval mode), median of 9 x 50:\n", test.size());
  std::printf("  %-28s %9.1f us\n", "folded", folded_us);
  std::printf("  %-28s %9.1f us\n", "unfolded", unfolded_us);
  std::printf("  speed-up %.2fx\n", unfolded_us / folded_us);
  return folded_acc >= 0.98 && same == pf.size() ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "digits_cnn: %s\n", e.what());
  return 2;
}
