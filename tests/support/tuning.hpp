// tests/support/tuning.hpp: pins the CPU backend's host-dependent choices for one test, so a
// test of the streaming-store path streams on every host.
#pragma once

#include "solder/eval/cpu/tuning.hpp"

namespace solder::test {

/// While alive: outputs of stream_min_bytes_floor (8 MiB) and more are streamed, on any host.
struct stream_from_floor {
  eval::cpu::cpu_tuning previous;
  stream_from_floor() : previous(eval::cpu::set_tuning(streaming_from_floor(eval::cpu::tuning()))) {}
  ~stream_from_floor() { eval::cpu::set_tuning(previous); }
  stream_from_floor(const stream_from_floor&) = delete;
  stream_from_floor& operator=(const stream_from_floor&) = delete;

 private:
  static eval::cpu::cpu_tuning streaming_from_floor(eval::cpu::cpu_tuning t) {
    t.stream_min_bytes = eval::cpu::stream_min_bytes_floor;
    return t;
  }
};

}  // namespace solder::test
