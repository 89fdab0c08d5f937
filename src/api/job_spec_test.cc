#include "api/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "api/train_job.h"
#include "tests/support/repo_root.h"
#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

using ::testing::HasSubstr;

TEST(JobSpecTest, TheExampleJobLoadsAndTravelsAsText) {
  Result<JobSpec> s = LoadJobFile(testing::RepoRoot() + "/examples/jobs/gpt-tiny.yaml");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->name, "gpt-tiny");
  EXPECT_EQ(s->ranks, 2);
  EXPECT_THAT(s->model_yaml, HasSubstr("hidden: 256"));
  Result<JobSpec> back = ParseJobSpec(JobSpecText(*s), "spec");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->model_yaml, s->model_yaml);
  EXPECT_EQ(back->steps, s->steps);
  EXPECT_EQ(back->data, s->data);
  EXPECT_EQ(JobSpecText(*back), JobSpecText(*s));
}

TEST(JobSpecTest, BadJobFilesAreRefusedNamingFileLineAndKey) {
  testing::TempDir dir("kc_job_spec");
  const std::string model = testing::RepoRoot() + "/examples/models/gpt-tiny.yaml";
  struct Case {
    std::string text, want;
  };
  for (const Case& c : std::vector<Case>{
           {"model: " + model + "\n", "name: required key is missing"},
           {"name: x\nmodel: nope.yaml\n", "job.yaml:2: model: cannot read the model file"},
           {"name: x\nmodel: " + model + "\nranks: 0\n", "job.yaml:3: ranks"},
           {"name: x\nmodel: " + model + "\nstepz: 3\n", "job.yaml:3: stepz: unknown key"},
           {"name: x\nmodel: " + model + "\nclass: urgent\n", "job.yaml:3: class"},
           {"name: x\nmodel: " + model + "\ndata: /etc/passwd\n",
            "job.yaml:3: data: expected a relative path"},
           {"name: x\nmodel: " + model + "\ncheckpoint_dir: a/../../b\n",
            "job.yaml:3: checkpoint_dir: expected a path without \"..\""},
           // Numbers are finite: no runtime, hence no token, without end.
           {"name: x\nmodel: " + model + "\nexpected_hours: .inf\n",
            "job.yaml:3: expected_hours: expected a number in (0, 100000], got \".inf\""},
           {"name: x\nmodel: " + model + "\nexpected_hours: .nan\n",
            "job.yaml:3: expected_hours: expected a number in (0, 100000], got \".nan\""},
           {"name: x\nmodel: " + model + "\nstorage_gb: .inf\n", "job.yaml:3: storage_gb"},
           // Devices: ranks is shorthand for min_devices and max_devices.
           {"name: x\nmodel: " + model + "\nranks: 2\nmax_devices: 4\n",
            "job.yaml:4: max_devices: 4 differs from ranks (2)"},
           {"name: x\nmodel: " + model + "\nmax_devices: 2\nmin_devices: 3\n",
            "job.yaml:4: min_devices: 3 is above max_devices (2)"},
           // A plan is checked against the model and the devices, and what the engine runs.
           {"name: x\nmodel: " + model + "\nranks: 2\nplan: \"d=3\"\n", "job.yaml:4: plan: "},
           {"name: x\nmodel: " + model + "\nranks: 2\nplan: \"d=2 zero_stage=2\"\n",
            "job.yaml:4: plan: zero_stage 2"},
           {"name: x\nmodel: " + model + "\nplan: \"q=1\"\n", "job.yaml:3: plan: --plan"},
           {"name: x\nmodel: " + model + "\nranks: 2\nmin_devices: 1\nplan: \"d=2 zero_stage=1\"\n",
            "job.yaml:5: plan: zero_stage 1 with min_devices needs checkpoint_every"},
           // Checkpoints every N steps or as the scheduler advises; bounded restarts.
           {"name: x\nmodel: " + model + "\ncheckpoint_every: often\n",
            "job.yaml:3: checkpoint_every: expected a number of steps or auto"},
           {"name: x\nmodel: " + model + "\ngrad_wire: fp16\n",
            "job.yaml:3: grad_wire: expected fp32 or bf16, got \"fp16\""},
           {"name: x\nmodel: " + model + "\nmemory_copy_every: sometimes\n",
            "job.yaml:3: memory_copy_every: expected a number of steps (0: no copies) or auto"},
           {"name: x\nmodel: " + model + "\nmax_restarts: 1000\n", "job.yaml:3: max_restarts"},
           {"name: x\nmodel: " + model + "\nrestart_backoff: -1\n", "job.yaml:3: restart_backoff"},
           // Other jobs' directories and the agent's own are no job's to name.
           {"name: x\nmodel: " + model + "\ncheckpoint_dir: jobs/7/checkpoints\n",
            "job.yaml:3: checkpoint_dir: expected a directory outside jobs/ and agent/"},
           {"name: x\nmodel: " + model + "\ncheckpoint_dir: ./agent\n",
            "job.yaml:3: checkpoint_dir: expected a directory outside jobs/ and agent/"},
       }) {
    Result<JobSpec> s = LoadJobFile(dir.Write("job.yaml", c.text));
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_THAT(s.status().message(), HasSubstr(c.want)) << c.text;
  }
  // A model file that is not a model is named through the job file's key.
  const std::string bad_model = dir.Write("m.yaml", "name: m\nlayers: -1\n");
  Result<JobSpec> s = LoadJobFile(dir.Write("job.yaml", "name: x\nmodel: m.yaml\n"));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("job.yaml: model:"));
}

