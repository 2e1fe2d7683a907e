// tests/eval/cuda_product_banks.test.cpp: the product kernel's shared-memory panels
// (eval/cuda/product.hpp, panel_for) free of bank conflicts: from the pass's own index functions
// (a_store_at, b_store_at; a_load_at, b_load_at of the fp32 tiling; a_fragment_at,
// b_fragment_at of the tensor-core tilings), the banks each warp's 32 lanes hit in every store
// and every fragment load, for each tiling and each operand layout (staged along k or along
// rows). A 32-bit access is conflict-free when no bank holds two distinct words among the
// lanes' addresses; a 64-bit access (a bf16 pair of k) when no half warp's does.
#include <catch2/catch.hpp>

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "solder/assign.hpp"
#include "solder/eval/cuda/product.hpp"
#include "support/device_view.hpp"

namespace {

using namespace solder;
namespace cu = solder::eval::cuda;

constexpr unsigned banks = 32;

/// The passes a warp's access takes: the most distinct 4-byte words any bank holds among the
/// lanes' word offsets (each lane reads `words` consecutive words from its offset).
unsigned ways(const std::vector<unsigned>& offsets, unsigned words) {
  std::map<unsigned, std::set<unsigned>> by_bank;
  for (unsigned o : offsets)
    for (unsigned w = 0; w < words; ++w) by_bank[(o + w) % banks].insert(o + w);
  std::size_t most = 0;
  for (const auto& [bank, addresses] : by_bank) most = std::max(most, addresses.size());
  return unsigned(most);
}

/// The worst conflict of an access whose lane l's offset is at(l): 32-bit over the warp, 64-bit
/// (words = 2) per half warp, as the hardware serves them.
template <class At>
unsigned warp_ways(const At& at, unsigned words) {
  unsigned worst = 0;
  const unsigned group = words == 2 ? 16 : 32;
  for (unsigned first = 0; first < 32; first += group) {
    std::vector<unsigned> offsets;
    for (unsigned l = first; l < first + group; ++l) offsets.push_back(at(l));
    worst = std::max(worst, ways(offsets, words));
  }
  return worst;
}

/// The worst store and load conflicts of product pass P over all its warps.
template <class P>
std::pair<unsigned, unsigned> pass_ways() {
  using T = typename P::tiling;
  unsigned stores = 0, loads = 0;
  for (unsigned w = 0; w < P::threads / 32; ++w) {
    const unsigned t0 = w * 32;
    for (unsigned q = 0; q < P::a_per; ++q) stores = std::max(stores, warp_ways([&](unsigned l) { return P::a_store_at(q, t0 + l); }, 1));
    for (unsigned q = 0; q < P::b_per; ++q) stores = std::max(stores, warp_ways([&](unsigned l) { return P::b_store_at(q, t0 + l); }, 1));
    if constexpr (T::math == cu::product_math::fp32) {
      for (unsigned k = 0; k < T::bk; ++k) {
        for (unsigned i = 0; i < T::tm; ++i) loads = std::max(loads, warp_ways([&](unsigned l) { return T::a_load_at(t0 + l, k, i); }, 1));
        for (unsigned j = 0; j < T::tn; ++j) loads = std::max(loads, warp_ways([&](unsigned l) { return T::b_load_at(t0 + l, k, j); }, 1));
      }
    } else {
      // tf32: one 32-bit word per register; bf16: the pair of k, one 64-bit access where the
      // panel holds k contiguous (a_pairs, b_pairs), else two 32-bit ones.
      constexpr bool bf16 = T::math == cu::product_math::bf16;
      for (unsigned k0 = 0; k0 < T::bk; k0 += T::mk) {
        for (unsigned i = 0; i < T::frag_rows; ++i)
          for (unsigned r = 0; r < 4; ++r)
            for (unsigned h = 0; h < (bf16 && !T::a_pairs ? 2u : 1u); ++h)
              loads = std::max(loads, warp_ways([&](unsigned l) { return T::a_fragment_at(t0 + l, k0, i, r, h); }, T::a_pairs ? 2 : 1));
        for (unsigned j = 0; j < T::frag_cols; ++j)
          for (unsigned r = 0; r < 2; ++r)
            for (unsigned h = 0; h < (bf16 && !T::b_pairs ? 2u : 1u); ++h)
              loads = std::max(loads, warp_ways([&](unsigned l) { return T::b_fragment_at(t0 + l, k0, j, r, h); }, T::b_pairs ? 2 : 1));
      }
    }
  }
  return {stores, loads};
}

/// The pass type of tiling Tl over x W^T-like operands: A' with contiguous columns or not
/// (matrix_operand<TransA>), B' likewise. No memory is read: only the type's index functions.
template <class Tl, bool TransA, bool TransB>
using pass_of = cu::product_pass<Tl, cu::matrix_operand<TransA>, cu::matrix_operand<TransB>,
                                 write_target<float, shape<dyn, 256>, cu::accumulator_leaf<shape<dyn, 256>>, device>>;

template <class Tl>
void check_all_layouts(const char* name) {
  const auto check = [&](auto ways, const char* layout) {
    INFO(name << ", " << layout);
    CHECK(ways.first == 1);   // stores
    CHECK(ways.second == 1);  // loads
  };
  check(pass_ways<pass_of<Tl, false, false>>(), "A' k-contiguous, B' n-contiguous");
  check(pass_ways<pass_of<Tl, false, true>>(), "A' k-contiguous, B' k-contiguous (W^T)");
  check(pass_ways<pass_of<Tl, true, false>>(), "A' m-contiguous, B' n-contiguous");
  check(pass_ways<pass_of<Tl, true, true>>(), "A' m-contiguous, B' k-contiguous");
}

}  // namespace

TEST_CASE("cuda product banks: the fp32 tilings' panel stores and loads are conflict-free", "[cuda][product][banks]") {
  check_all_layouts<cu::product_tiling<64, 64, 16, 4, 4>>("fp32 64 x 64, bk 16");
  check_all_layouts<cu::product_tiling<128, 128, 8, 8, 8>>("fp32 128 x 128, bk 8");
}

TEST_CASE("cuda product banks: the tensor-core tilings' panel stores and fragment loads are conflict-free",
          "[cuda][product][banks][mma]") {
  check_all_layouts<cu::mma_tiling<64, 64, 32, 32, 32, cu::product_math::tf32>>("tf32 64 x 64");
  check_all_layouts<cu::mma_tiling<128, 128, 32, 64, 32, cu::product_math::tf32>>("tf32 128 x 128");
  check_all_layouts<cu::mma_tiling<64, 64, 32, 32, 32, cu::product_math::bf16>>("bf16 64 x 64");
  check_all_layouts<cu::mma_tiling<128, 128, 32, 64, 32, cu::product_math::bf16>>("bf16 128 x 128");
}

TEST_CASE("cuda product banks: the default tilings are the ones checked", "[cuda][product][banks]") {
  STATIC_REQUIRE(std::is_same_v<cu::product_tiling_for<256>, cu::product_tiling<128, 128, 8, 8, 8>>);
  STATIC_REQUIRE(std::is_same_v<cu::product_tiling_for<64>, cu::product_tiling<64, 64, 16, 4, 4>>);
  STATIC_REQUIRE(std::is_same_v<cu::mma_tiling_for<256, cu::product_math::tf32>,
                                cu::mma_tiling<128, 128, 32, 64, 32, cu::product_math::tf32>>);
  STATIC_REQUIRE(std::is_same_v<cu::mma_tiling_for<64, cu::product_math::bf16>,
                                cu::mma_tiling<64, 64, 32, 32, 32, cu::product_math::bf16>>);
}
