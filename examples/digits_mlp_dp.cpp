// examples/digits_mlp_dp.cpp: the flagship's digits MLP trained data-parallel across MPI ranks.
// Every rank holds the model and reads the same shuffled global batches; each trains on its
// shard, the gradients are reduced in buckets while the backward runs, and every rank takes the
// same AdamW step. The weights are the same bits on every rank, and the dropout masks those of
// the global batch, so the run trains as the single-process demo does on the same global batch.
// Rank 0 writes a checkpoint after every epoch; --resume continues from it.
//
// Usage: mpirun -np 2 digits_mlp_dp [--resume] [--stop-after E] [path/to/digits.csv] [epochs] [checkpoint]
//   --stop-after E: stop after epoch E (of `epochs`, whose schedule it follows), checkpoint written.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "solder/data/csv.hpp"
#include "solder/data/dataset.hpp"
#include "solder/dist/data_parallel.hpp"
#include "solder/dist/mpi.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/checkpoint.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/schedule.hpp"

#ifndef SOLDER_EXAMPLES_DATA
#define SOLDER_EXAMPLES_DATA "examples/data"
#endif

namespace {

using namespace solder;

using model_type = nn::chain<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>,  //
                             nn::linear<256, 128>, nn::relu, nn::dropout<0.1f>,  //
                             nn::linear<128, 10>>;

double accuracy_of(model_type& model, const data::labeled_dataset& d) {
  model.eval();
  const double acc = nn::accuracy(model.forward(tensor_ref<const float, shape<dyn, 64>>(d.x.data(), d.size())), d.y);
  model.train();
  return acc;
}

}  // namespace

int main(int argc, char** argv) {
  dist::mpi_session mpi(&argc, &argv);
  dist::mpi_communicator comm;
  const bool root = comm.rank() == 0;
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    bool resume = false;
    int stop_after = -1;
    while (!args.empty() && args[0].starts_with("--")) {
      if (args[0] == "--resume") {
        resume = true;
        args.erase(args.begin());
      } else if (args[0] == "--stop-after" && args.size() > 1) {
        stop_after = std::atoi(args[1].c_str());
        args.erase(args.begin(), args.begin() + 2);
      } else {
        throw solder::error("digits_mlp_dp: unknown option " + args[0]);
      }
    }
    const std::string path = !args.empty() ? args[0] : std::string(SOLDER_EXAMPLES_DATA) + "/digits.csv";
    const int epochs = args.size() > 1 ? std::atoi(args[1].c_str()) : 40;
    const std::filesystem::path checkpoint = args.size() > 2 ? args[2] : "digits_mlp_dp.safetensors";
    if (epochs < 1) throw solder::error("digits_mlp_dp: epochs must be at least 1");
    constexpr std::size_t global_batch = 32;  // the single-process demo's batch, cut across the ranks
    constexpr std::uint64_t seed = 2026;

    data::labeled_dataset all = data::load_labeled_csv(path, 64, 64);
    data::divide_features(all, 16.0f);
    const auto [train, test] = data::train_test_split(all, 0.2, seed);

    model_type model(1);
    optim::adamw opt(model.params(), {.lr = 2e-3f, .weight_decay = 1e-2f});
    data::batch_loader loader(train, global_batch, data::last_batch::drop);
    const std::int64_t total = std::int64_t(epochs) * std::int64_t(loader.size());
    const auto schedule = optim::warmup_cosine_lr(2e-3, total / 20 + 1, total, 0.1);
    int first_epoch = 0;
    if (resume) {
      const nn::checkpoint_info info = nn::load_checkpoint(checkpoint, model, opt);
      first_epoch = int(info.epoch);
    }
    // After a resume too: the ranks must have loaded the same state.
    dist::data_parallel dp(model, opt, comm);
    if (root) {
      std::printf("digits: %zu train, %zu held out; %d ranks, global batch %zu (%zu per rank)\n", train.size(), test.size(),
                  comm.size(), global_batch, dist::shard_of(global_batch, 0, comm.size()).count);
      if (resume) std::printf("resumed from %s after epoch %d\n", checkpoint.c_str(), first_epoch);
    }

    std::int64_t t = std::int64_t(first_epoch) * std::int64_t(loader.size());
    double step_seconds = 0, wait_seconds = 0;
    std::int64_t steps = 0;
    const int last_epoch = stop_after > 0 && stop_after < epochs ? stop_after : epochs;
    for (int epoch = first_epoch; epoch < last_epoch; ++epoch) {
      loader.shuffle(seed, std::uint64_t(epoch));
      double loss_sum = 0;
      for (const data::batch_view b : loader) {
        opt.set_lr(schedule(t++));
        loss_sum += dp.train_step(b.features_as<64>(), b.y);
        step_seconds += dp.last_step().step_seconds;
        wait_seconds += dp.last_step().wait_seconds;
        ++steps;
      }
      if (root) {
        nn::save_checkpoint(checkpoint, model, opt, {.step = t, .epoch = epoch + 1});
        std::printf("epoch %3d/%d loss %.4f  held-out acc %.4f\n", epoch + 1, epochs, loss_sum / double(loader.size()),
                    accuracy_of(model, test));
      }
    }
    dp.verify();  // the ranks still hold the same bits
    if (last_epoch < epochs) {
      if (root) std::printf("stopped after epoch %d of %d; resume with --resume\n", last_epoch, epochs);
      return 0;
    }
    const double acc = accuracy_of(model, test);
    if (root && steps > 0) {
      std::printf("\nheld-out accuracy: %.2f%% of %zu samples\n", 100.0 * acc, test.size());
      std::printf("rank 0: %.0f us per step, %.1f%% of it waiting for the gradient reduction\n",
                  1e6 * step_seconds / double(steps), step_seconds > 0 ? 100.0 * wait_seconds / step_seconds : 0.0);
    }
    return acc >= 0.97 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "digits_mlp_dp (rank %d): %s\n", comm.rank(), e.what());
    return 2;
  }
}