TEST(JobSpecTest, DevicesAndAPlanLoadAndTravelAsText) {
  testing::TempDir dir("kc_job_spec");
  const std::string model = testing::RepoRoot() + "/examples/models/gpt-tiny.yaml";
  Result<JobSpec> s = LoadJobFile(dir.Write(
      "job.yaml",
      "name: x\nmodel: " + model +
          "\nmin_devices: 1\nmax_devices: 2\ncheckpoint_every: 10\nplan: \"d=2 zero_stage=1\"\n"));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->ranks, 2);
  EXPECT_EQ(s->min_devices, 1);
  EXPECT_EQ(s->plan, "d=2 zero_stage=1");
  Result<JobSpec> back = ParseJobSpec(JobSpecText(*s), "spec");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->min_devices, 1);
  EXPECT_EQ(back->plan, s->plan);
  EXPECT_EQ(back->max_restarts, 3);  // the defaults
  EXPECT_EQ(back->restart_backoff_s, 10);
  EXPECT_EQ(back->memory_copy_every, 0);  // auto
  // In-memory copies: every N steps, none (0), or auto; each travels as text.
  for (const auto& [text, want] : {std::pair{"5", int64_t{5}}, {"0", int64_t{-1}}, {"auto", 0}}) {
    Result<JobSpec> copies = LoadJobFile(
        dir.Write("job.yaml", "name: x\nmodel: " + model + "\nmemory_copy_every: " + text + "\n"));
    ASSERT_TRUE(copies.ok()) << copies.status().message();
    EXPECT_EQ(copies->memory_copy_every, want) << text;
    Result<JobSpec> again = ParseJobSpec(JobSpecText(*copies), "spec");
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_EQ(again->memory_copy_every, want) << text;
  }
  // The plan kcd writes for a start below max_devices is for that size: within [min, max]
  // it checks; a size past max_devices does not.
  JobSpec at_one = *back;
  at_one.plan = "d=1 zero_stage=1";
  EXPECT_TRUE(ParseJobSpec(JobSpecText(at_one), "spec").ok());
  at_one.plan = "d=3";
  EXPECT_THAT(ParseJobSpec(JobSpecText(at_one), "spec").status().message(),
              ::testing::HasSubstr("plan"));
  EXPECT_FALSE(back->checkpoint_auto);
  // The scheduler's interval, and a restart policy of the job's own.
  s = LoadJobFile(dir.Write("job.yaml", "name: x\nmodel: " + model +
                                            "\ncheckpoint_every: auto\nmax_restarts: 0\n"
                                            "restart_backoff: 0.5\n"));
  ASSERT_TRUE(s.ok()) << s.status().message();
  back = ParseJobSpec(JobSpecText(*s), "spec");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->checkpoint_auto);
  EXPECT_EQ(back->checkpoint_every, 0);
  EXPECT_EQ(back->max_restarts, 0);
  EXPECT_EQ(back->restart_backoff_s, 0.5);
  // min_devices = max_devices is no range: not elastic.
  s = LoadJobFile(
      dir.Write("job.yaml", "name: x\nmodel: " + model + "\nranks: 2\nmin_devices: 2\n"));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->min_devices, 0);
}

