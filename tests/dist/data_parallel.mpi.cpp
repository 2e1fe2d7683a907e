// tests/dist/data_parallel.mpi.cpp: data-parallel training through MPI, run by ctest under
// mpirun with 1 and 2 ranks. Every test case is collective: all ranks run the same cases in the
// same order. The reduction against sums computed here; the digits MLP trained on the ranks
// equal bitwise across two runs and within tolerance of one process on the global batch; the
// start-up checks and a failing rank, each an error on every rank.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "solder/data/csv.hpp"
#include "solder/data/dataset.hpp"
#include "solder/dist/bucket.hpp"
#include "solder/dist/data_parallel.hpp"
#include "solder/dist/mpi.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/checkpoint.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/sgd.hpp"

namespace {

using namespace solder;

dist::mpi_communicator& world() {
  static dist::mpi_communicator c;
  return c;
}
/// The same ranks reducing through messages (all-to-all and all-gather), never shared memory.
dist::mpi_communicator& by_messages() {
  static dist::mpi_communicator c(MPI_COMM_WORLD, {.shared_memory = false});
  return c;
}

/// The value rank j puts at index i: distinct per rank and index, some negative, exact floats.
float rank_value(int j, std::size_t i) { return float(int((i * 37 + std::size_t(j) * 101) % 2001) - 1000) / 64.0f; }

using mlp = nn::chain<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>, nn::linear<256, 128>, nn::relu,
                      nn::dropout<0.1f>, nn::linear<128, 10>>;
using other_mlp = nn::chain<nn::linear<64, 128>, nn::relu, nn::linear<128, 10>>;

const data::labeled_dataset& digits() {
  static const data::labeled_dataset d = [] {
    data::labeled_dataset all = data::load_labeled_csv(SOLDER_DIGITS_CSV, 64, 64);
    data::divide_features(all, 16.0f);
    return all;
  }();
  return d;
}

/// Trains `steps` global batches of `global` samples (the same on every rank) and returns the
/// parameters, concatenated. With a communicator, on its ranks; without, in this process alone.
std::vector<float> train(dist::mpi_communicator* comm, std::size_t global, int steps, std::size_t bucket_bytes = 64 * 1024) {
  mlp model(17);
  optim::adamw opt(model.params(), {.lr = 2e-3f, .weight_decay = 1e-2f});
  data::batch_loader loader(digits(), global, data::last_batch::drop);
  loader.shuffle(5, 0);
  if (comm) {
    dist::data_parallel dp(model, opt, *comm, {.bucket_bytes = bucket_bytes});
    for (int t = 0; t < steps; ++t) {
      const data::batch_view b = loader[std::size_t(t) % loader.size()];
      dp.train_step(b.features_as<64>(), b.y);
    }
  } else {
    for (int t = 0; t < steps; ++t) {
      const data::batch_view b = loader[std::size_t(t) % loader.size()];
      model.train_step(b.features_as<64>(), b.y, opt);
    }
  }
  std::vector<float> out;
  for (const auto& p : model.params()) out.insert(out.end(), p.value.data(), p.value.data() + p.value.size());
  return out;
}

}  // namespace

TEST_CASE("dist: ranks on one machine reduce through shared memory unless told not to", "[dist][mpi]") {
  CHECK(world().shared_memory() == (world().size() > 1));  // one rank has nothing to share
  CHECK_FALSE(by_messages().shared_memory());
}

