// tests/support/warp_emulation.hpp: a CUDA warp emulated on the host, 32 threads that meet at a
// barrier, as the team of eval/cuda/row.hpp's walker: the host suite runs the device's row
// bodies with the device's index arithmetic and reduction order. Also a block of threads for
// eval/cuda/total.hpp's fixed-order sum, and the tensor cores' warp-wide multiply (mma.sync)
// of eval/cuda/product.hpp's mma tilings.
#pragma once

#include <array>
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "solder/eval/cuda/product.hpp"
#include "solder/eval/cuda/row.hpp"

namespace solder::test {

/// What the lanes of one emulated warp share: a slot per lane and the barrier they meet at.
struct warp_state {
  std::array<double, eval::cuda::warp_size> sums{};
  std::array<float, eval::cuda::warp_size> maxes{};
  std::barrier<> meet{std::ptrdiff_t(eval::cuda::warp_size)};
};

/// A lane of an emulated warp, the team of warp_row. exchange_* publish the lane's value, wait
/// for every lane, run the device's butterfly (eval::cuda::butterfly, offsets 16 ... 1) over
/// the 32 published values, and wait again before a slot can be reused.
struct emulated_team {
  warp_state* state;
  unsigned lane_index;

  unsigned lane() const { return lane_index; }
  void sync() const { state->meet.arrive_and_wait(); }
  double exchange_sum(double v) const { return exchange(state->sums, v, eval::cuda::butterfly::sum); }
  float exchange_max(float v) const { return exchange(state->maxes, v, eval::cuda::butterfly::max); }

 private:
  template <class T, class Combine>
  T exchange(std::array<T, eval::cuda::warp_size>& slots, T v, Combine combine) const {
    slots[lane_index] = v;
    sync();
    std::array<T, eval::cuda::warp_size> lanes = slots, next{};
    for (unsigned o = eval::cuda::butterfly::first; o > 0; o /= 2) {
      for (unsigned l = 0; l < eval::cuda::warp_size; ++l) next[l] = combine(l, o, lanes[l], lanes[l ^ o]);
      lanes = next;
    }
    sync();
    return lanes[lane_index];
  }
};

/// body(r, team) for r in [0, rows) on an emulated warp, every lane on its own thread: the
/// device's grid-stride loop of one warp (any other launch shape gives the same results).
template <class Body>
void run_warp(std::size_t rows, const Body& body) {
  warp_state state;
  std::vector<std::jthread> lanes;
  lanes.reserve(eval::cuda::warp_size);
  for (unsigned l = 0; l < eval::cuda::warp_size; ++l)
    lanes.emplace_back([&state, &body, rows, l] {
      const emulated_team team{&state, l};
      for (std::size_t r = 0; r < rows; ++r) body(r, team);
    });
}

/// f(t, sync) on Threads threads, t = 0 .. Threads - 1, where sync() is the block's barrier
/// (__syncthreads on the device).
template <unsigned Threads, class F>
void run_block(const F& f) {
  std::barrier<> meet{std::ptrdiff_t(Threads)};
  const auto sync = [&meet] { meet.arrive_and_wait(); };
  std::vector<std::jthread> threads;
  threads.reserve(Threads);
  for (unsigned t = 0; t < Threads; ++t) threads.emplace_back([&f, &sync, t] { f(t, sync); });
}

/// One warp-wide tensor-core multiply (mma.sync m16n8k8 .tf32 for K = 8, m16n8k16 .bf16 for
/// K = 16, row.col, fp32 accumulators) over the 32 lanes' registers at once: the 16 x K and
/// K x 8 operands assembled from the PTX fragment layouts (eval::cuda::mma_tiling), and each
/// lane's four elements of D = A B + C written back into its C. The products of TF32 or BF16
/// values are exact in double and the sum is rounded once; the hardware's order of additions
/// inside one instruction is its own, so device results agree with these to the rounding of
/// the sum, not bit for bit. a(l), b(l), c(l): lane l's registers.
template <unsigned K, class AOf, class BOf, class COf>
void emulate_mma(const AOf& a, const BOf& b, const COf& c) {
  static_assert(K == 8 || K == 16, "emulate_mma: tf32 (K = 8) or bf16 (K = 16)");
  constexpr unsigned per = K / 8;  // k values per register word
  const auto value = [](std::uint32_t w, unsigned h) {
    const std::uint32_t u = per == 1 ? w : h == 0 ? w << 16 : w & 0xFFFF0000u;
    float x;
    std::memcpy(&x, &u, sizeof x);
    return double(x);
  };
  double A[16][K] = {}, B[K][8] = {};
  for (unsigned l = 0; l < eval::cuda::warp_size; ++l) {
    const eval::cuda::lane_of_warp at(l);
    for (unsigned r = 0; r < 4; ++r)
      for (unsigned h = 0; h < per; ++h) A[at.group + 8 * (r % 2)][per * (at.index + 4 * (r / 2)) + h] = value(a(l)[r], h);
    for (unsigned r = 0; r < 2; ++r)
      for (unsigned h = 0; h < per; ++h) B[per * (at.index + 4 * r) + h][at.group] = value(b(l)[r], h);
  }
  for (unsigned l = 0; l < eval::cuda::warp_size; ++l) {
    const eval::cuda::lane_of_warp at(l);
    for (unsigned r = 0; r < 4; ++r) {
      const unsigned row = at.group + 8 * (r / 2), col = 2 * at.index + r % 2;
      double sum = c(l)[r];
      for (unsigned k = 0; k < K; ++k) sum += A[row][k] * B[k][col];
      c(l)[r] = float(sum);
    }
  }
}

}  // namespace solder::test
