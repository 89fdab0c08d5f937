#include "fault/remote_launcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "base/log.h"
#include "base/mutex.h"
#include "fault/reports.h"

namespace kc::fault {
namespace {

using Json = nlohmann::json;

std::string SessionKey(const std::string& host) { return fmt::format("hosts/{}/session", host); }
std::string SessionPrefix(const std::string& host, int64_t session) {
  return fmt::format("hosts/{}/{}/", host, session);
}

// Whether `key` exists now; false when the store cannot say.
bool Has(comm::Store& store, const std::string& key) {
  const std::string keys[] = {key};
  Result<bool> has = store.Check(keys);
  return has.ok() && *has;
}

// The value of a key known to exist, without waiting long for it.
Result<std::string> Read(comm::Store& store, const std::string& key) {
  return store.Get(key, store.clock()->Now() + std::chrono::seconds(5));
}

double SecondsOf(Duration d) { return std::chrono::duration<double>(d).count(); }

// Names that can be store keys, each once, with slots (or none, where `zero_slots_ok`).
Status CheckHosts(const std::vector<RemoteHost>& hosts, bool empty_ok, bool zero_slots_ok) {
  if (hosts.empty() && !empty_ok) return InvalidArgumentError("remote launcher: no hosts");
  std::set<std::string> names;
  for (const RemoteHost& h : hosts) {
    if (h.name.empty() || h.name.find('/') != std::string::npos) {
      return InvalidArgumentError(fmt::format("remote launcher: bad host name '{}'", h.name));
    }
    if (h.slots < (zero_slots_ok ? 0 : 1)) {
      return InvalidArgumentError(fmt::format("remote launcher: host {} has no slots", h.name));
    }
    if (!names.insert(h.name).second) {
      return InvalidArgumentError(fmt::format("remote launcher: host {} given twice", h.name));
    }
  }
  return OkStatus();
}

Json ExitJson(const RankExit& e) {
  return {{"ok", e.ok}, {"killed", e.killed}, {"description", e.description}};
}

}  // namespace

class RemoteLauncher::Impl {
 public:
  explicit Impl(RemoteLauncherOptions o)
      : o_(std::move(o)), spec_(o_.hosts), hosts_(o_.hosts.size()) {}
  ~Impl() {
    Finish();
    const TimePoint until = o_.clock->Now() + std::chrono::seconds(2);
    {
      // The end orders go out before the thread stops (for a while: a store gone is no reason
      // to hang).
      MutexLock lock(&mu_);
      while (PendingOrders() && o_.clock->Now() < until) {
        o_.clock->WaitUntil(&cv_, &mu_, std::min(until, o_.clock->Now() + o_.poll));
      }
      stopped_ = true;
      cv_.SignalAll();
    }
    if (thread_.joinable()) thread_.join();
    AwaitEndsRead(until);
  }

  void StartThread() {
    thread_ = std::thread([this] { Loop(); });
  }

  Status Start(const RankLaunch& launch, RankEvents* events) {
    MutexLock lock(&mu_);
    int h = -1;
    if (!launch.join) {
      int position = launch.worker;
      for (size_t i = 0; i < spec_.size() && h < 0; ++i) {
        if (position < spec_[i].slots) h = static_cast<int>(i);
        position -= spec_[i].slots;
      }
    } else {
      // A host that is up first; else one given slots (SetHosts) whose share is coming up.
      h = MostFree([](const HostState& s) { return s.up; });
      if (h < 0) h = MostFree([](const HostState& s) { return !s.up && s.awaited; });
    }
    if (h < 0) {
      return UnavailableError(
          launch.join
              ? fmt::format("worker {}: no host that is up has a free slot", launch.worker)
              : fmt::format("worker {}: beyond the hosts' {} slots", launch.worker, TotalSlots()));
    }
    workers_[launch.worker] = {.host = h, .events = events};
    Json start = {{"op", "start"}, {"worker", launch.worker}, {"join", launch.join}};
    if (!launch.env.empty()) {
      Json env = Json::array();
      for (const auto& [name, value] : launch.env) env.push_back({name, value});
      start["env"] = std::move(env);
    }
    Send(h, std::move(start));
    return OkStatus();
  }

