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

}  // namespace
