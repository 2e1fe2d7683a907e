// tests/support/warp_emulation.hpp: a CUDA warp emulated on the host, 32 threads that meet at a
// barrier, as the team of eval/cuda/row.hpp's walker: the host suite runs the device's row
// bodies with the device's index arithmetic and reduction order. Also a block of threads for
// eval/cuda/total.hpp's fixed-order sum.
#pragma once

#include <array>
#include <barrier>
#include <cstddef>
#include <thread>
#include <vector>

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

}  // namespace solder::test