  void Signal(int worker, RankSignal signal) {
    RankEvents* events = nullptr;
    std::string why;
    bool ok = false;
    {
      MutexLock lock(&mu_);
      auto w = workers_.find(worker);
      if (w == workers_.end() || w->second.exited) return;
      HostState& h = hosts_[static_cast<size_t>(w->second.host)];
      const std::string& name = spec_[static_cast<size_t>(w->second.host)].name;
      const bool kill = signal == RankSignal::kKill;
      if (!w->second.sent) {
        if (!kill && h.up) {
          Send(w->second.host, {{"op", "stop"}, {"worker", worker}});  // follows its start
          return;
        }
        // Not sent, and its host is not up (or a kill): its start is dropped, and it ends here.
        // A stop of a rank that never ran has nothing to save: it ends well.
        std::erase_if(h.pending, [&](const Json& o) {
          return o["op"] == "start" && o["worker"].get<int>() == worker;
        });
        ok = !kill;
        why = fmt::format("{} before it started: host {} has no share up",
                          kill ? "killed" : "stopped", name);
      } else if (h.up && w->second.session == h.session) {
        Send(w->second.host, {{"op", kill ? "kill" : "stop"}, {"worker", worker}});
        return;
      } else if (kill) {
        why = fmt::format("killed: host {} is down, its ranks are taken for lost", name);
      } else {
        return;  // a stop cannot reach it; the kill that follows ends it
      }
      w->second.exited = true;
      events = w->second.events;
    }
    events->OnExit(worker, {.ok = ok, .killed = !ok, .description = why});
  }

  void Finish() {
    MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    for (size_t h = 0; h < spec_.size(); ++h) Send(static_cast<int>(h), {{"op", "end"}});
  }

  std::string HostOf(int worker) const {
    MutexLock lock(&mu_);
    auto w = workers_.find(worker);
    return w == workers_.end() ? "" : spec_[static_cast<size_t>(w->second.host)].name;
  }

  Status SetHosts(const std::vector<RemoteHost>& hosts) {
    KC_RETURN_IF_ERROR(CheckHosts(hosts, /*empty_ok=*/true, /*zero_slots_ok=*/true));
    MutexLock lock(&mu_);
    if (finished_) return FailedPreconditionError("remote launcher: the run is over");
    for (RemoteHost& known : spec_) known.slots = 0;  // a host left out has no place any more
    for (const RemoteHost& h : hosts) {
      auto at = std::find_if(spec_.begin(), spec_.end(),
                             [&](const RemoteHost& k) { return k.name == h.name; });
      if (at == spec_.end()) {
        spec_.push_back({.name = h.name, .slots = 0});
        hosts_.emplace_back();
        at = spec_.end() - 1;
      }
      at->slots = h.slots;
    }
    for (size_t i = 0; i < spec_.size(); ++i) {
      hosts_[i].awaited = spec_[i].slots > 0 && !hosts_[i].up;
    }
    cv_.SignalAll();
    return OkStatus();
  }

  std::vector<int> Overplaced() const {
    MutexLock lock(&mu_);
    std::vector<int> out;
    for (size_t i = 0; i < spec_.size(); ++i) {
      std::vector<int> live;  // in id order: the newest last
      for (const auto& [id, w] : workers_) {
        if (w.host == static_cast<int>(i) && !w.exited) live.push_back(id);
      }
      const int excess = static_cast<int>(live.size()) - spec_[i].slots;
      if (excess > 0) out.insert(out.end(), live.end() - excess, live.end());
    }
    return out;
  }

 private:
  // What is known of a host's share (its name and slots are the options' host of its index).
  struct HostState {
    int64_t session = -1;  // the newest share's; -1: none came up yet
    bool up = false;
    // Given slots (SetHosts) while its share was not up: a share is coming, and a replacement
    // may wait for it there.
    bool awaited = false;
    int64_t beat = -1;
    TimePoint beat_seen{};
    int64_t next_order = 0;
    int64_t next_event = 0;
    std::deque<Json> pending;  // orders not yet written
  };
  struct WorkerState {
    int host = 0;
    RankEvents* events = nullptr;
    int64_t session = -1;  // the share its start was sent to
    bool sent = false;
    bool exited = false;
  };

