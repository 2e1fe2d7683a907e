// tests/build/smoke.test.cpp: the build itself: each test binary targets the instruction set
// it was built for, and OpenMP is on (the CPU evaluator splits large tensors over threads).
#include <omp.h>

#include <catch2/catch.hpp>
#include <string>
#include <xsimd/xsimd.hpp>

TEST_CASE("build: the binary is compiled for its instruction set", "[build]") {
  const std::string arch = xsimd::default_arch::name();
  INFO("xsimd::default_arch is " << arch << ", " << xsimd::batch<float>::size << " float lanes");
#if defined(SOLDER_TEST_ARCH_AVX2)
  // solder_tests_avx2: -mavx2 -mfma -mno-avx512f, whatever the machine has.
#if !defined(__AVX2__) || !defined(__FMA__) || defined(__AVX512F__)
#error "solder_tests_avx2 must be compiled with AVX2 and FMA and without AVX-512"
#endif
  STATIC_REQUIRE(xsimd::batch<float>::size == 8);
  CHECK(arch == "fma3+avx2");
#else
  STATIC_REQUIRE(xsimd::batch<float>::size >= 4);
  CHECK(!arch.empty());
#endif
}

TEST_CASE("build: OpenMP runs a parallel region", "[build]") {
#if !defined(_OPENMP)
#error "solder's tests must be compiled with OpenMP (solder::solder links OpenMP::OpenMP_CXX)"
#endif
  int threads = 0;
#pragma omp parallel reduction(+ : threads)
  threads += 1;
  CHECK(threads == omp_get_max_threads());
}
