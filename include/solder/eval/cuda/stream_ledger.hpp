// eval/cuda/stream_ledger.hpp: stream_ledger, the record of which streams a device buffer has
// been used on, from which its owner frees it safely: on the stream of its last use, after
// events that capture every other stream's uses. Plain host code over any stream and event
// handle types (cudaStream_t, cudaEvent_t in eval/cuda/memory.hpp; numbers in the host tests).
#pragma once

#include <cstddef>
#include <vector>

namespace solder::eval::cuda {

/// The ownership rule of a device buffer used on several streams. The buffer is allocated on a
/// stream (its first "last stream"). Each use on a stream other than the last one switches the
/// last stream, and before the new stream's work is queued, the previous stream's queued work
/// (every use on it so far) is captured by an event: use() returns the entry whose event the
/// owner records on that stream now. The buffer is freed on last(), after that stream waits for
/// every other stream's entry (for_each_wait): each was recorded after that stream's last use,
/// so the free is ordered after all of them. A stream other than the last may be destroyed
/// before the free (its event outlives it); the last stream must outlive the buffer.
///
/// Work on the buffer is noted in host order: a use is noted when the work is about to be
/// queued (solder's device tensors note one whenever their memory is taken, on the calling
/// thread's current stream). Not thread-safe: one host thread at a time notes a buffer's uses.
template <class Stream, class Event>
class stream_ledger {
 public:
  /// A stream the buffer was used on before the last stream, with the event recorded on it
  /// after its last use (`recorded` false until the owner has made and recorded one).
  struct entry {
    Stream stream;
    Event event{};
    bool recorded = false;
  };

  stream_ledger() = default;
  explicit stream_ledger(Stream home) : last_(home) {}

  /// The stream of the last use (the allocation's while there has been no other): the stream to
  /// free on.
  Stream last() const { return last_; }

  /// Notes a use on s. Null when s is the last stream (nothing to do); otherwise the entry of
  /// the previous last stream, on which the owner records (or re-records) its event now, before
  /// queuing s's work. The returned pointer is valid until the next call.
  entry* use(Stream s) {
    if (s == last_) return nullptr;
    entry* e = find(last_);
    if (!e) e = &entries_.emplace_back(entry{last_});
    last_ = s;
    return e;
  }

  /// f(const entry&) for each entry the free on last() waits for: every stream used but the
  /// last, with a recorded event.
  template <class F>
  void for_each_wait(F&& f) const {
    for (const entry& e : entries_)
      if (!(e.stream == last_) && e.recorded) f(e);
  }

  /// f(entry&) for every entry, to release their events after the free.
  template <class F>
  void for_each_entry(F&& f) {
    for (entry& e : entries_) f(e);
  }

  /// Streams other than the last one the buffer has been used on since its allocation.
  std::size_t other_streams() const {
    std::size_t n = 0;
    for (const entry& e : entries_) n += !(e.stream == last_);
    return n;
  }

 private:
  entry* find(Stream s) {
    for (entry& e : entries_)
      if (e.stream == s) return &e;
    return nullptr;
  }

  Stream last_{};
  std::vector<entry> entries_;  // empty (no allocation) until a second stream uses the buffer
};

}  // namespace solder::eval::cuda
