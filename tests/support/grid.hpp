// support/grid.hpp: the CUDA backend's passes (eval/cuda/pass.hpp) run on the host over a whole
// grid, one thread after another and one barrier-separated phase after another, as the
// kernels of eval/cuda/assign.hpp run them on a GPU: the same index arithmetic, tails,
// broadcasting, random bits and summation order, tested on every machine.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "solder/eval/cuda/pass.hpp"
#include "solder/eval/cuda/product.hpp"
#include "warp_emulation.hpp"

namespace solder::test {

/// The host form of eval::cuda::device_runner, for eval::cuda::dispatch(runner, writes...).
struct host_runner {
  /// Threads of the flat walk's grid: 0 for one per item (as many as the GPU's largest grid),
  /// else a smaller grid whose threads stride over the items.
  std::size_t grid_threads = 0;
  /// The walks this runner was handed, to check which one a set of writes takes.
  int flats = 0, column_walks = 0, all_walks = 0;
  bool last_vector = false;

  template <class P>
  void flat(P& p) {
    ++flats;
    last_vector = is_vector<P>();
    const std::size_t threads = grid_threads ? grid_threads : p.flat_threads();
    for (std::size_t g = 0; g < threads; ++g) {
      P local = p;  // each thread's own evaluators, as the kernel's copy of its parameter
      auto a = local.start();
      local.flat(g, threads, a);
    }
  }

  template <class P, std::size_t... W>
  void columns(P& p, std::index_sequence<W...>) {
    using T = typename P::value_type;
    ++column_walks;
    last_vector = is_vector<P>();
    std::vector<std::vector<T>> partials(sizeof...(W), std::vector<T>(p.chunks() * P::cols));
    std::size_t k = 0;
    ((std::get<W>(p.writers).partial = partials[k++].data()), ...);
    const std::size_t blocks = p.chunks() * P::column_tiles();
    for (std::size_t b = 0; b < blocks; ++b) {
      std::vector<P> threads(eval::cuda::column_threads, p);
      std::vector<typename P::accs> accs;
      for (unsigned t = 0; t < eval::cuda::column_threads; ++t) {
        accs.push_back(threads[t].start());
        threads[t].column(b, t, accs[t]);
      }
      (combine_columns<W>(p, b, accs), ...);
    }
    (finish_columns<W>(p), ...);
  }

  template <class P, std::size_t... W>
  void all(P& p, std::index_sequence<W...>) {
    using T = typename P::value_type;
    ++all_walks;
    last_vector = is_vector<P>();
    std::vector<std::vector<T>> partials(sizeof...(W), std::vector<T>(p.all_blocks()));
    std::size_t k = 0;
    ((std::get<W>(p.writers).partial = partials[k++].data()), ...);
    const std::size_t blocks = p.all_blocks(), stride = blocks * eval::cuda::all_threads;
    for (std::size_t b = 0; b < blocks; ++b) {
      std::vector<P> threads(eval::cuda::all_threads, p);
      std::vector<typename P::accs> accs;
      for (unsigned t = 0; t < eval::cuda::all_threads; ++t) {
        accs.push_back(threads[t].start());
        threads[t].flat(b * eval::cuda::all_threads + t, stride, accs[t]);
      }
      (tree<W>(p, b, accs), ...);
    }
    (p.template all_finish<W>(), ...);
  }

 private:
  template <class P>
  static constexpr bool is_vector() {
    return []<class L, bool V, class... Ws>(std::type_identity<eval::cuda::pass<L, V, Ws...>>) { return V; }(
        std::type_identity<P>{});
  }
  template <std::size_t W, class P, class A>
  static void combine_columns(const P& p, std::size_t b, const std::vector<A>& accs) {
    std::vector<typename P::value_type> scratch(eval::cuda::row_lanes * eval::cuda::tile);
    for (unsigned t = 0; t < eval::cuda::column_threads; ++t) P::template column_deposit<W>(t, accs[t], scratch.data());
    for (unsigned c = 0; c < eval::cuda::column_threads; ++c) p.template column_combine<W>(b, c, scratch.data());
  }
  template <std::size_t W, class P>
  static void finish_columns(const P& p) {
    for (std::size_t c = 0; c < P::cols; ++c) p.template column_finish<W>(c);
  }
  template <std::size_t W, class P, class A>
  static void tree(const P& p, std::size_t b, const std::vector<A>& accs) {
    std::vector<typename P::value_type> scratch(eval::cuda::all_threads);
    for (unsigned t = 0; t < eval::cuda::all_threads; ++t) P::template all_deposit<W>(t, accs[t], scratch.data());
    for (unsigned half = eval::cuda::all_threads / 2; half > 0; half /= 2)
      for (unsigned t = 0; t < eval::cuda::all_threads; ++t) p.template all_tree<W>(t, half, scratch.data());
    p.template all_block_result<W>(b, scratch.data());
  }
};

/// A product pass (eval/cuda/product.hpp) over its whole grid, as product_kernel runs it: per
/// block, each slice staged by every thread, then accumulated by every thread (the barriers
/// between them; an mma tiling's warps on emulated lanes), then every thread's elements stored
/// through the epilogue.
template <class P>
void run_product(const P& p) {
  std::vector<float> shared(P::shared_floats);
  for (std::size_t by = 0; by < p.grid_rows(); ++by)
    for (std::size_t bx = 0; bx < p.grid_cols(); ++bx) {
      std::vector<P> threads(P::threads, p);  // each thread's copy of the kernel's parameter
      std::vector<typename P::accumulators> acc;
      for (unsigned t = 0; t < P::threads; ++t) acc.push_back(threads[t].start());
      for (std::size_t s = 0; s < p.slices(); ++s) {
        for (unsigned t = 0; t < P::threads; ++t) threads[t].stage(unsigned(bx), unsigned(by), t, s, shared.data());
        if constexpr (P::tiling::math == eval::cuda::product_math::fp32) {
          for (unsigned t = 0; t < P::threads; ++t) threads[t].accumulate(t, shared.data(), acc[t]);
        } else {
          // Warp by warp, mma step by mma step: every lane loads its fragments (the device's
          // code), then each fragment of the warp's tile is multiplied over the 32 lanes.
          using Tl = typename P::tiling;
          constexpr unsigned lanes = eval::cuda::warp_size;
          for (unsigned w = 0; w < P::threads / lanes; ++w)
            for (unsigned k0 = 0; k0 < Tl::bk; k0 += Tl::mk) {
              std::vector<typename Tl::fragments> f(lanes);
              for (unsigned l = 0; l < lanes; ++l) Tl::load(w * lanes + l, shared.data(), k0, f[l]);
              for (unsigned i = 0; i < Tl::frag_rows; ++i)
                for (unsigned j = 0; j < Tl::frag_cols; ++j)
                  emulate_mma<Tl::mk>([&](unsigned l) -> const auto& { return f[l].a[i]; },
                                      [&](unsigned l) -> const auto& { return f[l].b[j]; },
                                      [&](unsigned l) -> auto& { return acc[w * lanes + l].v[i][j]; });
            }
        }
      }
      for (unsigned t = 0; t < P::threads; ++t) threads[t].finish(unsigned(bx), unsigned(by), t, acc[t]);
    }
}

}  // namespace solder::test