  int Live(int host) const KC_REQUIRES(mu_) {
    int n = 0;
    for (const auto& [id, w] : workers_) n += w.host == host && !w.exited;
    return n;
  }
  int TotalSlots() const KC_REQUIRES(mu_) {
    int n = 0;
    for (const RemoteHost& h : spec_) n += h.slots;
    return n;
  }
  // The host with the most free slots of those `eligible` takes; -1: none has one.
  template <typename Eligible>
  int MostFree(Eligible eligible) const KC_REQUIRES(mu_) {
    int h = -1, most = 0;
    for (size_t i = 0; i < hosts_.size(); ++i) {
      const int free = spec_[i].slots - Live(static_cast<int>(i));
      if (eligible(hosts_[i]) && free > most) {
        most = free;
        h = static_cast<int>(i);
      }
    }
    return h;
  }
  // Until every share that is up has read the last order written to it (the end: a share
  // deletes what it read), or `until`: the store goes with the launcher's run, and a share
  // that had not read its end yet would take that for being cut off and fail.
  void AwaitEndsRead(TimePoint until) {
    std::vector<std::string> keys;
    {
      MutexLock lock(&mu_);
      for (size_t i = 0; i < hosts_.size(); ++i) {
        const HostState& h = hosts_[i];
        if (!h.up || h.next_order == 0) continue;
        keys.push_back(
            fmt::format("{}order/{}", SessionPrefix(spec_[i].name, h.session), h.next_order - 1));
      }
    }
    for (const std::string& key : keys) {
      while (Has(*o_.store, key) && o_.clock->Now() < until) {
        MutexLock lock(&mu_);
        o_.clock->WaitUntil(&cv_, &mu_, std::min(until, o_.clock->Now() + o_.poll));
      }
    }
  }
  bool PendingOrders() const KC_REQUIRES(mu_) {
    for (const HostState& h : hosts_) {
      if (h.session >= 0 && h.up && !h.pending.empty()) return true;
    }
    return false;
  }
  void Send(int host, Json order) KC_REQUIRES(mu_) {
    hosts_[static_cast<size_t>(host)].pending.push_back(std::move(order));
    cv_.SignalAll();
  }

  // The workers of `host` (of sessions before `session` when >= 0) that have not ended: they
  // end now, lost with their host.
  std::vector<std::pair<int, RankEvents*>> Lose(int host, int64_t before_session) KC_REQUIRES(mu_) {
    std::vector<std::pair<int, RankEvents*>> lost;
    for (auto& [id, w] : workers_) {
      if (w.host != host || w.exited || !w.sent) continue;
      if (before_session >= 0 && w.session >= before_session) continue;
      w.exited = true;
      lost.emplace_back(id, w.events);
    }
    return lost;
  }

