// `kc train`'s flags and what they resolve to before any worker starts: the checks (the model
// file, the layout, the data), the plan, the checkpoint to resume from, the cores, and how the
// launcher and its workers pass them on.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "comm/comm_limits_config.h"
#include "comm/communicator.h"
#include "fault/elastic.h"
#include "hal/topology.h"
#include "parallel/data/loader.h"
#include "parallel/model_spec.h"
#include "parallel/plan.h"
#include "parallel/precision.h"
#include "parallel/trainer.h"

namespace kc::app {

// The flags (docs/user-guide/train.md).
struct TrainArgs {
  std::string config;
  int ranks = 0;             // 0: the plan's t*p*d, else 1
  std::string plan;          // a plan file or its flag form
  int threads_per_rank = 0;  // 0: the allowed cores / ranks
  int64_t steps = 300;
  int64_t global_batch = 0;  // sequences; 0: replicas * batch_per_rank
  std::string data = "data/fortunes/manifest.json";
  std::string out;  // default runs/<model name>
  std::string metrics;
  std::string plot;
  int64_t eval_every = -1;  // -1: steps / 5; 0: only at the end
  int64_t eval_batches = 4;
  std::string grad_sync = "bucketed";
  std::string grad_wire = "fp32";  // what gradient all-reduces send: fp32, or bf16
  double bucket_mb = 2;
  std::string transport = "auto";
  std::string device = "cpu";      // cpu, or cuda: one GPU per rank
  std::string precision = "fp32";  // fp32, or bf16 (cuda)
  std::string trace;
  std::string export_dir;
  std::string progress = "auto";
  double timeout_s = 300;
  // "RANK:STEP": that rank dies (exit 86, no clean-up) before that step (1-based): how tests
  // and drills check that one worker's death stops the job.
  std::string inject_fault;
  // Checkpoints (docs/user-guide/checkpoints.md).
  std::string checkpoint_dir;
  std::string checkpoint_every = "0";  // steps (0: after the last step only), or auto
  double mtbf_hours = 0;               // for auto: mean time between failures or preemptions
  // For auto, instead: a file ({"mtbf_s": S, "source": WHO}) read again at each re-estimate,
  // which a cluster agent keeps current with the scheduler's advice.
  std::string advice_file;
  // The admin's comm limits file (comm/comm_limits_config.h): the rate limit of its entry for
  // this run's name (the model's) or its default, and its lanes, for every rank's communicator.
  std::string comm_limits;
  int checkpoint_keep = 3;
  bool checkpoint_compress = false;
  int checkpoint_full_every = 8;  // fault::CheckpointOptions::full_every
  // In-memory copies of each rank's state on a rank of another host (fault/memory_copy.h):
  // steps between copies, 0 (none) or auto (every 10 steps when a loss can take every
  // replica of a stage or tensor-parallel rank: an elastic run with t * p > 1 without ZeRO).
  std::string memory_copy_every = "auto";
  std::string resume = "auto";  // auto, never, or a checkpoint's directory
  // Failure detection: a rank silent this long (no heartbeat) is declared failed.
  double heartbeat_period_s = 1;
  double heartbeat_timeout_s = 30;
  // Elasticity (docs/user-guide/elastic.md): below --ranks down to min_ranks the survivors of
  // a failure go on; max_restarts replacement workers may be started to grow back.
  int min_ranks = 0;  // 0: --ranks (not elastic)
  int max_restarts = 0;
  // The most workers an elastic run grows to (0: --ranks), and a file {"ranks": N} kc agent
  // keeps current with the scheduler's grow and shrink, followed by the run (Supervisor::Resize).
  int max_ranks = 0;
  std::string resize_file;
  std::string fault_log;  // fault events, JSONL; default <out>/faults.jsonl
  // A run file (kc.v1.TrainRun, as kc agent writes it): the job and this run's assignment set
  // the model, the size, the plan, steps, global batch, elasticity, checkpoint policy,
  // heartbeats and comm limits (ApplyTrainRun); the flags for those are refused with it.
  std::string job_file;
  std::vector<std::string> job_flags_given;  // those flags, as given on the command line
  // Typed reports (kc.v1.TrainReport, length-delimited) appended here for whoever follows the
  // run: kc agent.
  std::string reports;
  // From the run file: the model's text (config names it in errors), the run's id and its
  // comm limits.
  std::string model_yaml;
  std::string run_id;
  std::optional<comm::RateLimit> job_rate_limit;
  comm::LaneOptions job_lanes;
  // Across hosts (train_hosts.h): the launcher given --hosts ("h1:2,h2:2") serves the run's
  // store on --listen (ADDR or ADDR:PORT) and supervises ranks that a share on each host starts
  // (--share HOST --rendezvous ADDR:PORT); a host silent for host_timeout_s is taken for lost.
  std::string hosts;
  std::string listen;
  std::string share;
  std::string rendezvous;
  double host_timeout_s = 2;
  // Across hosts: the cluster's inventory (hosts named as in --hosts): each rank takes a device
  // of its host's in it, and the collectives choose their algorithm by its cost model.
  std::string inventory;
  std::string inventory_text;  // from a run file: the cluster's inventory, as text
  // Internal: set by the launcher for its workers.
  bool elastic_join = false;  // a replacement: joins a later generation
  std::string worker_host;    // the host it runs on (ranks of one host share memory)
  // The secret every client of the run's store says first: the run file's, else
  // $KC_RENDEZVOUS_TOKEN (train_hosts.h's StoreToken); the launcher passes it to its ranks
  // by that variable, never on a command line.
  std::string store_token;
  std::string bind_address;  // what its TCP transport listens on: one other hosts reach
  int worker_rank = -1;
  std::string store;
  std::string group;
  int has_validation = -1;  // the launcher found a val split (1) or not (0)
};

// What the flags resolve to, checked before any worker starts.
struct TrainSetup {
  // --inventory: the topology every rank's communicator chooses its collectives by.
  std::shared_ptr<const hal::Topology> topology;
  // --comm-limits: the limit and lanes every rank's communicator gets.
  std::optional<comm::RateLimit> rate_limit;
  comm::LaneOptions lanes;
  // batch_per_rank: the micro-batch, sequences per pass (without a plan: the global batch over
  // the ranks, rounded down; the ranks' shares may differ by one).
  parallel::ModelSpec spec;
  int64_t micro_batches = 1;  // per step per rank
  int zero_stage = 0;
  int tensor_parallel = 1;  // the plan's t
  int pipeline_stages = 1;  // the plan's p
  parallel::Schedule schedule = parallel::Schedule::k1F1B;
  int virtual_stages = 1;                  // the plan's v
  bool recompute = false;                  // the plan's activation recompute
  int64_t global_batch = 0;                // sequences per step over all replicas
  std::optional<double> predicted_step_s;  // --plan auto: the planner's prediction
  int threads = 1;                         // cores per rank
  // How a rank uses its cores: threads that each take whole sequences of the batch, with
  // single-threaded products (the default when the batch has a sequence per thread), or one
  // thread whose products use all the cores.
  int compute_threads = 1;
  int blas_threads = 1;
  std::vector<int> cpus;  // the cores this process may use
  bool pin = false;       // ranks * threads fit the cores: each rank gets its own
  bool validation = false;
  int64_t eval_every = 0;
  int64_t checkpoint_every = 0;   // steps; 0 with mtbf_s: Young/Daly
  int64_t memory_copy_every = 0;  // steps; 0: none (--memory-copy-every resolved)
  double mtbf_s = 0;
  int fault_rank = -1;  // --inject-fault
  int64_t fault_step = 0;
  // exit (status 86), kill (SIGKILL), stop (SIGSTOP: silent), or kill-in-forward,
  // kill-in-allreduce, kill-in-persist (SIGKILL at that point of the step)
  std::string fault_how = "exit";
  bool elastic = false;  // --min-ranks below --ranks, or below --max-ranks
  bool cuda = false;     // --device cuda
  int gpus = 0;  // CUDA devices visible (the launcher's count; ranks share them round robin)
  parallel::Precision precision = parallel::Precision::kFp32;
  parallel::GradSync grad_sync = parallel::GradSync::kBucketed;
  comm::WireFormat grad_wire = comm::WireFormat::kNative;
  comm::TransportKind transport = comm::TransportKind::kAuto;

