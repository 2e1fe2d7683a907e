// tests/cuda/memory.cu: device tensors, streams and copies (solder/device.hpp): round trips
// host -> device -> host equal bit for bit, device copies, moves, zero fill, the batch check of
// copy, stream_guard, tensors on a non-default stream, and a tensor freed on the stream it was
// last used on. Exits 77 (ctest's skip code) where no
// CUDA device is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "solder/device.hpp"
#include "support/gpu_program.hpp"

namespace {

using solder::device;
using solder::dyn;
using solder::shape;
using solder::tensor;

void expect(bool ok, const char* what, int line) {
  if (!ok) {
    ++solder::test::gpu::failures;
    std::fprintf(stderr, "tests/cuda/memory.cu:%d: failed: %s\n", line, what);
  }
}
#define EXPECT(cond) expect((cond), #cond, __LINE__)

/// Values every copy must carry unchanged: NaN, infinities, -0, subnormals, and a counter.
template <class T>
void fill_pattern(T* p, std::size_t n, int seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(seed * 1000 + int(i % 997)) / T(8);
  if constexpr (std::is_floating_point_v<T>) {
    const T special[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                         -std::numeric_limits<T>::infinity(), T(-0.0), std::numeric_limits<T>::denorm_min(),
                         -std::numeric_limits<T>::min() / T(3)};
    for (std::size_t i = 0; i < sizeof(special) / sizeof(special[0]) && i < n; ++i) p[(i * 7) % n] = special[i];
  }
}

template <class A, class B>
bool same_bits(const A& a, const B& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(*a.data())) == 0;
}

template <class T, class S>
tensor<T, S> patterned(std::size_t batch, int seed) {
  tensor<T, S> h = [&] {
    if constexpr (S::dynamic)
      return tensor<T, S>(batch, solder::uninitialized);
    else
      return tensor<T, S>(solder::uninitialized);
  }();
  fill_pattern(h.data(), h.size(), seed);
  return h;
}

template <class T, class S>
void round_trip(std::size_t batch = 1) {
  const auto h = patterned<T, S>(batch, 1);
  const tensor<T, S, device> d = solder::to_device(h);
  EXPECT(d.batch() == h.batch() && d.size() == h.size());
  EXPECT(same_bits(solder::to_host(d), h));
  // The same through views and an explicit copy.
  tensor<T, S> back = patterned<T, S>(batch, 2);
  solder::copy(d.ref(), back.ref());
  EXPECT(cudaStreamSynchronize(solder::current_stream()) == cudaSuccess);
  EXPECT(same_bits(back, h));
}

void round_trips() {
  round_trip<float, shape<4>>();
  round_trip<float, shape<3, 17>>();
  round_trip<float, shape<64, 33>>();  // over 1 KiB: the host tensor lives on the heap
  round_trip<double, shape<5, 7>>();
  round_trip<int, shape<257>>();
  round_trip<float, shape<dyn, 37>>(1);
  round_trip<float, shape<dyn, 37>>(3);
  round_trip<double, shape<dyn, 2, 5>>(17);
}

void device_copies() {
  using S = shape<dyn, 9>;
  const auto h = patterned<float, S>(5, 3);
  tensor<float, S, device> a = solder::to_device(h);

  tensor<float, S, device> b(5);
  solder::copy(a, b);
  EXPECT(same_bits(solder::to_host(b), h));

  // A copy is independent of its source.
  tensor<float, S, device> c(a);
  EXPECT(c.data() != a.data() && c.batch() == 5);
  solder::copy(patterned<float, S>(5, 4), a);
  EXPECT(same_bits(solder::to_host(c), h));

  // Copy assignment of another batch size reallocates.
  tensor<float, S, device> d(2);
  d = c;
  EXPECT(d.batch() == 5 && d.size() == c.size() && d.data() != c.data());
  EXPECT(same_bits(solder::to_host(d), h));
  tensor<float, S, device> e(5);
  const float* kept = e.data();
  e = c;  // same size: the storage is kept
  EXPECT(e.data() == kept);
  EXPECT(same_bits(solder::to_host(e), h));

  // Moves take the storage and leave an empty tensor.
  const float* storage = c.data();
  tensor<float, S, device> m(std::move(c));
  EXPECT(m.data() == storage && c.data() == nullptr && c.size() == 0);
  EXPECT(same_bits(solder::to_host(m), h));
  tensor<float, S, device> n(1);
  n = std::move(m);
  EXPECT(n.data() == storage && n.batch() == 5 && m.size() == 0);
  EXPECT(same_bits(solder::to_host(n), h));

  // Static shapes too.
  const auto hs = patterned<float, shape<8, 8>>(1, 5);
  const tensor<float, shape<8, 8>, device> s = solder::to_device(hs);
  tensor<float, shape<8, 8>, device> t = s;
  tensor<float, shape<8, 8>, device> u;
  u = t;
  EXPECT(same_bits(solder::to_host(u), hs));
}

