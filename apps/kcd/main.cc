// kcd: the Kuangchao control plane for one cluster (docs/operations/cluster.md). Serves the
// API over TLS from a directory `kc init` made, until SIGTERM or SIGINT.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "api/control_plane.h"

int main(int argc, char** argv) {
  CLI::App app{"kcd: the Kuangchao control-plane daemon", "kcd"};
  kc::api::KcdOptions o;
  app.add_option("--dir", o.dir, "The cluster directory (made by kc init)")->required();
  app.add_option("--listen", o.listen, "Address to serve on (default 127.0.0.1:7470; port 0: any)");
  app.add_option(
      "--agent-lost-after", o.agent_lost_after_s,
      "Seconds of silence after which an agent's jobs go back to the queue (default 10)");
  app.add_option("--check-period", o.check_period_s,
                 "Seconds between a running job's execution-time permission checks (default 1)");
  app.add_flag("--insecure-loopback", o.insecure_loopback,
               "Plaintext instead of TLS, for development; only on a loopback address");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // A closed stdout or a client gone must not kill the daemon.
  signal(SIGPIPE, SIG_IGN);
  // Block the stop signals before gRPC starts its threads, so only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  kc::Result<std::unique_ptr<kc::api::Kcd>> kcd = kc::api::Kcd::Start(o);
  if (!kcd.ok()) {
    std::cerr << "kcd: " << kcd.status().message() << "\n";
    return kcd.status().code() == kc::ErrorCode::kUnavailable ? 1 : 2;
  }
  const std::string host = o.listen.substr(0, o.listen.rfind(':'));
  std::printf("kcd: listening on %s:%d (%s)\n", host.c_str(), (*kcd)->port(),
              o.insecure_loopback ? "plaintext, loopback only" : "TLS");
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  (*kcd)->Shutdown();
  std::printf("kcd: stopped (signal %d)\n", sig);
  return 0;
}
