#include "apps/kc/train_hosts.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <utility>

#include "apps/kc/command.h"
#include "comm/tcp_store.h"
#include "fault/local_launcher.h"
#include "fault/runner.h"
#include "parallel/plan.h"

namespace kc::app {
namespace {

using Json = nlohmann::json;

// What a share must agree on with its launcher: everything that makes two ranks' steps the
// same computation. Paths (the model file's, the data's, the checkpoints') may differ by host.
Json Fingerprint(const TrainArgs& a, const TrainSetup& p) {
  return {{"model", fault::ModelFingerprint(p.spec)},
          {"ranks", a.ranks},
          {"steps", a.steps},
          {"global_batch", p.global_batch},
          {"micro_batches", p.micro_batches},
          {"plan", parallel::PlanToString(p.ParallelPlanFor(a.ranks))},
          {"grad_sync", a.grad_sync},
          {"grad_wire", a.grad_wire},
          {"bucket_mb", a.bucket_mb},
          {"precision", a.precision},
          {"device", a.device},
          {"transport", a.transport},
          {"checkpoint_every", a.checkpoint_every},
          {"memory_copy_every", p.memory_copy_every},
          {"min_ranks", a.min_ranks},
          {"max_ranks", a.max_ranks},
          {"heartbeat_period_s", a.heartbeat_period_s},
          {"heartbeat_timeout_s", a.heartbeat_timeout_s},
          {"inventory", p.topology != nullptr ? p.topology->name() : ""}};
}

}  // namespace

Result<std::string> LocalAddressTowards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); e != 0) {
    return InvalidArgumentError(fmt::format("--rendezvous {}: {}", host, gai_strerror(e)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> own(found, freeaddrinfo);
  const int fd = socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return UnavailableError(fmt::format("socket: {}", strerror(errno)));
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  const bool ok = connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  const int error = errno;
  close(fd);
  if (!ok) {
    return UnavailableError(fmt::format("no route to {}:{}: {}", host, port, strerror(error)));
  }
  char text[INET6_ADDRSTRLEN] = {};
  const void* addr =
      local.ss_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
          : &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr;
  inet_ntop(local.ss_family, addr, text, sizeof text);
  return std::string(text);
}

Result<std::vector<fault::RemoteHost>> ParseHostsFlag(const std::string& flag) {
  std::vector<fault::RemoteHost> hosts;
  std::set<std::string> seen;
  size_t start = 0;
  while (start <= flag.size()) {
    const size_t comma = std::min(flag.find(',', start), flag.size());
    const std::string entry = flag.substr(start, comma - start);
    start = comma + 1;
    const size_t colon = entry.rfind(':');
    fault::RemoteHost h;
    h.name = entry.substr(0, colon);
    const std::string n = colon == std::string::npos ? "" : entry.substr(colon + 1);
    auto [ptr, ec] = std::from_chars(n.data(), n.data() + n.size(), h.slots);
    if (colon == std::string::npos || h.name.empty() || ec != std::errc() ||
        ptr != n.data() + n.size() || h.slots < 1 || h.name.find('/') != std::string::npos) {
      return InvalidArgumentError(fmt::format(
          "--hosts: \"{}\" is not HOST:RANKS (a host's name and how many ranks it runs, e.g. "
          "--hosts h1:2,h2:2)",
          entry));
    }
    if (!seen.insert(h.name).second) {
      return InvalidArgumentError(fmt::format("--hosts: host {} is given twice", h.name));
    }
    hosts.push_back(std::move(h));
  }
  return hosts;
}

Status ParseListenFlag(const std::string& flag, std::string* address, int* port) {
  *port = 0;
  const size_t colon = flag.rfind(':');
  // An IPv6 address has colons of its own: a port follows only "]:".
  if (colon == std::string::npos || (flag.find(':') != colon && flag[colon - 1] != ']')) {
    *address = flag;
  } else {
    Status s = ParseHostPort(flag, address, port);
    if (!s.ok())
      return InvalidArgumentError(fmt::format("--listen: \"{}\" is not ADDR[:PORT]", flag));
  }
  if (address->size() > 2 && address->front() == '[')
    *address = address->substr(1, address->size() - 2);
  if (address->empty()) return InvalidArgumentError("--listen: no address");
  return OkStatus();
}

Status CheckHostsInInventory(const hal::Topology& topology,
                             const std::vector<fault::RemoteHost>& hosts) {
  const std::vector<hal::HostSpec>& specs = topology.hosts();
  for (const fault::RemoteHost& h : hosts) {
    const auto spec = std::find_if(specs.begin(), specs.end(),
                                   [&](const hal::HostSpec& s) { return s.name == h.name; });
    if (spec == specs.end()) {
      return InvalidArgumentError(fmt::format(
          "--hosts: host {} is not in --inventory's topology {} (name the hosts as it does)",
          h.name, topology.name()));
    }
    int devices = 0;
    for (int d = 0; d < topology.num_devices(); ++d) {
      devices += topology.host_of(d) == static_cast<int>(spec - specs.begin());
    }
    if (devices < h.slots) {
      return InvalidArgumentError(
          fmt::format("--hosts: host {} runs {} ranks, and --inventory's topology {} gives it {} "
                      "device{}",
                      h.name, h.slots, topology.name(), devices, devices == 1 ? "" : "s"));
    }
  }
  return OkStatus();
}

Status CheckHostsArgs(const TrainArgs& a, const std::vector<fault::RemoteHost>& hosts) {
  if (a.listen.empty() == a.rendezvous.empty()) {
    return InvalidArgumentError(
        "--hosts needs --listen ADDR[:PORT] (the address of this machine where the hosts reach "
        "the run's store) or --rendezvous ADDR:PORT (a store served elsewhere, as kcd serves "
        "one for each run), one of them");
  }
  if (!a.share.empty()) {
    return InvalidArgumentError(
        "--hosts starts the run's launcher; --share a host's share of it: give one or the other");
  }
  int slots = 0;
  for (const fault::RemoteHost& h : hosts) slots += h.slots;
  // With --resize-file the hosts of a larger size come with it (kcd's grow).
  const int need = a.resize_file.empty() ? std::max(a.ranks, a.max_ranks) : a.ranks;
  if (slots < need) {
    return InvalidArgumentError(fmt::format("--hosts: {} rank slots for {} ranks{}", slots, need,
                                            a.max_ranks > a.ranks ? " (--max-ranks)" : ""));
  }
  if (a.host_timeout_s <= 0) return InvalidArgumentError("--host-timeout: must be above 0");
  return OkStatus();
}

Status PublishRun(comm::Store& store, const TrainArgs& a, const TrainSetup& p,
                  const std::string& group, const std::vector<fault::RemoteHost>& hosts) {
  Json h = Json::array();
  for (const fault::RemoteHost& host : hosts)
    h.push_back({{"name", host.name}, {"slots", host.slots}});
  const Json run = {{"group", group},     {"plan", a.plan},
                    {"resume", a.resume}, {"fingerprint", Fingerprint(a, p)},
                    {"hosts", h},         {"host_timeout_s", a.host_timeout_s}};
  return store.Set(std::string(kSharePrefix) + "run", run.dump());
}

std::string StoreToken(const TrainArgs& a) {
  if (!a.store_token.empty()) return a.store_token;
  const char* env = std::getenv(kStoreTokenVariable);
  return env != nullptr ? env : "";
}

std::string NewStoreToken() {
  unsigned char raw[32];
  size_t got = 0;
  while (got < sizeof raw) {
    const ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
    if (n <= 0) return "";  // no token: the store takes any client, as before
    got += static_cast<size_t>(n);
  }
  std::string out;
  for (unsigned char b : raw) out += fmt::format("{:02x}", b);
  return out;
}

SubprocessOptions WorkerCommand(const TrainArgs& a, const TrainSetup& p, const fault::RankLaunch& r,
                                const std::string& store, const std::string& group,
                                const std::string& host, const std::string& bind_address) {
  SubprocessOptions o{
      .path = "/proc/self/exe",
      .argv = WorkerArgv(a, p, r.worker, store, group),
      .env = {{"OPENBLAS_NUM_THREADS", std::to_string(p.blas_threads)}, {"OMP_NUM_THREADS", "1"}},
      // Started from the launcher's main thread: a launcher killed with SIGKILL
      // takes its workers with it.
      .die_with_parent = true};
  if (r.join) o.argv.push_back("--elastic-join");
  if (!a.store_token.empty()) o.env.emplace_back(kStoreTokenVariable, a.store_token);
  if (!host.empty()) o.argv.insert(o.argv.end(), {"--worker-host", host});
  if (!bind_address.empty()) o.argv.insert(o.argv.end(), {"--bind-address", bind_address});
  // Pinned to its cores when they fit (a replacement to those its id would have had).
  for (int i = 0; i < p.threads && p.pin; ++i) {
    o.cpus.push_back(p.cpus[static_cast<size_t>(r.worker * p.threads + i) % p.cpus.size()]);
  }
  return o;
}

int RunHostShare(TrainArgs a) {
  auto fail = [&](const std::string& what, int code) {
    std::cerr << "kc train: --share " << a.share << ": " << what << "\n";
    return code;
  };
  if (a.rendezvous.empty())
    return fail("needs --rendezvous ADDR:PORT (the launcher's --listen)", kExitBadInput);
  if (!a.hosts.empty() || !a.listen.empty()) {
    return fail("--hosts and --listen are the launcher's: a share takes the hosts from it",
                kExitBadInput);
  }
  std::string host;
  int port = 0;
  if (Status s = ParseHostPort(a.rendezvous, &host, &port); !s.ok() || port == 0) {
    return fail(fmt::format("--rendezvous: \"{}\" is not ADDR:PORT", a.rendezvous), kExitBadInput);
  }
  const Duration timeout = SecondsToDuration(a.timeout_s);
  a.store_token = StoreToken(a);
  // Calls fail fast: a share cut off from the store must notice within its fence.
  Result<std::unique_ptr<comm::TcpStoreClient>> client =
      comm::TcpStoreClient::Connect(host, port, Clock::Real()->Now() + timeout,
                                    {.timeout = std::chrono::seconds(1), .token = a.store_token});
  if (!client.ok()) return fail(std::string(client.status().message()), kExitFailure);
  // The run as its launcher published it. A host the run grows onto may start before the
  // launcher has published the run's new hosts (kcd orders both at once): it looks again
  // until it is one of them, for up to kListedWait (or --timeout if shorter).
  constexpr double kListedWaitS = 10;
  const double listed_wait_s = std::min(a.timeout_s, kListedWaitS);
  const TimePoint deadline = Clock::Real()->Now() + SecondsToDuration(listed_wait_s);
  bool said = false;
  Json run;
  fault::RemoteHost self{.name = a.share};
  for (;;) {
    Result<std::string> published =
        (*client)->Get(std::string(kSharePrefix) + "run", Clock::Real()->Now() + timeout);
    if (published.status().code() == ErrorCode::kPermissionDenied) {
      return fail(fmt::format("the run's store at {} refused this host: give it the launcher's "
                              "token in ${} ({})",
                              a.rendezvous, kStoreTokenVariable, published.status().message()),
                  kExitBadInput);
    }
    if (!published.ok()) {
      return fail(fmt::format("no run to join at {} within {:.0f} s (--timeout): {}", a.rendezvous,
                              a.timeout_s, published.status().message()),
                  kExitFailure);
    }
    run = Json::parse(*published, nullptr, /*allow_exceptions=*/false);
    if (!run.is_object() || !run.contains("group") || !run.contains("fingerprint") ||
        !run.contains("hosts")) {
      return fail(fmt::format("{} serves no kc train run", a.rendezvous), kExitFailure);
    }
    bool listed = false;
    std::vector<std::string> names;
    for (const Json& h : run["hosts"]) {
      names.push_back(h.value("name", std::string()));
      if (names.back() == a.share) {
        listed = true;
        self.slots = h.value("slots", 1);
      }
    }
    if (listed) break;
    if (Clock::Real()->Now() >= deadline) {
      return fail(fmt::format("the run's hosts are {}: this host is none of them (waited {:.0f} s "
                              "for the launcher to add it)",
                              fmt::join(names, ", "), listed_wait_s),
                  kExitBadInput);
    }
    if (!std::exchange(said, true)) {
      std::cout << fmt::format(
          "kc train: --share {}: not one of the run's hosts ({}) yet; waiting up to {:.0f} s for "
          "its launcher to add it\n",
          a.share, fmt::join(names, ", "), listed_wait_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // What the launcher resolved, so every host runs the same.
  a.plan = run.value("plan", a.plan);
  a.resume = run.value("resume", a.resume);
  Result<TrainSetup> setup = CheckTrainArgs(&a);
  if (!setup.ok()) return fail(std::string(setup.status().message()), kExitBadInput);
  const TrainSetup& p = *setup;
  if (p.topology != nullptr) {
    if (Status s = CheckHostsInInventory(*p.topology, {self}); !s.ok()) {
      return fail(std::string(s.message()), kExitBadInput);
    }
  }
  const Json mine = Fingerprint(a, p);
  if (mine != run["fingerprint"]) {
    std::vector<std::string> differ;
    for (auto& [key, value] : run["fingerprint"].items()) {
      if (!mine.contains(key) || mine[key] != value) {
        differ.push_back(fmt::format("{} (the launcher's {}, this host's {})", key, value.dump(),
                                     mine.contains(key) ? mine[key].dump() : "none"));
      }
    }
    return fail(fmt::format("this host's flags differ from the launcher's: {}; give every host "
                            "the same model and flags",
                            fmt::join(differ, "; ")),
                kExitBadInput);
  }
  Result<std::string> address = LocalAddressTowards(host, port);
  if (!address.ok()) return fail(std::string(address.status().message()), kExitFailure);
  const std::string group = run["group"].get<std::string>();
  signal(SIGPIPE, SIG_IGN);
  Result<std::unique_ptr<fault::LocalLauncher>> launcher =
      fault::LocalLauncher::Create({.command = [&](const fault::RankLaunch& r) {
        return WorkerCommand(a, p, r, a.rendezvous, group, a.share, *address);
      }});
  if (!launcher.ok()) return fail(std::string(launcher.status().message()), kExitFailure);
  std::cerr << fmt::format(
      "kc train: --share {}: serving its ranks of the run at {} (this host "
      "is {} to the others)\n",
      a.share, a.rendezvous, *address);
  std::unique_ptr<comm::Store> view = comm::WithPrefix(client->get(), kSharePrefix);
  const Duration host_timeout = SecondsToDuration(run.value("host_timeout_s", 2.0));
  Status served = fault::ServeHostShare({.store = view.get(),
                                         .host = a.share,
                                         .launcher = launcher->get(),
                                         .beat_period = host_timeout / 8,
                                         .fence_after = host_timeout});
  launcher->reset();
  if (!served.ok()) return fail(std::string(served.message()), kExitFailure);
  std::cerr << fmt::format("kc train: --share {}: the run is over\n", a.share);
  return kExitOk;
}

}  // namespace kc::app
