// kc diagnose --live: asks a running run where every rank is (its supervisor, from the ranks'
// heartbeats) and measures what its hosts' cores do (hal::MeasureHostLoad, here for a local
// run, by each host's agent for a kcd job); then says what that shows. Design:
// docs/design/live-inspection.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "apps/kc/diagnose_records.h"
#include "base/status.h"
#include "kc/v1/train_job.pb.h"

namespace kc::app::diagnose {

// The inventory's figure for one core of the run's devices on a host: fp32 FLOP/s. (Its
// memory bandwidth is STREAM's over arrays far past the caches, which the short copy of a live
// look is not: the copy is compared with the run's start only.)
struct InventoryRates {
  double flops = 0;
};

// What a running run said when asked, and what its hosts are doing.
struct Live {
  kc::v1::ProgressReport progress;
  std::vector<kc::v1::HostLoadReport> hosts;
  std::map<std::string, InventoryRates> inventory;  // by host: a kcd job's, from its topology
  std::vector<std::string> notes;                   // what could not be measured, and why
};

// A local run (its directory or metrics file, `r` what it recorded): the request beside its
// metrics, the answer waited for up to `wait_s`; its host's load measured here when the run is
// on this machine. kFailedPrecondition for a run that has ended, kDeadlineExceeded without an
// answer.
Result<Live> InspectRun(const std::string& run, const RunRecords& r, double wait_s);
// A kcd job: JobService.Inspect, then its records until the answers are among them (the
// supervisor's, and each host's load; those missing at `wait_s` are noted).
Result<Live> InspectJob(int64_t id, const std::string& login, double wait_s);

// The answers for people: who holds up whom and each rank's newest operations; each host's
// cores and the processes outside the run on them.
std::vector<std::string> LiveLines(const kc::v1::ProgressReport& p);
std::vector<std::string> LoadLines(const Live& live, const RunRecords& r);
// What the hosts' loads say: other work on the run's cores (L4), a core computing slower than
// at the run's start or than the inventory (L1), a copy slower than at the start (L1), a
// hypervisor taking the cores (L1).
std::vector<Finding> LoadFindings(const Live& live, const RunRecords& r);

}  // namespace kc::app::diagnose