TEST_CASE("dist: the reduction is the weighted sum in rank order", "[dist][mpi]") {
  dist::mpi_communicator& c = *GENERATE(&world(), &by_messages());
  INFO((c.shared_memory() ? "through shared memory" : "through messages"));
  const int P = c.size();
  for (std::size_t n : {std::size_t(1), std::size_t(3), std::size_t(1000), std::size_t(100001)}) {
    std::vector<double> w(static_cast<std::size_t>(P));
    for (int j = 0; j < P; ++j) w[std::size_t(j)] = double(j + 1) / double(P * (P + 1) / 2);
    std::vector<float> data(n);
    for (std::size_t i = 0; i < n; ++i) data[i] = rank_value(c.rank(), i);
    REQUIRE(c.reduce(data, w) == -1);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double s = 0;
      for (int j = 0; j < P; ++j) s = std::fma(w[std::size_t(j)], double(rank_value(j, i)), s);
      const float expected = float(s);
      wrong += std::memcmp(&expected, &data[i], sizeof(float)) != 0;
    }
    CHECK(wrong == 0);
    // The same bits as bucket.hpp's host run of the whole reduction (the GPU path's reference).
    std::vector<std::vector<float>> all(static_cast<std::size_t>(P), std::vector<float>(n));
    std::vector<float*> buckets;
    for (int j = 0; j < P; ++j) {
      for (std::size_t i = 0; i < n; ++i) all[std::size_t(j)][i] = rank_value(j, i);
      buckets.push_back(all[std::size_t(j)].data());
    }
    const std::vector<float> statuses(std::size_t(P), dist::status_ok);
    CHECK(dist::reduce_on_host(buckets, n, w, statuses) == -1);
    CHECK(std::memcmp(all[0].data(), data.data(), n * sizeof(float)) == 0);
    // The same bucket as three spans of uneven sizes (a model's gradient tensors): the same bits.
    std::vector<float> pieces_data(n);
    for (std::size_t i = 0; i < n; ++i) pieces_data[i] = rank_value(c.rank(), i);
    const std::size_t a = n / 3, b = n - n / 2;
    const std::vector<std::span<float>> pieces = {std::span(pieces_data.data(), a),
                                                  std::span(pieces_data.data() + a, b - a),
                                                  std::span(pieces_data.data() + b, n - b)};
    dist::mpi_communicator::reduction r;
    c.start(r, pieces, w);
    REQUIRE(c.finish(r) == -1);
    CHECK(std::memcmp(pieces_data.data(), data.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("dist: a failed status reaches every rank with the lowest failed rank", "[dist][mpi]") {
  dist::mpi_communicator& c = *GENERATE(&world(), &by_messages());
  INFO((c.shared_memory() ? "through shared memory" : "through messages"));
  std::vector<double> w(std::size_t(c.size()), 1.0);
  std::vector<float> data(10, 1.0f);
  const int last = c.size() - 1;
  CHECK(c.reduce(data, w, c.rank() == last ? dist::status_failed : dist::status_ok) == last);
  CHECK(c.reduce(data, w, dist::status_failed) == 0);
  CHECK(c.reduce(data, w) == -1);
}

TEST_CASE("dist: shard_of cuts a batch into contiguous shards", "[dist]") {
  for (std::size_t n : {1, 2, 7, 512}) {
    for (int P : {1, 2, 3, 5}) {
      std::size_t next = 0;
      for (int r = 0; r < P; ++r) {
        const dist::shard s = dist::shard_of(n, r, P);
        CHECK(s.first == next);
        CHECK((s.count == n / std::size_t(P) || s.count == n / std::size_t(P) + 1));
        next += s.count;
      }
      CHECK(next == n);
    }
  }
}

TEST_CASE("dist: data-parallel training is reproducible and matches one process", "[dist][mpi]") {
  auto& c = world();
  constexpr std::size_t global = 64;
  constexpr int steps = 12;
  const std::vector<float> a = train(&c, global, steps);
  const std::vector<float> b = train(&c, global, steps, 0);  // a bucket per kernel: same bits
  const std::vector<float> m = train(&by_messages(), global, steps);  // the other route: same bits
  const std::vector<float> one = train(nullptr, global, steps);
  REQUIRE(a.size() == one.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.data(), m.data(), a.size() * sizeof(float)) == 0);
  // The ranks agree bitwise.
  std::vector<float> mine = a, w0 = a;
  std::vector<double> only_root(std::size_t(c.size()), 0.0);
  only_root[0] = 1.0;
  REQUIRE(c.reduce(w0, only_root) == -1);
  CHECK(std::memcmp(mine.data(), w0.data(), mine.size() * sizeof(float)) == 0);
  // One process on the global batch: the same masks, the gradients summed in another grouping
  // (shards, then ranks), so the weights drift apart by float rounding over the steps; AdamW's
  // normalized update keeps that near lr-sized steps of rounding noise.
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - double(one[i])));
  INFO("largest weight difference from one process: " << worst);
  CHECK(worst < 2e-4);
  if (c.size() == 1) CHECK(std::memcmp(a.data(), one.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("dist: a run resumed from rank 0's checkpoint continues bit for bit", "[dist][mpi]") {
  auto& c = world();
  constexpr std::size_t global = 48;
  data::batch_loader loader(digits(), global, data::last_batch::drop);
  loader.shuffle(9, 0);
  const auto params_of = [](mlp& m) {
    std::vector<float> out;
    for (const auto& p : m.params()) out.insert(out.end(), p.value.data(), p.value.data() + p.value.size());
    return out;
  };
  // A path every rank agrees on (rank 0's temporary directory).
  const std::string path =
      c.broadcast((std::filesystem::temp_directory_path() / ("solder_dp_" + std::to_string(::getpid()) + ".safetensors")).string(), 0);
  mlp a(23);
  optim::adamw oa(a.params());
  {
    dist::data_parallel dp(a, oa, c);
    for (std::size_t t = 0; t < 6; ++t) {
      if (t == 3 && c.rank() == 0) nn::save_checkpoint(path, a, oa, {.step = 3});
      dp.train_step(loader[t].features_as<64>(), loader[t].y);
    }
  }
  c.barrier();  // the file is complete before anyone reads it
  mlp b(99);    // another seed: everything comes from the file
  optim::adamw ob(b.params());
  CHECK(nn::load_checkpoint(path, b, ob).step == 3);
  {
    dist::data_parallel dp(b, ob, c);  // the start-up check passes: every rank loaded the same state
    for (std::size_t t = 3; t < 6; ++t) dp.train_step(loader[t].features_as<64>(), loader[t].y);
  }
  const std::vector<float> wa = params_of(a), wb = params_of(b);
  CHECK(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)) == 0);
  c.barrier();
  if (c.rank() == 0) std::filesystem::remove(path);
}

TEST_CASE("dist: ranks whose models differ are refused at start-up", "[dist][mpi]") {
  auto& c = world();
  if (c.size() < 2) return;  // needs a second rank to differ from rank 0
  const bool odd = c.rank() == c.size() - 1;
  const std::string who = "rank " + std::to_string(c.size() - 1) + " has ";
  {
    mlp model(odd ? 18 : 17);  // another seed
    optim::adamw opt(model.params());
    CHECK_THROWS_WITH((dist::data_parallel(model, opt, c)),
                      Catch::Matchers::Contains(who + "parameter 0.weight values with checksum") &&
                          Catch::Matchers::Contains("the same seed"));
  }
  {
    mlp model(17);
    optim::adamw opt(model.params(), {.lr = odd ? 1e-3f : 2e-3f});
    CHECK_THROWS_WITH((dist::data_parallel(model, opt, c)),
                      Catch::Matchers::Contains(who + "optimizer settings lr=0.00100000005"));
  }
  {
    mlp model(17);
    optim::sgd sgd_opt(model.params(), {.lr = 0.1f});
    optim::adamw adam_opt(model.params());
    if (odd)
      CHECK_THROWS_WITH((dist::data_parallel(model, sgd_opt, c)), Catch::Matchers::Contains(who + "optimizer solder::optim::"));
    else
      CHECK_THROWS_WITH((dist::data_parallel(model, adam_opt, c)), Catch::Matchers::Contains(who + "optimizer solder::optim::"));
  }
  {
    // Another architecture: the type differs first.
    mlp a(17);
    other_mlp b(17);
    optim::adamw oa(a.params()), ob(b.params());
    if (odd)
      CHECK_THROWS_WITH((dist::data_parallel(b, ob, c)), Catch::Matchers::Contains(who + "model solder::nn::basic_chain"));
    else
      CHECK_THROWS_WITH((dist::data_parallel(a, oa, c)), Catch::Matchers::Contains(who + "model solder::nn::basic_chain"));
  }
  {
    mlp model(17);
    optim::adamw opt(model.params());
    CHECK_NOTHROW(dist::data_parallel(model, opt, c, {.bucket_bytes = 1}));
    CHECK_THROWS_WITH((dist::data_parallel(model, opt, c, {.bucket_bytes = odd ? 2u : 1u})),
                      Catch::Matchers::Contains(who + "bucket bytes 2"));
  }
}

TEST_CASE("dist: a rank that fails its step stops every rank with its error", "[dist][mpi]") {
  auto& c = world();
  mlp model(17);
  optim::adamw opt(model.params());
  dist::data_parallel dp(model, opt, c);
  data::batch_loader loader(digits(), 32, data::last_batch::drop);
  const data::batch_view b = loader[0];
  const auto before = model.params()[0].value[0];
  // The last rank passes a label out of range: its loss throws; every rank reports it.
  std::vector<std::int32_t> labels(b.y.begin(), b.y.end());
  const dist::shard s = dist::shard_of(32, c.rank(), c.size());
  if (c.rank() == c.size() - 1) labels[s.first] = 42;
  CHECK_THROWS_WITH(dp.train_step(b.features_as<64>(), std::span<const std::int32_t>(labels)),
                    Catch::Matchers::Contains("rank " + std::to_string(c.size() - 1) + " failed in its training step") &&
                        Catch::Matchers::Contains("42"));
  CHECK(model.params()[0].value[0] == before);  // no rank stepped
  // The ranks are still in step: the next step works.
  CHECK(std::isfinite(dp.train_step(b.features_as<64>(), b.y)));
  // A shard that is not shard_of's is refused the same way.
  const std::size_t n = s.count > 1 ? s.count - 1 : s.count;
  CHECK_THROWS_WITH(dp.train_step(mlp::input_ref(b.x + s.first * 64, n), b.y.subspan(s.first, n), s.first, 32),
                    Catch::Matchers::Contains("failed in its training step") && Catch::Matchers::Contains("not shard_of's"));
}
