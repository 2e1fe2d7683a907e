// support/gpu_program.hpp: the frame of a GPU test program (tests/cuda/): counted checks that
// report and go on, and a main body that is skipped without a device (exit 77, ctest's skip
// code), fails on an exception or on any failed check, and says what passed otherwise.
#pragma once

#include <cstdio>
#include <exception>

#include "solder/eval/cuda/error.hpp"

namespace solder::test::gpu {

/// Checks that failed so far in this program.
inline int failures = 0;

/// Counts and reports a failed check; the program goes on to the next one.
inline void expect(bool ok, const char* what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAILED: %s\n", what);
  }
}

/// main's body: 77 without a CUDA device; else runs `checks`, and returns 1 if it threw or any
/// check failed, 0 (after printing `passed`) if none did.
template <class F>
int run(const char* program, const char* passed, F&& checks) {
  if (eval::cuda::device_count() == 0) {
    std::puts("solder: no CUDA device; GPU tests not run");
    return 77;
  }
  try {
    checks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected exception: %s\n", program, e.what());
    return 1;
  }
  if (failures) {
    std::fprintf(stderr, "%s: %d checks failed\n", program, failures);
    return 1;
  }
  std::puts(passed);
  return 0;
}

}  // namespace solder::test::gpu
