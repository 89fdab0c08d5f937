// examples/jobs/torch-ddp/train.py, a PyTorch DDP program as users bring one, under `kc run`:
// the same losses as its ranks started by hand with torchrun's environment (what torchrun
// gives them), and a SIGTERM mid-run (a pause) saves and exits, after which the same command
// resumes and ends with the uninterrupted run's losses. Skipped where Debian's PyTorch
// (python3-torch) is not installed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/child_guard.h"
#include "tests/support/daemon.h"
#include "tests/support/kc_run.h"
#include "tests/support/repo_root.h"
#include "tests/support/temp_dir.h"

namespace {

constexpr char kPython[] = "/usr/bin/python3";

bool HaveTorch() {
  return std::system((std::string(kPython) + " -c 'import torch' 2>/dev/null").c_str()) == 0;
}

std::string Script() { return kc::testing::RepoRoot() + "examples/jobs/torch-ddp/train.py"; }

std::vector<double> Losses(const std::string& path) {
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  return j.is_array() ? j.get<std::vector<double>>() : std::vector<double>{};
}

class TorchDdpExampleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveTorch()) GTEST_SKIP() << kPython << " has no PyTorch (Debian: python3-torch)";
  }
  kc::testing::KcRun KcRun(const std::string& args) {
    return kc::testing::RunKc(KC_BINARY, "run " + args);
  }
  kc::testing::TempDir dir_{"kc_torch_ddp"};
};

TEST_F(TorchDdpExampleTest, KcRunGivesTheLossesOfRanksStartedWithTorchrunsEnvironment) {
  const std::string flags = " --steps 6 --checkpoint-every 100";
  kc::testing::KcRun run = KcRun("--nproc 2 -- " + std::string(kPython) + " " + Script() + flags +
                                 " --losses " + dir_.Path("kc_run.json"));
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("[rank 0] step 6 loss"), std::string::npos) << run.out;

  // The same ranks started by hand, with the variables torchrun sets.
  std::vector<std::unique_ptr<kc::testing::ChildGuard>> ranks;
  const int port = 20000 + getpid() % 20000;
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setpgid(0, 0);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("LOCAL_WORLD_SIZE", "2", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("OMP_NUM_THREADS", "1", 1);
      const std::string losses = dir_.Path("by_hand.json");
      execl(kPython, "python3", Script().c_str(), "--steps", "6", "--checkpoint-every", "100",
            "--losses", losses.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    ranks.push_back(std::make_unique<kc::testing::ChildGuard>(pid));
  }
  for (auto& r : ranks) {
    const int status = r->Reap();
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  const std::vector<double> a = Losses(dir_.Path("kc_run.json"));
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, Losses(dir_.Path("by_hand.json")));
}

// kc run's SIGTERM reaches the program, which saves and exits (143); the same command resumes
// from KC_CHECKPOINT_DIR and ends where an uninterrupted run ends.
TEST_F(TorchDdpExampleTest, ASigtermSavesAndTheSameCommandResumes) {
  const std::string base = KcRun("--nproc 2 -- " + std::string(kPython) + " " + Script() +
                                 " --steps 40 --losses " + dir_.Path("whole.json"))
                               .err;
  const std::vector<double> whole = Losses(dir_.Path("whole.json"));
  ASSERT_EQ(whole.size(), 40u) << base;
  const std::string command = std::string(KC_BINARY) + " run --nproc 2 --checkpoint-dir " +
                              dir_.Path("ckpt") + " -- " + kPython + " " + Script() +
                              " --steps 40 --losses " + dir_.Path("resumed.json");
  {
    kc::testing::Daemon first(command + " 2>&1");
    ASSERT_NE(first.WaitForLine("[rank 0] step 3 loss"), "") << first.output();
    EXPECT_EQ(first.Stop(SIGTERM), 128 + SIGTERM) << first.output();
    EXPECT_NE(first.WaitForLine("saved"), "") << first.output();  // what it wrote as it stopped
  }
  kc::testing::Daemon second(command + " 2>&1");
  ASSERT_NE(second.WaitForLine("resumed from step"), "") << second.output();
  EXPECT_EQ(second.Stop(0), 0) << second.output();  // signal 0: only waits for its end
  const std::vector<double> resumed = Losses(dir_.Path("resumed.json"));
  ASSERT_EQ(resumed.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(resumed[i], whole[i], 1e-6) << i;
}

}  // namespace
