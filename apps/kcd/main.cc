// kcd: the Kuangchao control plane for one cluster (docs/operations/cluster.md). Serves the
// API over TLS from a directory `kc init` made, until SIGTERM or SIGINT.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "api/client.h"
#include "api/control_plane.h"
#include "apps/strict_numbers.h"

int main(int argc, char** argv) {
  kc::api::UseSystemResolver();
  CLI::App app{"kcd: the Kuangchao control-plane daemon", "kcd"};
  kc::api::KcdOptions o;
  app.add_option("--dir", o.dir, "The cluster directory (made by kc init)")->required();
  app.add_option("--listen", o.listen, "Address to serve on (default 127.0.0.1:7470; port 0: any)");
  app.add_option(
      "--agent-lost-after", o.agent_lost_after_s,
      "Seconds of silence after which an agent's jobs go back to the queue (default 10)");
  app.add_option("--check-period", o.check_period_s,
                 "Seconds between a running job's execution-time permission checks (default 1)");
  app.add_option("--max-jobs-per-user", o.max_jobs_per_user,
                 "Jobs one user may have that have not ended (default 100)");
  app.add_option("--max-log-bytes", o.max_log_bytes_per_job,
                 "Output kept per job, the newest (default 16 MiB)");
  app.add_option("--max-request-bytes", o.max_request_bytes,
                 "Largest request kcd reads (default 4 MiB)");
  app.add_option("--max-calls-per-caller", o.max_calls_in_flight_per_caller,
                 "Calls one caller may have in progress at once (default 64)");
  app.add_option("--max-streams-per-connection", o.max_streams_per_connection,
                 "Calls at once on one connection (default 100)");
  app.add_option("--max-idle", o.max_connection_idle_s,
                 "Seconds after which an idle connection is closed (default 600)");
  app.add_option("--max-threads", o.max_threads,
                 "Threads serving calls, all callers together (default 64)");
  app.add_option("--metrics-listen", o.metrics_listen,
                 "Serve Prometheus metrics (GET /metrics, plaintext, no login) on HOST:PORT "
                 "(port 0: any); default: none");
  app.add_flag("--insecure-loopback", o.insecure_loopback,
               "Plaintext instead of TLS, for development; only on a loopback address");
  kc::app::RefuseLooseNumbers(app);
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
  if (const std::string url = (*kcd)->metrics_url(); !url.empty()) {
    std::printf("kcd: metrics on %s\n", url.c_str());
  }
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  (*kcd)->Shutdown();
  std::printf("kcd: stopped (signal %d)\n", sig);
  return 0;
}
