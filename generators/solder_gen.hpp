// generators/solder_gen.hpp: solder-gen, which writes a C header and a CUDA translation unit for
// each chain type it is given: the chain's device form (nn::chain_in<device, ...>) behind
// extern "C" functions that code built by any C or C++ compiler can call. The chain's type is its
// whole specification; the generator knows no layer kinds (describe.hpp reads the chain, and
// c_interface.hpp writes the same text for any chain). solder_add_cuda_chains
// (solder_cuda_chains.cmake) compiles a small program around this header and runs it at build
// time; docs/cuda.md describes the files.
#pragma once

#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <set>
#include <string>

#include "c_interface.hpp"
#include "describe.hpp"

namespace solder::gen {

/// A chain's two files.
struct files {
  std::string h, cu;
};

/// The files of chain c, whose type the header `header` declares.
inline files generate(const chain_desc& c, const std::string& header) {
  return {header_text(c, header), source_text(c, header)};
}

namespace detail {

/// Writes `text` to `path` (replacing it); false where it cannot.
inline bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  return bool(out);
}

}  // namespace detail

/// The generator program: `argv[1]` is the output directory, which gets <stem>.h and <stem>.cu
/// for every chain. Returns the exit status (1 after printing why).
inline int main(int argc, char** argv, const std::string& header, std::initializer_list<chain_desc> chains) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <output directory>\n", argc ? argv[0] : "solder-gen");
    return 1;
  }
  const std::string dir = argv[1];
  std::set<std::string> stems;
  for (const auto& c : chains) {
    if (!stems.insert(c.stem).second) {
      std::fprintf(stderr, "solder-gen: two chains would both be written to %s.cu; name them differently\n",
                   c.stem.c_str());
      return 1;
    }
  }
  for (const auto& c : chains) {
    const files f = generate(c, header);
    for (const auto& [ext, text] : {std::pair{".h", &f.h}, std::pair{".cu", &f.cu}}) {
      const std::string path = dir + "/" + c.stem + ext;
      if (!detail::write_file(path, *text)) {
        std::fprintf(stderr, "solder-gen: cannot write %s\n", path.c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace solder::gen
