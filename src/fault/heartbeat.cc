#include "fault/heartbeat.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace kc::fault {

std::string HeartbeatKey(int rank) { return std::string(kHeartbeatPrefix) + std::to_string(rank); }

std::string ProgressKey(int rank) {
  return std::string(kHeartbeatPrefix) + "progress/" + std::to_string(rank);
}

std::string ComputeKey(int worker) {
  return std::string(kHeartbeatPrefix) + "compute/" + std::to_string(worker);
}

std::string ProgressToJson(const std::vector<comm::OpProgress>& ops, TimePoint now) {
  nlohmann::json out = nlohmann::json::array();
  for (const comm::OpProgress& p : ops) {
    nlohmann::json recent = nlohmann::json::array();
    for (const comm::OpRecord& r : p.recent) {
      nlohmann::json o = {{"op", r.op},
                          {"seq", r.seq},
                          {"bytes", r.bytes},
                          {"ago_s", std::max(0.0, Seconds(now - r.start).count())}};
      if (r.end) o["took_s"] = std::max(0.0, Seconds(*r.end - r.start).count());
      recent.push_back(std::move(o));
    }
    out.push_back({{"group", p.group},
                   {"op", p.op},
                   {"seq", p.seq},
                   {"bytes", p.bytes},
                   {"done", p.done},
                   {"for_s", Seconds(now - p.since).count()},
                   {"recent", std::move(recent)}});
  }
  return out.dump();
}

std::string HangReport(const std::map<int, std::string>& progress, double min_wait_s) {
  struct Place {
    std::string op;
    uint64_t seq = 0;
    int64_t bytes = 0;
    bool done = true;
    double for_s = 0;
  };
  // group -> worker -> its newest operation there.
  std::map<std::string, std::map<int, Place>> groups;
  std::vector<int> idle;  // workers with no communicator (yet, or between generations)
  for (const auto& [worker, text] : progress) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_array()) continue;
    if (j.empty()) idle.push_back(worker);
    for (const nlohmann::json& o : j) {
      if (!o.is_object()) continue;
      groups[o.value("group", std::string())][worker] = {.op = o.value("op", std::string()),
                                                         .seq = o.value("seq", uint64_t{0}),
                                                         .bytes = o.value("bytes", int64_t{0}),
                                                         .done = o.value("done", true),
                                                         .for_s = o.value("for_s", 0.0)};
    }
  }
  auto names = [](const std::vector<int>& ws) {
    return fmt::format("worker{} {}", ws.size() == 1 ? "" : "s", fmt::join(ws, ", "));
  };
  std::vector<std::string> lines;
  for (const auto& [group, places] : groups) {
    // The newest operation some worker waits in.
    const Place* waited = nullptr;
    for (const auto& [w, p] : places) {
      if (!p.done && !p.op.empty() && (waited == nullptr || p.seq > waited->seq)) waited = &p;
    }
    if (waited == nullptr) continue;
    std::vector<int> in, behind = idle;
    double longest = 0;
    std::string last = idle.empty() ? "" : "no communicator";
    for (const auto& [w, p] : places) {
      if (p.seq == waited->seq && !p.done && !p.op.empty()) {
        in.push_back(w);
        longest = std::max(longest, p.for_s);
      } else if (p.op.empty() || p.seq < waited->seq) {
        behind.push_back(w);
        if (last.empty() || last == "no communicator") {
          last = p.op.empty()
                     ? "nothing on it yet"
                     : fmt::format("{} #{}, {}", p.op, p.seq, p.done ? "finished" : "not finished");
        }
      }
    }
    if (longest < min_wait_s) continue;
    std::sort(behind.begin(), behind.end());
    std::string what = fmt::format("{} #{} of {} ({:.1f} MB)", waited->op, waited->seq, group,
                                   static_cast<double>(waited->bytes) / 1e6);
    if (behind.empty()) {
      lines.push_back(fmt::format("{}: {} {} in it ({:.1f} s), every worker has entered it", what,
                                  names(in), in.size() == 1 ? "waits" : "wait", longest));
    } else {
      lines.push_back(fmt::format("{}: {} {} not entered it (last: {}); {} {} in it ({:.1f} s)",
                                  what, names(behind), behind.size() == 1 ? "has" : "have", last,
                                  names(in), in.size() == 1 ? "waits" : "wait", longest));
    }
  }
  return fmt::format("{}", fmt::join(lines, "; "));
}

Result<std::unique_ptr<Heartbeat>> Heartbeat::Start(comm::Store* store, int rank, Seconds period,
                                                    std::function<std::string()> progress) {
  if (store == nullptr) return InvalidArgumentError("heartbeat: no store");
  if (!(period.count() > 0)) return InvalidArgumentError("heartbeat period: must be positive");
  KC_RETURN_IF_ERROR(store->Set(HeartbeatKey(rank), "0"));  // at once: the first beat
  // A failed Set (the store gone) is the supervisor's to notice; keep beating.
  std::unique_ptr<Heartbeat> h(
      new Heartbeat(period, [store, rank, progress = std::move(progress)](int64_t beat) {
        store->Set(HeartbeatKey(rank), std::to_string(beat)).IgnoreError();
        if (progress) store->Set(ProgressKey(rank), progress()).IgnoreError();
      }));
  h->thread_ = std::thread([p = h.get()] { p->Loop(); });
  return h;
}