  // One look at every host: new shares, beats, events, and the orders waiting for them.
  void Poll() {
    comm::Store& store = *o_.store;
    for (size_t i = 0;; ++i) {
      std::string name;
      int64_t session;
      {
        MutexLock lock(&mu_);
        if (i >= spec_.size()) break;  // hosts are only ever added (SetHosts)
        name = spec_[i].name;
        session = hosts_[i].session;
      }
      std::vector<std::pair<int, RankEvents*>> lost;
      std::string lost_why;
      // A new share of this host (it came up, or came back).
      if (Has(store, SessionKey(name))) {
        Result<std::string> s = Read(store, SessionKey(name));
        const int64_t now_session = s.ok() ? std::strtoll(s->c_str(), nullptr, 10) : -1;
        if (now_session > session) {
          MutexLock lock(&mu_);
          HostState& h = hosts_[i];
          lost = Lose(static_cast<int>(i), now_session);
          lost_why = fmt::format("host {}'s share was replaced by a new one: taken for lost", name);
          h.session = now_session;
          h.up = true;
          h.awaited = false;
          h.beat = -1;
          h.beat_seen = o_.clock->Now();
          h.next_order = 0;
          h.next_event = 0;
          session = now_session;
          KC_LOG(INFO) << "remote launcher: host " << name << " is up (share " << session << ")";
        }
      }
      if (session < 0) continue;
      const std::string prefix = SessionPrefix(name, session);
      // Its beat.
      if (Has(store, prefix + "beat")) {
        Result<std::string> b = Read(store, prefix + "beat");
        const int64_t beat = b.ok() ? std::strtoll(b->c_str(), nullptr, 10) : -1;
        MutexLock lock(&mu_);
        HostState& h = hosts_[i];
        if (h.session == session && beat != h.beat) {
          h.beat = beat;
          h.beat_seen = o_.clock->Now();
          if (!h.up) KC_LOG(INFO) << "remote launcher: host " << name << " beats again";
          h.up = true;
        }
      }
      {
        MutexLock lock(&mu_);
        HostState& h = hosts_[i];
        const Duration silent = o_.clock->Now() - h.beat_seen;
        if (h.up && silent > o_.share_timeout) {
          h.up = false;
          std::vector<std::pair<int, RankEvents*>> more = Lose(static_cast<int>(i), -1);
          lost.insert(lost.end(), more.begin(), more.end());
          lost_why = fmt::format("host {}: its share has been silent for {:.1f} s: taken for lost",
                                 name, SecondsOf(silent));
          KC_LOG(WARNING) << "remote launcher: " << lost_why;
        }
      }
      // Together: one generation leaves them all out.
      std::map<RankEvents*, std::vector<std::pair<int, RankExit>>> by_receiver;
      for (const auto& [worker, events] : lost) {
        by_receiver[events].emplace_back(
            worker, RankExit{.ok = false, .killed = true, .description = lost_why});
      }
      for (auto& [events, exits] : by_receiver) events->OnExits(std::move(exits));
      ReadEvents(static_cast<int>(i), name, session);
      WriteOrders(static_cast<int>(i), name, session);
    }
  }

  void ReadEvents(int host, const std::string& name, int64_t session) {
    comm::Store& store = *o_.store;
    const std::string prefix = SessionPrefix(name, session);
    for (;;) {
      int64_t n;
      {
        MutexLock lock(&mu_);
        if (hosts_[static_cast<size_t>(host)].session != session) return;
        n = hosts_[static_cast<size_t>(host)].next_event;
      }
      const std::string key = fmt::format("{}event/{}", prefix, n);
      if (!Has(store, key)) return;
      Result<std::string> text = Read(store, key);
      if (!text.ok()) return;
      store.Delete(key).IgnoreError();  // read: only memory is saved by deleting it
      const Json e = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
      RankEvents* events = nullptr;
      int worker = -1;
      bool exit = false;
      {
        MutexLock lock(&mu_);
        hosts_[static_cast<size_t>(host)].next_event = n + 1;
        if (!e.is_object() || !e.contains("worker") || !e["worker"].is_number_integer()) continue;
        worker = e["worker"].get<int>();
        auto w = workers_.find(worker);
        if (w == workers_.end() || w->second.exited || w->second.session != session) continue;
        events = w->second.events;
        exit = e.contains("exit");
        if (exit) w->second.exited = true;
      }
      if (exit) {
        const Json& x = e["exit"];
        events->OnExit(worker, {.ok = x.value("ok", false),
                                .killed = x.value("killed", false),
                                .description = x.value("description", std::string())});
      } else if (e.contains("output") && e["output"].is_string()) {
        events->OnOutput(worker, e["output"].get<std::string>());
      } else if (e.contains("report")) {
        if (Result<Report> r = ReportFromJson(e["report"]); r.ok()) {
          events->OnReport(worker, *std::move(r));
        }
      }
    }
  }

  void WriteOrders(int host, const std::string& name, int64_t session) {
    comm::Store& store = *o_.store;
    const std::string prefix = SessionPrefix(name, session);
    for (;;) {
      Json order;
      int64_t n;
      {
        MutexLock lock(&mu_);
        HostState& h = hosts_[static_cast<size_t>(host)];
        if (h.session != session || !h.up || h.pending.empty()) return;
        order = h.pending.front();
        n = h.next_order;
      }
      if (!store.Set(fmt::format("{}order/{}", prefix, n), order.dump()).ok()) return;  // again
      MutexLock lock(&mu_);
      HostState& h = hosts_[static_cast<size_t>(host)];
      if (h.session != session) return;
      h.pending.pop_front();
      h.next_order = n + 1;
      if (order["op"] == "start") {
        WorkerState& w = workers_[order["worker"].get<int>()];
        w.session = session;
        w.sent = true;
      }
      cv_.SignalAll();
    }
  }

