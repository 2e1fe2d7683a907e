#!/usr/bin/env bash
# bench/compile_time.sh: how long g++ -O2 takes to compile a translation unit holding a chain
# with its forward, backward and optimizer step (AdamW train_step): a 10-layer chain and a
# 2-layer one. Prints the median wall time of 3 compiles of each (one compile at a time).
#
#   bash bench/compile_time.sh [g++] [extra flags...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cxx=${1:-g++}
shift || true
flags=(-std=c++20 -O2 -march=native -fopenmp -Iinclude "$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

write_tu() {  # write_tu <file> <layer list>
  cat >"$1" <<CPP
#include <cstdint>
#include <vector>
#include "solder/nn/chain.hpp"
#include "solder/optim/adam.hpp"
using namespace solder;
using model = nn::chain<$2>;
float step(model& m, optim::adamw& opt, const float* x, std::size_t n, const std::int32_t* y) {
  return m.train_step(model::input_ref(x, n), std::span<const std::int32_t>(y, n), opt);
}
int main() {
  model m(1);
  optim::adamw opt(m.params());
  std::vector<float> x(32 * model::in_features, 0.5f);
  std::vector<std::int32_t> y(32, 1);
  return step(m, opt, x.data(), 32, y.data()) > 0 ? 0 : 1;
}
CPP
}

write_tu "$work/chain10.cpp" "nn::linear<64, 256>, nn::relu, nn::dropout<0.1f>, nn::linear<256, 128>, nn::gelu, nn::dropout<0.1f>, nn::linear<128, 64>, nn::tanh, nn::linear<64, 32>, nn::linear<32, 10>"
write_tu "$work/chain2.cpp" "nn::linear<64, 32>, nn::linear<32, 10>"

median_seconds() {  # median_seconds <file>
  local times=()
  for _ in 1 2 3; do
    local t0 t1
    t0=$(date +%s.%N)
    "$cxx" "${flags[@]}" "$1" -o "$work/a.out"
    t1=$(date +%s.%N)
    times+=("$(echo "$t1 - $t0" | bc)")
  done
  printf '%s\n' "${times[@]}" | sort -n | sed -n 2p
}

echo "compiler: $("$cxx" --version | head -1); flags: ${flags[*]}"
printf '%-46s %8s\n' "translation unit" "seconds"
printf '%-46s %8.2f\n' "10-layer chain (4 GEMM kernels), train_step" "$(median_seconds "$work/chain10.cpp")"
printf '%-46s %8.2f\n' "2-layer chain (2 GEMM kernels), train_step" "$(median_seconds "$work/chain2.cpp")"
