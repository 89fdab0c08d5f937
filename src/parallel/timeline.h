// What a rank did and when: spans of compute, communication and data loading, written as
// Chrome-trace / Perfetto JSON events (`kc train --trace`). One recorder per rank, filled by
// the training thread (and by the worker that runs a pass's tensor-parallel all-reduce, never
// at the same time: WorkerPool::Sync orders them); the launcher joins the ranks' events into
// one file. Spans may nest (an all-reduce inside a forward).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kc::parallel {

// Span categories, the trace's "cat": what kind of time it was.
enum class SpanKind : uint8_t { kCompute = 0, kComm = 1, kData = 2 };
const char* SpanKindName(SpanKind kind);  // "compute", "comm", "data"

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  // Room for `capacity` spans is reserved now, so recording allocates nothing until it is
  // used up (then the vector grows).
  explicit Timeline(size_t capacity = 4096) { spans_.reserve(capacity); }

  // A span [start, end) named `name` (a string literal: kept by pointer) of step `step`.
  void Add(const char* name, SpanKind kind, int64_t step, Clock::time_point start,
           Clock::time_point end) {
    spans_.push_back({name, kind, step, start, end});
    if (observer_) observer_(name, step);
  }

  // Called with each span's name and step as it is added (after the span ended); a drill hooks
  // fault injection on it (kc train --inject-fault). Empty: none.
  void set_observer(std::function<void(const char* name, int64_t step)> observer) {
    observer_ = std::move(observer);
  }

  size_t size() const { return spans_.size(); }
  void Clear() { spans_.clear(); }

  // The spans as Chrome-trace "complete" events (ph "X", microseconds of the steady clock,
  // which all processes of a machine share), pid = rank, preceded by a process_name event
  // "rank R": a comma-separated list of JSON objects with no brackets, to be joined with
  // other ranks' into {"traceEvents": [...]}.
  std::string ChromeTraceEvents(int rank) const;

  // Sums per kind over the recorded spans, in seconds.
  double Seconds(SpanKind kind) const;

 private:
  struct Span {
    const char* name;
    SpanKind kind;
    int64_t step;
    Clock::time_point start;
    Clock::time_point end;
  };
  std::vector<Span> spans_;
  std::function<void(const char*, int64_t)> observer_;
};

}  // namespace kc::parallel