  // The plan of these fields for `ranks` ranks (d = ranks / (t * p)).
  parallel::ParallelPlan ParallelPlanFor(int ranks) const;
};

// The flags whose values a run file (--job) sets: refused beside it on the command line, and
// not repeated to the workers, which read the same file. `value`: the flag takes one.
struct RunFileFlag {
  std::string_view name;
  bool value = true;
};
inline constexpr RunFileFlag kRunFileFlags[] = {{"--ranks"},
                                                {"--plan"},
                                                {"--steps"},
                                                {"--global-batch"},
                                                {"--checkpoint-every"},
                                                {"--mtbf"},
                                                {"--checkpoint-keep"},
                                                {"--checkpoint-compress", false},
                                                {"--memory-copy-every"},
                                                {"--grad-wire"},
                                                {"--comm-limits"},
                                                {"--heartbeat-period"},
                                                {"--heartbeat-timeout"},
                                                {"--min-ranks"},
                                                {"--max-ranks"},
                                                {"--max-restarts"}};

// Fills `args` from its run file (--job), the launcher's and each worker's alike. Errors:
// the file unreadable or not a run, a flag the run file sets given as well, a job that is not
// a model job.
Status ApplyTrainRun(TrainArgs* args);

// The model `args` trains: its file, or the run file's text.
Result<parallel::ModelSpec> LoadTrainModel(const TrainArgs& args);

// The checks of `kc train` that need no worker: the model file, the layout, the data. Fills
// in args->ranks from the plan when --ranks is not given.
Result<TrainSetup> CheckTrainArgs(TrainArgs* args);

// `--plan auto`: the planner's choice for this machine, among the plans kc train runs, written
// back into args->plan in the flag form (the workers get that plan, not "auto"). Returns the
// predicted step time.
Result<double> ResolveAutoPlan(TrainArgs* args);

// Picks the checkpoint to start from: with --resume auto the newest in --checkpoint-dir that
// verifies (saying which newer ones are corrupt), with a path that one (verified). Leaves
// a->resume "never" or a checkpoint directory, for the workers. `*done_at`: with --resume auto,
// the step of a checkpoint found that already reaches --steps (a run killed after its last
// checkpoint, started again: nothing is left to train), else -1.
Status ResolveResume(TrainArgs* a, int64_t* done_at);

// The cores this process may use, NUMA node by node (L1's probe), so that consecutive ranks,
// a tensor-parallel group among them, share a node's memory and caches where they fit in one.
std::vector<int> AllowedCpus();

parallel::LoaderOptions DataOptions(const TrainArgs& a, const std::string& split);

// The elastic shape of the run: what stays when generations change.
fault::ElasticShape ShapeOf(const TrainArgs& a, const TrainSetup& s);

// A worker's command line: this binary as worker `worker` of the launcher's store and group.
std::vector<std::string> WorkerArgv(const TrainArgs& a, const TrainSetup& s, int worker,
                                    const std::string& store, const std::string& group);

// A worker process (--worker-rank): its rank of every generation it is a member of
// (fault::ElasticWorker). Returns the exit code.
int RunTrainWorker(const TrainArgs& a, const TrainSetup& s);

}  // namespace kc::app