  void Loop() {
    for (;;) {
      {
        MutexLock lock(&mu_);
        if (stopped_) return;
      }
      Poll();
      MutexLock lock(&mu_);
      if (stopped_) return;
      o_.clock->WaitUntil(&cv_, &mu_, o_.clock->Now() + o_.poll);
    }
  }

  const RemoteLauncherOptions o_;
  mutable Mutex mu_;
  CondVar cv_;
  std::vector<RemoteHost> spec_ KC_GUARDED_BY(mu_);  // the hosts and their slots now
  std::vector<HostState> hosts_ KC_GUARDED_BY(mu_);  // what is known of each (spec_'s index)
  std::map<int, WorkerState> workers_ KC_GUARDED_BY(mu_);
  bool finished_ KC_GUARDED_BY(mu_) = false;
  bool stopped_ KC_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

Result<std::unique_ptr<RemoteLauncher>> RemoteLauncher::Create(RemoteLauncherOptions options) {
  if (options.store == nullptr) return InvalidArgumentError("remote launcher: no store");
  KC_RETURN_IF_ERROR(CheckHosts(options.hosts, /*empty_ok=*/false, /*zero_slots_ok=*/false));
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->StartThread();
  return std::unique_ptr<RemoteLauncher>(new RemoteLauncher(std::move(impl)));
}

RemoteLauncher::RemoteLauncher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteLauncher::~RemoteLauncher() = default;
Status RemoteLauncher::Start(const RankLaunch& launch, RankEvents* events) {
  return impl_->Start(launch, events);
}
void RemoteLauncher::Signal(int worker, RankSignal signal) { impl_->Signal(worker, signal); }
void RemoteLauncher::Finish() { impl_->Finish(); }
Status RemoteLauncher::SetHosts(const std::vector<RemoteHost>& hosts) {
  return impl_->SetHosts(hosts);
}
std::vector<int> RemoteLauncher::Overplaced() const { return impl_->Overplaced(); }
std::string RemoteLauncher::HostOf(int worker) const { return impl_->HostOf(worker); }

// ---------------------------------------------------------------------------------------------
// The host's side.

namespace {

// What this host's ranks do, queued for the share's thread to write up.
class ShareEvents final : public RankEvents {
 public:
  void OnOutput(int worker, std::string line) override {
    Push({{"worker", worker}, {"output", std::move(line)}});
  }
  void OnReport(int worker, Report report) override {
    Push({{"worker", worker}, {"report", ReportToJson(report)}});
  }
  void OnExit(int worker, RankExit exit) override {
    Push({{"worker", worker}, {"exit", ExitJson(exit)}});
    MutexLock lock(&mu_);
    live_.erase(worker);
    cv_.SignalAll();
  }
  void Started(int worker) {
    MutexLock lock(&mu_);
    live_.insert(worker);
  }
  std::set<int> live() const {
    MutexLock lock(&mu_);
    return live_;
  }
  std::deque<Json> Take() {
    MutexLock lock(&mu_);
    return std::exchange(queue_, {});
  }
  void PutBack(std::deque<Json> rest) {
    MutexLock lock(&mu_);
    rest.insert(rest.end(), queue_.begin(), queue_.end());
    queue_ = std::move(rest);
  }
  // Waits until no rank is live, or until `deadline`.
  void WaitNoneLive(Clock* clock, TimePoint deadline) {
    MutexLock lock(&mu_);
    while (!live_.empty() && clock->Now() < deadline) clock->WaitUntil(&cv_, &mu_, deadline);
  }

