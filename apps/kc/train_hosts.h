// `kc train` across hosts. The launcher given --hosts serves the run's store on --listen and
// supervises ranks that a share on each host starts (fault::RemoteLauncher); on each host,
// `kc train` with the same model and flags and `--share HOST --rendezvous ADDR:PORT` is that
// host's share (fault::ServeHostShare). The share takes what the launcher resolved (the plan,
// the checkpoint to resume from, the run's group) from the store, and refuses to serve a run
// whose settings differ from its own flags. Docs: docs/user-guide/train.md ("Across hosts"),
// docs/design/multi-host.md.
#pragma once

#include <string>
#include <vector>

#include "apps/kc/train_setup.h"
#include "base/status.h"
#include "base/subprocess.h"
#include "comm/store.h"
#include "fault/launcher.h"
#include "fault/remote_launcher.h"

namespace kc::app {

// The store keys' prefix of the launcher and its shares (fault/remote_launcher.h's keys).
inline constexpr char kSharePrefix[] = "kc-share/";

// --hosts "h1:2,h2:2" (a host's name and its ranks, in placement order): kInvalidArgument
// naming the flag and the entry that is wrong.
Result<std::vector<fault::RemoteHost>> ParseHostsFlag(const std::string& flag);

// The address of this machine that traffic to host:port leaves from: the one other hosts
// reach it by (the route to the launcher is the cluster's network). No packet is sent.
Result<std::string> LocalAddressTowards(const std::string& host, int port);

// --listen "ADDR" or "ADDR:PORT" (port 0 or none: any free one).
Status ParseListenFlag(const std::string& flag, std::string* address, int* port);

// Checks the flags of a launcher across hosts against `p`: the hosts hold the run's ranks
// (its --max-ranks too), and --listen is given.
// Every host of --hosts named in --inventory's topology with a device for each of its ranks.
Status CheckHostsInInventory(const hal::Topology& topology,
                             const std::vector<fault::RemoteHost>& hosts);

Status CheckHostsArgs(const TrainArgs& a, const std::vector<fault::RemoteHost>& hosts);

// Publishes what the shares read before they serve: the group, the plan and checkpoint the
// launcher resolved, what every share must agree on, the hosts and their timeout.
Status PublishRun(comm::Store& store, const TrainArgs& a, const TrainSetup& p,
                  const std::string& group, const std::vector<fault::RemoteHost>& hosts);

// The variable a launcher gives its ranks the store's token in (and a launcher and the shares
// of a run across hosts started by hand read it from).
inline constexpr char kStoreTokenVariable[] = "KC_RENDEZVOUS_TOKEN";

// The token of the run's store: the run file's, else $KC_RENDEZVOUS_TOKEN, else "" (none).
std::string StoreToken(const TrainArgs& a);
// A new random token (32 bytes, hex): a launcher's own store's on one machine.
std::string NewStoreToken();

// What a worker process of `r` runs: this binary with the flags of `a` and `p` for that worker,
// its store and group, pinned to its cores when they fit. `host` and `bind_address`, when
// given, name the host it runs on and the address its TCP transport listens on.
SubprocessOptions WorkerCommand(const TrainArgs& a, const TrainSetup& p, const fault::RankLaunch& r,
                                const std::string& store, const std::string& group,
                                const std::string& host = "", const std::string& bind_address = "");

// `kc train ... --share HOST --rendezvous ADDR:PORT`: serves that host's part of a run until it
// ends. An exit code.
int RunHostShare(TrainArgs a);

}  // namespace kc::app