Result<std::unique_ptr<Heartbeat>> Heartbeat::StartFile(std::string path, Seconds period) {
  if (!(period.count() > 0)) return InvalidArgumentError("heartbeat period: must be positive");
  KC_RETURN_IF_ERROR(TouchFile(path));
  std::unique_ptr<Heartbeat> h(
      new Heartbeat(period, [path = std::move(path)](int64_t) { TouchFile(path).IgnoreError(); }));
  h->thread_ = std::thread([p = h.get()] { p->Loop(); });
  return h;
}

Status TouchFile(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY, 0644);
  if (fd < 0) return UnavailableError(fmt::format("heartbeat file {}: {}", path, strerror(errno)));
  const int rc = futimens(fd, nullptr);  // now
  const int error = errno;
  close(fd);
  if (rc != 0) return UnavailableError(fmt::format("heartbeat file {}: {}", path, strerror(error)));
  return OkStatus();
}

std::optional<std::string> FileBeat(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return fmt::format("{}.{:09} {}", st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_size);
}

Heartbeat::~Heartbeat() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

int64_t Heartbeat::beats() const {
  MutexLock lock(&mu_);
  return beats_;
}

void Heartbeat::Loop() {
  const auto period = std::chrono::duration_cast<std::chrono::nanoseconds>(period_);
  MutexLock lock(&mu_);
  while (!stop_) {
    const int64_t beat = ++beats_;
    mu_.Unlock();
    beat_(beat);
    mu_.Lock();
    const auto until = std::chrono::steady_clock::now() + period;
    while (!stop_ && std::chrono::steady_clock::now() < until) cv_.WaitUntil(&mu_, until);
  }
}

Status ValidateHeartbeat(const HeartbeatOptions& o) {
  if (!(o.period.count() > 0) || !(o.timeout.count() > 0)) {
    return InvalidArgumentError("heartbeat period and timeout: must be positive");
  }
  if (o.timeout < 2 * o.period) {
    return InvalidArgumentError("heartbeat timeout " + std::to_string(o.timeout.count()) +
                                " s: must be at least two periods (" +
                                std::to_string(2 * o.period.count()) +
                                " s), or one late beat "
                                "would fail a healthy rank");
  }
  return OkStatus();
}

HeartbeatMonitor::HeartbeatMonitor(comm::Store* store, int ranks, HeartbeatOptions options,
                                   Clock::time_point start)
    : HeartbeatMonitor(
          [store,
           wait = std::max(options.period, Seconds(1))](int rank) -> std::optional<std::string> {
            const std::string key = HeartbeatKey(rank);
            const std::string keys[1] = {key};
            Result<bool> present = store->Check(keys);
            if (!present.ok() || !*present) return std::nullopt;
            // The key exists: the deadline only bounds the round trip.
            Result<std::string> value =
                store->Get(key, store->clock()->Now() + std::chrono::duration_cast<Duration>(wait));
            if (!value.ok()) return std::nullopt;
            return *std::move(value);
          },
          ranks, options, start) {}

HeartbeatMonitor::HeartbeatMonitor(BeatReader read, int ranks, HeartbeatOptions options,
                                   Clock::time_point start)
    : read_(std::move(read)),
      options_(options),
      last_value_(static_cast<size_t>(ranks)),
      last_change_(static_cast<size_t>(ranks), start),
      watched_(static_cast<size_t>(ranks), true),
      heard_(static_cast<size_t>(ranks), false),
      silent_for_(static_cast<size_t>(ranks), Seconds(0)) {}

void HeartbeatMonitor::Forget(int rank) { watched_.at(static_cast<size_t>(rank)) = false; }

void HeartbeatMonitor::Watch(int rank, Clock::time_point start) {
  const size_t r = static_cast<size_t>(rank);
  if (r >= watched_.size()) {
    last_value_.resize(r + 1);
    last_change_.resize(r + 1, start);
    watched_.resize(r + 1, false);
    heard_.resize(r + 1, false);
    silent_for_.resize(r + 1, Seconds(0));
  }
  watched_[r] = true;
  heard_[r] = false;
  last_change_[r] = start;
  last_value_[r].clear();
}

std::vector<int> HeartbeatMonitor::Check(Clock::time_point now) {
  std::vector<int> silent;
  for (size_t r = 0; r < watched_.size(); ++r) {
    if (!watched_[r]) continue;
    std::optional<std::string> value = read_(static_cast<int>(r));
    if (value && (!heard_[r] || *value != last_value_[r])) {
      last_value_[r] = *std::move(value);
      last_change_[r] = now;
      heard_[r] = true;
      continue;
    }
    const Seconds quiet = now - last_change_[r];
    if (quiet > (heard_[r] ? options_.timeout : std::max(options_.timeout, options_.first_beat))) {
      silent_for_[r] = quiet;
      watched_[r] = false;
      silent.push_back(static_cast<int>(r));
    }
  }
  return silent;
}

}  // namespace kc::fault
