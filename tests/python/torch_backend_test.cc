// The torch.distributed backend "kc" end to end: two Python ranks (tests/python/
// torch_backend_check.py) run every collective against known values and DDP training whose
// losses must equal gloo's. Skipped where the backend is not built (no Debian PyTorch).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/support/child_guard.h"
#include "tests/support/kc_run.h"
#include "tests/support/temp_dir.h"

namespace {

// A port the kernel just handed out (free now; the ranks' store binds it right after).
[[maybe_unused]] int FreePort() {  // used where the backend is built
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(a.sin_port);
}

TEST(TorchBackendTest, EveryCollectiveIsRightAndDdpLossesEqualGloos) {
#ifndef KC_TORCH_PYTHONPATH
  GTEST_SKIP() << "the torch backend is not built here (Debian's python3-torch and "
                  "libtorch-dev were not found)";
#else
  kc::testing::TempDir dir;
  const int world = 2;
  const int port = FreePort();
  ASSERT_GT(port, 0);
  std::vector<std::unique_ptr<kc::testing::ChildGuard> > ranks;
  std::vector<std::string> logs;
  for (int r = 0; r < world; ++r) {
    logs.push_back(dir.Path("rank" + std::to_string(r) + ".log"));
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setpgid(0, 0);
      const int fd = open(logs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("PYTHONPATH", KC_TORCH_PYTHONPATH, 1);
      setenv("OMP_NUM_THREADS", "1", 1);
      execl("/usr/bin/python3", "python3", KC_TORCH_CHECK_SCRIPT, static_cast<char*>(nullptr));
      _exit(127);
    }
    ranks.push_back(std::make_unique<kc::testing::ChildGuard>(pid));
  }
  for (int r = 0; r < world; ++r) {
    const int status = ranks[static_cast<size_t>(r)]->Reap();
    std::ifstream in(logs[static_cast<size_t>(r)]);
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find("rank " + std::to_string(r) + ": ok"), std::string::npos) << log;
  }
#endif
}

// Under kc run --heartbeat-timeout, the backend beats for its rank (KC_HEARTBEAT_FILE): a
// program busy for several timeouts between two collectives, which does not beat itself then,
// is not taken for hung.
TEST(TorchBackendTest, UnderKcRunTheBackendBeatsForItsRank) {
#ifndef KC_TORCH_PYTHONPATH
  GTEST_SKIP() << "the torch backend is not built here (Debian's python3-torch and "
                  "libtorch-dev were not found)";
#else
  kc::testing::TempDir dir;
  const std::string program = dir.Write("quiet.py", R"(import os
import pathlib
import time
import torch
import torch.distributed as dist
import kuangchao.torch  # noqa: F401
dist.init_process_group("kc")
t = torch.ones(4)
dist.all_reduce(t)
# One beat of its own, so that a backend that did not beat would be found silent below rather
# than only after --heartbeat-first.
pathlib.Path(os.environ["KC_HEARTBEAT_FILE"]).touch()
time.sleep(3)  # its own work, three heartbeat timeouts long
dist.all_reduce(t)
print(f"ok {t[0].item():.0f}", flush=True)
)");
  kc::testing::KcRun r = kc::testing::RunKc(
      KC_BINARY, std::string("run --nproc 2 --heartbeat-timeout 1 --heartbeat-period 0.2 -- "
                             "env PYTHONPATH=") +
                     KC_TORCH_PYTHONPATH + " /usr/bin/python3 " + program);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[rank 0] ok 4"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("sent no heartbeat"), std::string::npos) << r.err;
#endif
}

}  // namespace