// A command job: a program and its arguments instead of a model, with a working directory and
// environment of its own, travelling as text like any job.
TEST(JobSpecTest, CommandJobsLoadAndTravelAsText) {
  testing::TempDir dir("kc_job_spec");
  Result<JobSpec> s = LoadJobFile(
      dir.Write("job.yaml",
                "name: ddp\ncommand: [python3, train.py, --epochs, \"3\"]\nworkdir: shared/ddp\n"
                "env: {GREETING: hello, _X1: \"\"}\nranks: 2\nmax_restarts: 1\n"));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_THAT(s->command, ::testing::ElementsAre("python3", "train.py", "--epochs", "3"));
  EXPECT_TRUE(s->model_yaml.empty());
  Result<JobSpec> back = ParseJobSpec(JobSpecText(*s), "spec");
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << JobSpecText(*s);
  EXPECT_EQ(back->command, s->command);
  EXPECT_EQ(back->workdir, "shared/ddp");
  using Env = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(back->env, (Env{{"GREETING", "hello"}, {"_X1", ""}}));
  EXPECT_EQ(back->ranks, 2);
  EXPECT_EQ(back->max_restarts, 1);
  // Its program is asked for no heartbeats unless the file says so, and then through every
  // form a job travels in (the text, the typed job).
  EXPECT_EQ(back->heartbeat_timeout_s, 0);
  EXPECT_EQ(JobSpecOf(ToTrainJob(*back)).heartbeat_timeout_s, 0);
  Result<JobSpec> beats = LoadJobFile(dir.Write("beats.yaml",
                                                "name: ddp\ncommand: [python3, train.py]\n"
                                                "heartbeat_period: 2\nheartbeat_timeout: 10\n"));
  ASSERT_TRUE(beats.ok()) << beats.status().message();
  for (const JobSpec& t :
       {*ParseJobSpec(JobSpecText(*beats), "spec"), JobSpecOf(ToTrainJob(*beats))}) {
    EXPECT_EQ(t.heartbeat_period_s, 2);
    EXPECT_EQ(t.heartbeat_timeout_s, 10);
  }
  const std::string model = testing::RepoRoot() + "/examples/models/gpt-tiny.yaml";
  struct Case {
    std::string text, want;
  };
  for (const Case& c : std::vector<Case>{
           {"name: x\ncommand: []\n", "job.yaml:2: command: expected the program"},
           {"name: x\ncommand: [a]\nmodel: " + model + "\n",
            "job.yaml:3: model: a job runs a model or a command, not both"},
           {"name: x\ncommand: [a]\nsteps: 3\n", "job.yaml:3: steps: only for a model job"},
           {"name: x\ncommand: [a]\nplan: d=1\n", "job.yaml:3: plan: only for a model job"},
           {"name: x\ncommand: [a]\nworkdir: ../x\n", "job.yaml:3: workdir: expected a path"},
           {"name: x\ncommand: [a]\nenv: {RANK: \"1\"}\n",
            "job.yaml:3: env.RANK: set by the launch for each rank"},
           {"name: x\ncommand: [a]\nenv: {KC_CHECKPOINT_DIR: /x}\n",
            "env.KC_CHECKPOINT_DIR: set by the launch"},
           {"name: x\ncommand: [a]\nenv: {1X: y}\n", "env.1X: expected a variable name"},
           {"name: x\nmodel: " + model + "\nenv: {A: b}\n",
            "job.yaml:3: env: only for a command job"},
       }) {
    Result<JobSpec> bad = LoadJobFile(dir.Write("job.yaml", c.text));
    ASSERT_FALSE(bad.ok()) << c.text;
    EXPECT_THAT(bad.status().message(), HasSubstr(c.want)) << c.text;
  }
}

TEST(JobSpecTest, SpecsFromTheWireAreCheckedAsJobFilesAre) {
  JobSpec s{.name = "x",
            .model_yaml =
                "name: m\nlayers: 1\nhidden: 64\nheads: 2\nvocab: 257\n"
                "seq_len: 32\nbatch_per_rank: 4\n"};
  ASSERT_TRUE(ParseJobSpec(JobSpecText(s), "spec").ok());
  s.checkpoint_dir = "/var/lib/secrets";
  Result<JobSpec> bad = ParseJobSpec(JobSpecText(s), "spec");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("checkpoint_dir: expected a relative path"));
  s.checkpoint_dir = "";
  s.model_yaml = "name: m\n";
  bad = ParseJobSpec(JobSpecText(s), "spec");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("spec: model_yaml:"));
  EXPECT_FALSE(ParseJobSpec("not json {", "spec").ok());
  EXPECT_TRUE(CheckRelativePath("data", "a/b/c.json").ok());
  EXPECT_THAT(CheckRelativePath("data", "../x").message(), HasSubstr("data: expected a path"));
}

}  // namespace
}  // namespace kc::api
