// tests/install/consumer/main.cpp: a program built against an installed solder.
#include <omp.h>

#include "solder/config.hpp"

static_assert(__cplusplus >= 202002L, "solder::solder must bring C++20 to its users");

int main() {
  // solder::solder carries OpenMP: a parallel region must compile, link and run.
  int threads = 0;
#pragma omp parallel reduction(+ : threads)
  threads += 1;
  if (threads < 1) return 1;
  try {
    SOLDER_ASSERT(threads < 0, "expected");
  } catch (const solder::error&) {
    return 0;
  }
  return 1;
}
