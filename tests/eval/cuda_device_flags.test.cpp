// tests/eval/cuda_device_flags.test.cpp: per_device_flags (eval/cuda/device_flags.hpp), the
// bookkeeping of a setting made once on each device (the product kernel's raised shared-memory
// limit): once per device, not once per process; a failed attempt is retried; safe from
// threads.
#include <catch2/catch.hpp>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "solder/eval/cuda/device_flags.hpp"

using solder::eval::cuda::per_device_flags;

TEST_CASE("cuda device flags: a setting is made once on each device, not once per process", "[cuda][device]") {
  per_device_flags flags;
  int made[3] = {};
  flags.ensure(0, [&] { ++made[0]; });
  flags.ensure(0, [&] { ++made[0]; });
  CHECK(made[0] == 1);
  CHECK(flags.is_set(0));
  CHECK(!flags.is_set(1));
  // A second device needs its own setting, though the first has it.
  flags.ensure(1, [&] { ++made[1]; });
  flags.ensure(1, [&] { ++made[1]; });
  CHECK(made[1] == 1);
  flags.ensure(0, [&] { ++made[0]; });
  CHECK(made[0] == 1);
  // Ordinals past the lock-free ones.
  flags.ensure(70, [&] { ++made[2]; });
  flags.ensure(70, [&] { ++made[2]; });
  CHECK(made[2] == 1);
  CHECK(flags.is_set(70));
  CHECK(!flags.is_set(69));
  CHECK(!flags.is_set(2));
}

TEST_CASE("cuda device flags: a setting that fails is tried again", "[cuda][device]") {
  per_device_flags flags;
  int tries = 0;
  CHECK_THROWS_AS(flags.ensure(3, [&] {
    ++tries;
    throw std::runtime_error("cudaFuncSetAttribute failed");
  }),
                  std::runtime_error);
  CHECK(!flags.is_set(3));
  flags.ensure(3, [&] { ++tries; });
  CHECK(tries == 2);
  CHECK(flags.is_set(3));
}

TEST_CASE("cuda device flags: threads racing on one device make the setting once", "[cuda][device]") {
  per_device_flags flags;
  std::atomic<int> made{0};
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < 1000; ++i) flags.ensure((t + i) % 2, [&] { ++made; });
      });
  }
  CHECK(made == 2);  // devices 0 and 1, once each
}
