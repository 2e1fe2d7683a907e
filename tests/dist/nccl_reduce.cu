// tests/dist/nccl_reduce.cu: the fixed-order bucket reduction over NCCL (dist/nccl.hpp), one
// process, one rank per visible GPU (ncclCommInitAll), against dist::reduce_on_host's bits:
// buckets of several sizes with NaN and infinities, the averaging and per-rank weights, failed
// ranks, a second run (the same bits, the staging reused), two reductions of one size in flight,
// the per-rank start from one thread per GPU, and the argument checks. With one GPU the world
// has one rank (the exchange moves only its own chunk) and the program says so.
// Exits 77 (ctest's skip code) where no CUDA device is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "../support/data.hpp"
#include "../support/gpu_program.hpp"
#include "solder/dist/bucket.hpp"
#include "solder/dist/nccl.hpp"
#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/memory.hpp"
#include "solder/eval/cuda/stream.hpp"

namespace {

namespace cu = solder::eval::cuda;
namespace dist = solder::dist;
using solder::test::bit_differences_any_nan;
using solder::test::fill_uniform;
using solder::test::gpu::expect;

/// One rank's side: its device, stream and bucket.
struct rank_side {
  int device;
  solder::stream stream;
  cu::device_array<float> bucket;
};

std::vector<rank_side> make_sides(const std::vector<dist::nccl_communicator>& comms, std::size_t n) {
  std::vector<rank_side> sides;
  for (const auto& c : comms) {
    cu::check(cudaSetDevice(c.device()), "cudaSetDevice");
    solder::stream s;
    auto b = cu::device_array<float>::allocate(n ? n : 1, s);
    sides.push_back(rank_side{c.device(), std::move(s), std::move(b)});
  }
  return sides;
}

void put(rank_side& side, const std::vector<float>& v) {
  cu::check(cudaSetDevice(side.device), "cudaSetDevice");
  cu::check(cudaMemcpyAsync(side.bucket.data(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, side.stream),
            "cudaMemcpyAsync to the device");
  side.stream.synchronize();
}

std::vector<float> get(rank_side& side, std::size_t n) {
  std::vector<float> v(n);
  cu::check(cudaSetDevice(side.device), "cudaSetDevice");
  side.stream.synchronize();
  cu::check(cudaMemcpy(v.data(), side.bucket.data(), n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  return v;
}

/// The ranks' buckets, uniform in [-2, 3), with a NaN, a lone +inf and a +inf / -inf pair.
std::vector<std::vector<float>> rank_buckets(std::size_t n, std::size_t P) {
  std::vector<std::vector<float>> b(P, std::vector<float>(n));
  for (std::size_t r = 0; r < P; ++r) fill_uniform(b[r], -2, 3, std::uint32_t(31 * n + 7 * P + r));
  if (n >= 3) {
    const float inf = std::numeric_limits<float>::infinity();
    b[P - 1][n / 3] = std::numeric_limits<float>::quiet_NaN();
    b[0][n - 1] = inf;
    b[0][n / 2] = inf;
    if (P > 1) b[1][n / 2] = -inf;
  }
  return b;
}

/// What reduce_on_host leaves in every rank's bucket, and its failed rank.
struct expected {
  std::vector<float> bucket;
  int failed;
};
expected host_reduction(std::vector<std::vector<float>> b, const std::vector<double>& w, const std::vector<float>& statuses) {
  std::vector<float*> pointers;
  for (auto& v : b) pointers.push_back(v.data());
  const int failed = dist::reduce_on_host(pointers, b[0].size(), w, statuses);
  return {b[0], failed};
}

/// Every rank's reduction by start_all; checks every rank's bucket and failed rank against the host.
void reduce_all(std::vector<dist::nccl_communicator>& comms, std::vector<rank_side>& sides, std::size_t n,
                const std::vector<std::vector<float>>& b, const std::vector<double>& w,
                const std::vector<float>& statuses, const std::string& what) {
  const std::size_t P = comms.size();
  for (std::size_t r = 0; r < P; ++r) put(sides[r], b[r]);
  std::vector<float*> buckets;
  std::vector<cudaStream_t> streams;
  for (auto& s : sides) {
    buckets.push_back(s.bucket.data());
    streams.push_back(s.stream.get());
  }
  auto reductions = dist::nccl_communicator::start_all(comms, buckets, n, w, statuses, streams);
  const expected want = host_reduction(b, w, statuses);
  for (std::size_t r = 0; r < P; ++r) {
    const int failed = comms[r].finish(reductions[r]);
    expect(failed == want.failed, (what + ": the failed rank differs from the host's").c_str());
    const auto got = get(sides[r], n);
    expect(bit_differences_any_nan(got.data(), want.bucket.data(), n) == 0,
           (what + ": rank " + std::to_string(r) + "'s bucket differs from the host's bits").c_str());
  }
}

void buckets_of_size(std::vector<dist::nccl_communicator>& comms, std::size_t n) {
  const std::size_t P = comms.size();
  const std::string at = "n = " + std::to_string(n);
  auto sides = make_sides(comms, n);
  const auto b = rank_buckets(n, P);
  std::vector<double> weights(P), mean(P, 1.0 / double(P));
  for (std::size_t j = 0; j < P; ++j) weights[j] = (1.0 + 0.37 * double(j)) / double(P);
  const std::vector<float> ok(P, dist::status_ok);

  reduce_all(comms, sides, n, b, mean, ok, at + ", mean");
  reduce_all(comms, sides, n, b, mean, ok, at + ", mean again");  // the staging reused
  reduce_all(comms, sides, n, b, weights, ok, at + ", per-rank weights");

  std::vector<float> last_failed(ok), two_failed(ok);
  last_failed[P - 1] = dist::status_failed;
  two_failed[P - 1] = dist::status_failed;
  two_failed[P / 2] = dist::status_failed;
  reduce_all(comms, sides, n, b, mean, last_failed, at + ", the last rank failed");
  reduce_all(comms, sides, n, b, mean, two_failed, at + ", two ranks failed");
}

/// Two reductions of one size in flight at once (two staging buffers), finished in reverse.
void two_in_flight(std::vector<dist::nccl_communicator>& comms, std::size_t n) {
  const std::size_t P = comms.size();
  auto first = make_sides(comms, n), second = make_sides(comms, n);
  const auto b1 = rank_buckets(n, P), b2 = rank_buckets(n + 1, P);
  std::vector<std::vector<float>> b2n(P);
  for (std::size_t r = 0; r < P; ++r) b2n[r].assign(b2[r].begin(), b2[r].begin() + std::ptrdiff_t(n));
  const std::vector<double> mean(P, 1.0 / double(P));
  const std::vector<float> ok(P, dist::status_ok);
  std::vector<float*> p1, p2;
  std::vector<cudaStream_t> s1, s2;
  for (std::size_t r = 0; r < P; ++r) {
    put(first[r], b1[r]);
    put(second[r], b2n[r]);
    p1.push_back(first[r].bucket.data());
    p2.push_back(second[r].bucket.data());
    s1.push_back(first[r].stream.get());
    s2.push_back(second[r].stream.get());
  }
  auto r1 = dist::nccl_communicator::start_all(comms, p1, n, mean, ok, s1);
  auto r2 = dist::nccl_communicator::start_all(comms, p2, n, mean, ok, s2);
  const expected want1 = host_reduction(b1, mean, ok), want2 = host_reduction(b2n, mean, ok);
  for (std::size_t r = 0; r < P; ++r) {
    expect(comms[r].finish(r2[r]) == -1, "two in flight: the second reports a failed rank");
    expect(comms[r].finish(r1[r]) == -1, "two in flight: the first reports a failed rank");
    const auto g1 = get(first[r], n), g2 = get(second[r], n);
    expect(bit_differences_any_nan(g1.data(), want1.bucket.data(), n) == 0, "two in flight: the first bucket differs");
    expect(bit_differences_any_nan(g2.data(), want2.bucket.data(), n) == 0, "two in flight: the second bucket differs");
  }
}

/// The per-rank start and finish, one thread per GPU (as one process per GPU would call them).
void per_rank_threads(std::vector<dist::nccl_communicator>& comms, std::size_t n) {
  const std::size_t P = comms.size();
  auto sides = make_sides(comms, n);
  const auto b = rank_buckets(n, P);
  std::vector<double> weights(P);
  for (std::size_t j = 0; j < P; ++j) weights[j] = 0.5 + 0.25 * double(j);
  std::vector<float> statuses(P, dist::status_ok);
  statuses[0] = dist::status_failed;
  for (std::size_t r = 0; r < P; ++r) put(sides[r], b[r]);
  std::vector<int> failed(P, -2);
  std::vector<std::string> errors(P);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      try {
        cu::check(cudaSetDevice(comms[r].device()), "cudaSetDevice");
        auto red = comms[r].start(sides[r].bucket.data(), n, weights, statuses[r], sides[r].stream);
        failed[r] = comms[r].finish(red);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  const expected want = host_reduction(b, weights, statuses);
  for (std::size_t r = 0; r < P; ++r) {
    if (!errors[r].empty()) std::fprintf(stderr, "rank %zu: %s\n", r, errors[r].c_str());
    expect(errors[r].empty(), "per-rank start: a rank threw");
    expect(failed[r] == 0 && want.failed == 0, "per-rank start: rank 0 failed, but another rank was reported");
    const auto got = get(sides[r], n);
    expect(bit_differences_any_nan(got.data(), want.bucket.data(), n) == 0, "per-rank start: a bucket differs from the host's");
  }
}

template <class F>
bool throws_solder_error(F&& f, const char* needle) {
  try {
    f();
  } catch (const solder::error& e) {
    return std::string(e.what()).find(needle) != std::string::npos;
  }
  return false;
}

void argument_checks(std::vector<dist::nccl_communicator>& comms) {
  auto sides = make_sides(comms, 4);
  const std::vector<double> too_few(comms.size() + 1, 1.0);
  expect(throws_solder_error([&] { (void)comms[0].start(sides[0].bucket.data(), 4, too_few, dist::status_ok, sides[0].stream); },
                             "one weight per rank"),
         "start with the wrong number of weights: no solder::error naming the rule");
  expect(throws_solder_error([] { dist::nccl_communicator c(nullptr); }, "the comm is null"),
         "a null comm: no solder::error");
  expect(throws_solder_error([] { dist::detail::check_nccl(ncclInvalidArgument, "ncclSend of a test"); },
                             "solder: ncclSend of a test failed: "),
         "an NCCL error: no solder::error naming the call");
  dist::nccl_reduction none;
  expect(throws_solder_error([&] { (void)comms[0].finish(none); }, "not pending"),
         "finish of a reduction never started: no solder::error");
}

}  // namespace

int main() {
  return solder::test::gpu::run(
      "solder_dist_nccl_reduce", "dist:nccl_reduce: the NCCL bucket reductions agree with the host bit for bit", [] {
        const int gpus = cu::device_count();
        auto comms = dist::nccl_communicator::for_local_devices(gpus);
        int version = 0;
        dist::detail::check_nccl(ncclGetVersion(&version), "ncclGetVersion");
        if (gpus == 1)
          std::printf("dist:nccl_reduce: NCCL %d, one GPU: one rank (the all-to-all and all-gather move only its own "
                      "chunk; more GPUs test the exchange between ranks)\n",
                      version);
        else
          std::printf("dist:nccl_reduce: NCCL %d, %d GPUs: %d ranks in one process\n", version, gpus, gpus);
        for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(100), std::size_t(1001), std::size_t(65537),
                              (std::size_t(1) << 22) + 3})
          buckets_of_size(comms, n);
        two_in_flight(comms, 4099);
        per_rank_threads(comms, 1001);
        argument_checks(comms);
      });
}
