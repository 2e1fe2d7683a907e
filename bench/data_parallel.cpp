// bench/data_parallel.cpp: data-parallel training steps across MPI ranks (bench/data_parallel.sh
// runs it with 1 and 2 ranks and prints the scaling). Every rank runs the same number of steps,
// so the timing loop is fixed, not Google Benchmark's adaptive one: ranks that chose different
// iteration counts would wait on each other's reductions forever.
//
//   mpirun -np 2 solder_bench_data_parallel [--model digits|wide] [--global-batch 512]
//          [--steps 40] [--reps 7] [--bucket-bytes N] [--messages]   one line of JSON from rank 0
//   mpirun -np 2 solder_bench_data_parallel --reduce [--messages]    the reduction alone, by size
// --messages reduces through MPI's collectives where the ranks could share memory.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "solder/dist/data_parallel.hpp"
#include "solder/dist/mpi.hpp"
#include "solder/nn/chain.hpp"
#include "solder/optim/adam.hpp"

namespace {

using namespace solder;
using clock_type = std::chrono::steady_clock;

/// The flagship's MLP (50,826 parameters) and a wider one (1.1 M parameters, 4.5 MB of gradients).
using digits_mlp = nn::chain<nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>, nn::linear<256, 128>, nn::relu,
                             nn::dropout<0.1f>, nn::linear<128, 10>>;
using wide_mlp = nn::chain<nn::linear<64, 1024>, nn::relu, nn::dropout<0.1f>, nn::linear<1024, 1024>, nn::relu,
                           nn::dropout<0.1f>, nn::linear<1024, 10>>;

struct settings {
  std::string model = "digits";
  std::size_t global_batch = 512;
  int steps = 40, reps = 7;
  std::size_t bucket_bytes = dist::data_parallel_options{}.bucket_bytes;
  bool reduce_only = false;
};

const char* route(const dist::mpi_communicator& comm) { return comm.shared_memory() ? "shared_memory" : "messages"; }

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

template <class Model>
void run_steps(dist::mpi_communicator& comm, const settings& s) {
  constexpr std::size_t in = Model::in_features, classes = Model::out_features;
  // Synthetic data of the model's shapes, the same on every rank (each takes its shard).
  std::vector<float> x(s.global_batch * in);
  std::vector<std::int32_t> y(s.global_batch);
  std::uint64_t state = 12345;
  for (float& v : x) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    v = float(double(state >> 40) / double(1ULL << 24));
  }
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i * 7 % classes);
  Model model(1);
  optim::adamw opt(model.params(), {.lr = 1e-3f});
  dist::data_parallel dp(model, opt, comm, {.bucket_bytes = s.bucket_bytes});
  const typename Model::input_ref batch(x.data(), s.global_batch);
  for (int i = 0; i < 5; ++i) dp.train_step(batch, y);  // buffers sized, caches warm
  std::vector<double> step_us, wait_share;
  for (int r = 0; r < s.reps; ++r) {
    comm.barrier();
    double wait = 0, busy = 0;
    const auto t0 = clock_type::now();
    for (int i = 0; i < s.steps; ++i) {
      dp.train_step(batch, y);
      wait += dp.last_step().wait_seconds;
      busy += dp.last_step().step_seconds;
    }
    const double total = std::chrono::duration<double>(clock_type::now() - t0).count();
    step_us.push_back(1e6 * total / s.steps);
    wait_share.push_back(busy > 0 ? wait / busy : 0.0);
  }
  // Rank 0's medians; every rank ran the same steps between the same barriers.
  if (comm.rank() == 0) {
    std::size_t floats = 0;
    for (const auto& b : dp.bucket_plan()) floats += b.floats;
    std::printf("{\"model\": \"%s\", \"ranks\": %d, \"route\": \"%s\", \"global_batch\": %zu, \"bucket_bytes\": %zu, "
                "\"buckets\": %zu, \"gradient_floats\": %zu, \"us_per_step\": %.1f, \"wait_share\": %.4f}\n",
                s.model.c_str(), comm.size(), route(comm), s.global_batch, s.bucket_bytes, dp.bucket_plan().size(), floats,
                median(step_us), median(wait_share));
  }
}

/// The reduction alone: microseconds per bucket of n floats, for the cost model in docs/distributed.md.
void run_reduce(dist::mpi_communicator& comm, const settings& s) {
  std::vector<double> w(std::size_t(comm.size()), 1.0 / comm.size());
  for (std::size_t n : {std::size_t(1) << 10, std::size_t(1) << 14, std::size_t(1) << 16, std::size_t(1) << 18,
                        std::size_t(1) << 20, std::size_t(1) << 22}) {
    std::vector<float> data(n, 1.0f);
    dist::mpi_communicator::reduction r;
    for (int i = 0; i < 3; ++i) {
      comm.start(r, data, w);
      comm.finish(r);
    }
    std::vector<double> us;
    const int count = n >= (std::size_t(1) << 20) ? 5 : 50;
    for (int rep = 0; rep < s.reps; ++rep) {
      comm.barrier();
      const auto t0 = clock_type::now();
      for (int i = 0; i < count; ++i) {
        comm.start(r, data, w);
        comm.finish(r);
      }
      us.push_back(1e6 * std::chrono::duration<double>(clock_type::now() - t0).count() / count);
    }
    if (comm.rank() == 0)
      std::printf("{\"reduce_floats\": %zu, \"ranks\": %d, \"route\": \"%s\", \"us\": %.1f, \"gb_per_s\": %.3f}\n", n,
                  comm.size(), route(comm), median(us), 4.0 * double(n) / median(us) * 1e-3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  dist::mpi_session mpi(&argc, &argv);
  // --messages is read first: the communicator's route is chosen when it is made.
  bool messages = false;
  for (int i = 1; i < argc; ++i) messages = messages || std::string(argv[i]) == "--messages";
  dist::mpi_communicator comm(MPI_COMM_WORLD, {.shared_memory = !messages});
  try {
    settings s;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const auto next = [&] {
        if (i + 1 >= argc) throw solder::error("solder_bench_data_parallel: " + a + " needs a value");
        return std::string(argv[++i]);
      };
      if (a == "--model") s.model = next();
      else if (a == "--global-batch") s.global_batch = std::size_t(std::stoul(next()));
      else if (a == "--steps") s.steps = std::stoi(next());
      else if (a == "--reps") s.reps = std::stoi(next());
      else if (a == "--bucket-bytes") s.bucket_bytes = std::size_t(std::stoul(next()));
      else if (a == "--reduce") s.reduce_only = true;
      else if (a == "--messages") continue;  // read above
      else throw solder::error("solder_bench_data_parallel: unknown option " + a);
    }
    if (s.steps < 1 || s.reps < 1) throw solder::error("solder_bench_data_parallel: --steps and --reps must be at least 1");
    if (s.reduce_only)
      run_reduce(comm, s);
    else if (s.model == "digits")
      run_steps<digits_mlp>(comm, s);
    else if (s.model == "wide")
      run_steps<wide_mlp>(comm, s);
    else
      throw solder::error("solder_bench_data_parallel: --model is digits or wide, not " + s.model);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solder_bench_data_parallel (rank %d): %s\n", comm.rank(), e.what());
    return 1;
  }
}
