// tests/cuda/no_device.cpp: solder/device.hpp in a program built by the C++ compiler alone. Without
// a CUDA device, allocating a device tensor throws cuda_error saying "no CUDA device"; with one, a
// small round trip host -> device -> host returns the same values. Passes on either machine.
#include <cstdio>
#include <cstring>
#include <exception>

#include "solder/device.hpp"

namespace {

int without_device() {
  try {
    solder::tensor<float, solder::shape<4>, solder::device> t;
    std::fputs("tests/cuda/no_device.cpp: a device tensor was allocated without a device\n", stderr);
    return 1;
  } catch (const solder::cuda_error& e) {
    if (std::strstr(e.what(), "no CUDA device") == nullptr) {
      std::fprintf(stderr, "tests/cuda/no_device.cpp: the error does not say \"no CUDA device\": %s\n", e.what());
      return 1;
    }
    std::printf("solder: no CUDA device; allocating a device tensor throws: %s\n", e.what());
    return 0;
  }
}

int with_device() {
  solder::tensor<float, solder::shape<2, 3>> h;
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = 0.25f * float(i) - 1.0f;
  const solder::tensor<float, solder::shape<2, 3>, solder::device> d = solder::to_device(h);
  const auto back = solder::to_host(d);
  if (std::memcmp(back.data(), h.data(), h.size() * sizeof(float)) != 0) {
    std::fputs("tests/cuda/no_device.cpp: the round trip host -> device -> host changed the values\n", stderr);
    return 1;
  }
  std::puts("solder: a CUDA device is present; the round trip host -> device -> host passes");
  return 0;
}

}  // namespace

int main() {
  try {
    return solder::eval::cuda::device_count() == 0 ? without_device() : with_device();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tests/cuda/no_device.cpp: unexpected exception: %s\n", e.what());
    return 1;
  }
}