void zero_filled() {
  const tensor<float, shape<dyn, 33>, device> a(7);
  const tensor<double, shape<5, 3>, device> b;
  const tensor<int, shape<300>, device> c;
  const auto ha = solder::to_host(a);
  const auto hb = solder::to_host(b);
  const auto hc = solder::to_host(c);
  bool zeros = true;
  for (float v : ha) zeros &= v == 0.0f && !std::signbit(v);
  for (double v : hb) zeros &= v == 0.0 && !std::signbit(v);
  for (int v : hc) zeros &= v == 0;
  EXPECT(zeros);
}

void batch_mismatch() {
  using S = shape<dyn, 4>;
  const auto before = patterned<float, S>(3, 6);
  tensor<float, S, device> dst = solder::to_device(before);
  const auto src = patterned<float, S>(2, 7);
  std::string message;
  try {
    solder::copy(src, dst);
  } catch (const solder::error& e) {
    message = e.what();
  }
  EXPECT(message.find("(2)") != std::string::npos && message.find("(3)") != std::string::npos);
  EXPECT(same_bits(solder::to_host(dst), before));  // nothing was written

  message.clear();
  tensor<float, S> host_dst(4);
  try {
    solder::copy(dst, host_dst);
  } catch (const solder::error& e) {
    message = e.what();
  }
  EXPECT(message.find("(3)") != std::string::npos && message.find("(4)") != std::string::npos);
}

void streams() {
  EXPECT(solder::current_stream() == nullptr);
  solder::stream s1;
  EXPECT(s1.get() != nullptr);
  {
    solder::stream_guard g1(s1);
    EXPECT(solder::current_stream() == s1.get() && g1.previous() == nullptr);
    {
      solder::stream s2;
      solder::stream_guard g2(s2);
      EXPECT(solder::current_stream() == s2.get() && g2.previous() == s1.get());
    }
    EXPECT(solder::current_stream() == s1.get());
  }
  EXPECT(solder::current_stream() == nullptr);

  // A moved stream keeps its handle; the source holds none.
  solder::stream a;
  const cudaStream_t raw = a;
  solder::stream b(std::move(a));
  EXPECT(b.get() == raw && a.get() == nullptr);
  a = std::move(b);
  EXPECT(a.get() == raw && b.get() == nullptr);
  a.synchronize();
}

void non_default_stream() {
  using S = shape<dyn, 129>;
  const auto h = patterned<float, S>(6, 8);
  solder::stream s;
  {
    tensor<float, S, device> outlives_guard(1);
    {
      solder::stream_guard guard(s);
      tensor<float, S, device> d = solder::to_device(h);  // allocated, copied on s
      tensor<float, S, device> z(6);                        // zero-filled on s
      solder::copy(d, z);
      EXPECT(same_bits(solder::to_host(z), h));
      outlives_guard = std::move(d);  // freed on s after the guard is gone
    }
    EXPECT(same_bits(solder::to_host(outlives_guard), h));
  }

  // An explicit stream argument. d is allocated and zero-filled on the default stream, which the
  // non-blocking s does not wait for.
  tensor<float, S, device> d(6);
  EXPECT(cudaStreamSynchronize(nullptr) == cudaSuccess);
  solder::copy(h, d, s);
  tensor<float, S> back(6);
  solder::copy(d, back, s);
  s.synchronize();
  EXPECT(same_bits(back, h));
  EXPECT(cudaDeviceSynchronize() == cudaSuccess);
}

/// A tensor made on one stream and last used on another is freed on the other, after the first
/// stream's work (eval::cuda::stream_ledger; its ordering is tested on the host).
void freed_on_last_stream() {
  using S = shape<dyn, 1024>;
  const auto h = patterned<float, S>(64, 9);
  solder::stream a, b;
  {
    solder::stream_guard on_a(a);
    tensor<float, S, device> d = solder::to_device(h);  // allocated and copied on a
    EXPECT(d.last_stream() == a.get());
    tensor<float, S, device> y(64);  // zero-filled on a
    a.synchronize();                 // d's copy and y's fill done before b reads and writes them
    {
      solder::stream_guard on_b(b);
      solder::copy(d, y);  // reads d (and writes y) on b
      EXPECT(d.last_stream() == b.get());
      EXPECT(y.last_stream() == b.get());
    }
    // Queued on b behind the copy that reads it; a would not wait for b.
    d = tensor<float, S, device>(64);
    b.synchronize();
    EXPECT(same_bits(solder::to_host(y), h));
  }
  // An explicit stream noted by hand: freed there.
  auto arr = solder::eval::cuda::device_array<float>::allocate(256, a);
  arr.used_on(b);
  EXPECT(arr.stream() == b.get());
  arr = solder::eval::cuda::device_array<float>();
  EXPECT(cudaDeviceSynchronize() == cudaSuccess);
  EXPECT(cudaGetLastError() == cudaSuccess);
}

}  // namespace

int main() {
  return solder::test::gpu::run("tests/cuda/memory.cu", "solder: device memory, streams and copies pass", [] {
    streams();
    round_trips();
    device_copies();
    zero_filled();
    batch_mismatch();
    non_default_stream();
    freed_on_last_stream();
  });
}