 private:
  void Push(Json e) {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(e));
  }
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Json> queue_ KC_GUARDED_BY(mu_);
  std::set<int> live_ KC_GUARDED_BY(mu_);
};

}  // namespace

Status ServeHostShare(const HostShareOptions& o) {
  if (o.store == nullptr || o.launcher == nullptr || o.host.empty()) {
    return InvalidArgumentError("host share: needs a store, a launcher and a host name");
  }
  comm::Store& store = *o.store;
  Clock& clock = *o.clock;
  TimePoint last_ok = clock.Now();
  auto fenced = [&]() { return clock.Now() - last_ok > o.fence_after; };
  // Its session: the launcher sends this share's orders under it.
  int64_t session = -1;
  while (session < 0) {
    Result<int64_t> s = store.Add(SessionKey(o.host), 1);
    if (s.ok()) {
      session = *s;
      last_ok = clock.Now();
    } else if (fenced()) {
      return UnavailableError(fmt::format("host share {}: the run's store cannot be reached: {}",
                                          o.host, s.status().message()));
    }
  }
  const std::string prefix = SessionPrefix(o.host, session);
  ShareEvents events;
  int64_t next_order = 0, next_event = 0;
  TimePoint next_beat = clock.Now();
  bool ended = false;
  for (;;) {
    if (clock.Now() >= next_beat) {
      if (store.Add(prefix + "beat", 1).ok()) last_ok = clock.Now();
      next_beat = clock.Now() + o.beat_period;
    }
    // What its ranks did, in order (looked at after whether any is live, so that the last
    // exit is written before the share ends).
    const bool none_live = events.live().empty();
    std::deque<Json> up = events.Take();
    while (!up.empty()) {
      if (!store.Set(fmt::format("{}event/{}", prefix, next_event), up.front().dump()).ok()) break;
      last_ok = clock.Now();
      ++next_event;
      up.pop_front();
    }
    const bool all_written = up.empty();
    events.PutBack(std::move(up));
    if (ended && all_written && none_live) return OkStatus();
    if (fenced()) {
      const std::set<int> live = events.live();
      KC_LOG(WARNING) << fmt::format(
          "host share {}: the run's store has been out of reach for {:.1f} s: killing its {} "
          "rank{}",
          o.host, SecondsOf(clock.Now() - last_ok), live.size(), live.size() == 1 ? "" : "s");
      for (int w : live) o.launcher->Signal(w, RankSignal::kKill);
      events.WaitNoneLive(&clock, clock.Now() + std::chrono::seconds(30));
      return UnavailableError(
          fmt::format("host share {}: cut off from the run's store for {:.1f} s; its ranks were "
                      "killed",
                      o.host, SecondsOf(o.fence_after)));
    }
    // The next order, waiting a little for it.
    const std::string key = fmt::format("{}order/{}", prefix, next_order);
    Result<std::string> text =
        store.Get(key, std::min(next_beat, clock.Now() + std::chrono::milliseconds(20)));
    if (!text.ok()) {
      if (text.status().code() == ErrorCode::kDeadlineExceeded) {
        last_ok = clock.Now();
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // out of reach: pace retries
      }
      continue;
    }
    last_ok = clock.Now();
    store.Delete(key).IgnoreError();
    ++next_order;
    const Json order = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!order.is_object() || !order.contains("op") || !order["op"].is_string()) continue;
    const std::string op = order["op"].get<std::string>();
    if (op == "end") {
      ended = true;
      // Whatever still runs here outlived the run (its host was taken for lost meanwhile).
      for (int w : events.live()) o.launcher->Signal(w, RankSignal::kKill);
      continue;
    }
    if (!order.contains("worker") || !order["worker"].is_number_integer()) continue;
    const int worker = order["worker"].get<int>();
    if (op == "start") {
      events.Started(worker);
      RankLaunch launch{.worker = worker, .join = order.value("join", false)};
      if (order.contains("env") && order["env"].is_array()) {
        for (const Json& e : order["env"]) {
          if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
            launch.env.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
          }
        }
      }
      if (Status s = o.launcher->Start(launch, &events); !s.ok()) {
        events.OnExit(worker, {.ok = false,
                               .killed = false,
                               .description = fmt::format("did not start on host {}: {}", o.host,
                                                          s.message())});
      }
    } else if (op == "stop" || op == "kill") {
      o.launcher->Signal(worker, op == "kill" ? RankSignal::kKill : RankSignal::kStop);
    }
  }
}

}  // namespace kc::fault
