// tests/support/temp_dir.hpp: a scratch directory for tests that write files.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace solder::test {

/// A scratch directory, unique to this process (the native and AVX2 binaries run at once),
/// removed with everything in it when the object goes.
struct temp_dir {
  std::filesystem::path path;
  explicit temp_dir(const std::string& tag)
      : path(std::filesystem::temp_directory_path() / ("solder_" + tag + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  /// Writes `bytes` to the file `name` in the directory; returns its path.
  std::filesystem::path write(const std::string& name, const std::string& bytes) const {
    const std::filesystem::path p = path / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
};

}  // namespace solder::test
