// tests/support/main.cpp: the one Catch2 main of the suite, compiled once and linked into
// every test binary (solder_tests, solder_tests_avx2).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
