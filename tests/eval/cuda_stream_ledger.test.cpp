// tests/eval/cuda_stream_ledger.test.cpp: stream_ledger (eval/cuda/stream_ledger.hpp), the
// ownership rule device tensors are freed by: on the stream of their last use, after events
// capturing every other stream's uses. Checked on a model of CUDA's stream ordering: each
// stream a queue, an event the position of its queue when recorded, a wait an edge; the free
// must come after every use of the buffer, on whichever stream it was queued.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <random>
#include <vector>

#include "solder/eval/cuda/stream_ledger.hpp"

namespace {

/// Streams as queues of work, in host order. An event holds (stream, position): recorded, it
/// completes once its stream's work before that position has. A stream that waits for an
/// event runs nothing queued after the wait before the event completes.
struct stream_model {
  struct event {
    int stream;
    std::size_t position;  // work [0, position) of the stream precedes it
  };
  std::map<int, std::size_t> queued;  // work items per stream
  /// What must complete before each stream's next item: per stream, per other stream, a count.
  std::map<int, std::map<int, std::size_t>> after;

  std::size_t enqueue(int s) { return queued[s]++; }
  event record(int s) { return {s, queued[s]}; }
  void wait(int s, const event& e) {
    std::size_t& n = after[s][e.stream];
    n = std::max(n, e.position);
    ++queued[s];  // the wait is an item of its own
  }
  /// Whether item `item` of stream `s` is ordered before everything queued on `t` from now on.
  bool ordered_before_next(int s, std::size_t item, int t) {
    if (s == t) return item < queued[t];
    return item < after[t][s];
  }
};

using ledger = solder::eval::cuda::stream_ledger<int, stream_model::event>;

/// Runs uses on the given streams (the first one allocates), then frees as a device_array does;
/// returns whether the free is ordered after every use, and the stream it is queued on.
std::pair<bool, int> run(const std::vector<int>& streams) {
  stream_model m;
  ledger l(streams.front());
  std::vector<std::pair<int, std::size_t>> uses;
  uses.emplace_back(streams.front(), m.enqueue(streams.front()));  // the allocation and zero fill
  for (std::size_t i = 1; i < streams.size(); ++i) {
    const int s = streams[i];
    if (auto* e = l.use(s)) {
      e->event = m.record(e->stream);
      e->recorded = true;
    }
    uses.emplace_back(s, m.enqueue(s));
  }
  const int last = l.last();
  l.for_each_wait([&](const ledger::entry& e) { m.wait(last, e.event); });
  bool ok = true;
  for (const auto& [s, item] : uses) ok = ok && m.ordered_before_next(s, item, last);
  return {ok, last};
}

}  // namespace

TEST_CASE("cuda stream ledger: a buffer used on one stream is freed there, waiting for nothing", "[cuda][memory]") {
  ledger l(7);
  CHECK(l.use(7) == nullptr);
  CHECK(l.use(7) == nullptr);
  CHECK(l.last() == 7);
  CHECK(l.other_streams() == 0);
  int waits = 0;
  l.for_each_wait([&](const ledger::entry&) { ++waits; });
  CHECK(waits == 0);
}

TEST_CASE("cuda stream ledger: made on one stream, last used on another: freed there, after the first's uses",
          "[cuda][memory]") {
  ledger l(1);
  ledger::entry* e = l.use(2);
  REQUIRE(e != nullptr);
  CHECK(e->stream == 1);  // the allocation's stream: its work is captured now
  e->recorded = true;
  CHECK(l.last() == 2);
  std::vector<int> waited;
  l.for_each_wait([&](const ledger::entry& w) { waited.push_back(w.stream); });
  CHECK(waited == std::vector<int>{1});

  const auto [ok, last] = run({1, 1, 2});
  CHECK(ok);
  CHECK(last == 2);
}

TEST_CASE("cuda stream ledger: back and forth over three streams, every use before the free", "[cuda][memory]") {
  ledger l(1);
  for (int s : {2, 1, 3}) {
    if (auto* e = l.use(s)) e->recorded = true;
  }
  CHECK(l.last() == 3);
  CHECK(l.other_streams() == 2);
  std::vector<int> waited;
  l.for_each_wait([&](const ledger::entry& w) { waited.push_back(w.stream); });
  std::sort(waited.begin(), waited.end());
  CHECK(waited == std::vector<int>{1, 2});
  // Stream 1 was used again after its first event: its event is recorded anew on leaving it.
  CHECK(run({1, 2, 1, 1, 3}).first);
}

TEST_CASE("cuda stream ledger: random uses over four streams, the free ordered after every one", "[cuda][memory]") {
  std::mt19937 gen(20261129);
  std::uniform_int_distribution<int> stream(0, 3), length(1, 12);
  std::size_t unordered = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int> streams(std::size_t(length(gen)));
    for (int& s : streams) s = stream(gen);
    const auto [ok, last] = run(streams);
    unordered += !ok;
    CHECK(last == streams.back());
  }
  CHECK(unordered == 0);
}
