// Tests for tools/check_layers, the static check of ARCHITECTURE.md rule 1. Each test plants a
// small tree under a fresh temporary folder, runs the script on it and reads its exit status
// and output. The planted sources are ordinary string literals, so this file itself stays
// clean for the check that runs on the real tree (ctest check_layers.repo).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#ifndef KC_CHECK_LAYERS
#error "KC_CHECK_LAYERS must be the absolute path of tools/check_layers"
#endif

namespace kc {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

struct RunResult {
  int exit_code = -1;  // -1 when the script did not exit normally
  std::string output;  // stdout and stderr together
};

RunResult RunCheckLayers(const fs::path& root) {
  const std::string command =
      std::string("'") + KC_CHECK_LAYERS + "' --root '" + root.string() + "' 2>&1";
  RunResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

class CheckLayersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::path(::testing::TempDir()) /
            ("kc_check_layers_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "src");
  }

  void TearDown() override {
    std::error_code ignored;  // best effort: a leftover temp folder fails nothing
    fs::remove_all(root_, ignored);
  }

  // Writes `text` to `rel` (relative to the planted root), creating folders.
  void Write(const std::string& rel, const std::string& text) {
    const fs::path path = root_ / rel;
    fs::create_directories(path.parent_path());
    std::ofstream out(path);
    out << text;
    ASSERT_TRUE(out.good()) << "cannot write " << path;
  }

  RunResult Run() { return RunCheckLayers(root_); }

  fs::path root_;
};

TEST_F(CheckLayersTest, CleanTreeExitsZero) {
  Write("src/base/status.h", "#pragma once\n#include <string>\n");
  Write("src/comm/ring.cc",
        "#include \"comm/ring.h\"\n"
        "\n"
        "#include <vector>\n"
        "\n"
        "#include \"base/status.h\"\n"
        "#include \"hal/device.h\"\n"
        "#include \"ring_detail.h\"\n");
  const RunResult r = Run();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "check_layers: 2 files, 3 includes, no violations\n");
}

TEST_F(CheckLayersTest, UpwardIncludeIsNamedWithFileLineAndEdge) {
  Write("src/comm/foo.cc",
        "// A ring.\n"
        "#include \"comm/foo.h\"\n"
        "#include \"fault/runner.h\"\n");
  const RunResult r = Run();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("src/comm/foo.cc:3: upward include: comm (L2) includes "
                                  "\"fault/runner.h\" (L5)\n"));
  EXPECT_THAT(r.output, HasSubstr("1 violation (1 upward, 0 private)"));
  EXPECT_THAT(r.output, Not(HasSubstr("foo.cc:2")));
}

TEST_F(CheckLayersTest, OtherLayersInternalHeaderIsAPrivateInclude) {
  Write("src/parallel/plan.cc", "#include \"comm/internal/ring.h\"\n");
  Write("src/comm/fused.cc", "#include \"hal/cuda/internal/stream.h\"\n");
  const RunResult r = Run();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("src/parallel/plan.cc:1: private include: parallel (L3) "
                                  "includes \"comm/internal/ring.h\", internal to comm\n"));
  EXPECT_THAT(r.output, HasSubstr("src/comm/fused.cc:1: private include: comm (L2) includes "
                                  "\"hal/cuda/internal/stream.h\", internal to hal\n"));
  EXPECT_THAT(r.output, Not(HasSubstr("upward include")));
}

TEST_F(CheckLayersTest, OwnLayersInternalHeaderIsFine) {
  Write("src/comm/ring.cc", "#include \"comm/internal/ring.h\"\n");
  Write("src/comm/internal/ring.cc",
        "#include \"comm/internal/ring.h\"\n"
        "#include \"comm/tcp/internal/socket.h\"\n");
  Write("src/comm/ring_test.cc", "#include \"comm/internal/ring.h\"\n");
  const RunResult r = Run();
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(CheckLayersTest, AppsMayIncludeEveryLayersPublicHeaders) {
  Write("apps/kc/main.cc",
        "#include \"api/job_service.h\"\n"
        "#include \"base/status.h\"\n"
        "#include \"comm/transport.h\"\n"
        "#include \"fault/runner.h\"\n"
        "#include \"hal/device.h\"\n"
        "#include \"kc/v1/jobs.grpc.pb.h\"\n"
        "#include \"parallel/planner.h\"\n"
        "#include \"sched/scheduler.h\"\n");
  const RunResult r = Run();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("8 includes, no violations"));
}

TEST_F(CheckLayersTest, AppsMayNotIncludeInternalHeaders) {
  Write("apps/kc/main.cc", "#include \"api/job.h\"\n#include \"comm/internal/ring.h\"\n");
  const RunResult r = Run();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("apps/kc/main.cc:2: private include: apps/kc/main.cc includes "
                                  "\"comm/internal/ring.h\", internal to comm\n"));
}

TEST_F(CheckLayersTest, TestsAndBenchFollowTheirLayersRule) {
  Write("tests/comm/allreduce_test.cc",
        "#include \"comm/allreduce.h\"\n"
        "#include \"hal/device.h\"\n"
        "#include \"fault/runner.h\"\n");
  Write("tests/comm/ring_test.cc", "#include \"comm/internal/ring.h\"\n");
  Write("tests/e2e/train_test.cc", "#include \"api/job.h\"\n#include \"hal/internal/probe.h\"\n");
  Write("bench/hal/copy_bench.cc", "#include \"hal/device.h\"\n#include \"comm/transport.h\"\n");
  Write("bench/side_by_side.cc", "#include \"api/job.h\"\n");
  const RunResult r = Run();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("tests/comm/allreduce_test.cc:3: upward include: comm (L2) "
                                  "includes \"fault/runner.h\" (L5)\n"));
  EXPECT_THAT(r.output, HasSubstr("tests/comm/ring_test.cc:1: private include"));
  EXPECT_THAT(r.output, HasSubstr("tests/e2e/train_test.cc:2: private include"));
  EXPECT_THAT(r.output, HasSubstr("bench/hal/copy_bench.cc:2: upward include: hal (L1) includes "
                                  "\"comm/transport.h\" (L2)\n"));
  EXPECT_THAT(r.output, HasSubstr("4 violations (2 upward, 2 private)"));
}

TEST_F(CheckLayersTest, IncludesInCommentsAndStringsAreIgnored) {
  Write("src/hal/device.cc",
        "// #include \"api/job.h\"\n"
        "/* An old note:\n"
        "#include \"fault/runner.h\"\n"
        "*/\n"
        "#include \"hal/device.h\"  // not \"api/job.h\"\n"
        "// a comment continued \\\n"
        "#include \"sched/pool.h\"\n"
        "const char* kDoc = R\"(\n"
        "#include \"api/job.h\"\n"
        ")\";\n"
        "const char* kOpen = \"/*\";\n"
        "#include \"hal/topology.h\"\n"
        "#include <api/job.h>\n"
        "#include \"gtest/gtest.h\"\n");
  const RunResult r = Run();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("2 includes, no violations"));
}

TEST_F(CheckLayersTest, IncludeAfterABlockCommentAndSpacedDirectiveAreChecked) {
  Write("src/sched/pool.cc",
        "#  include \"api/job.h\"\n"
        "/* x */ #include \"fault/runner.h\"\n");
  const RunResult r = Run();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("src/sched/pool.cc:1: upward include: sched (L4)"));
  EXPECT_THAT(r.output, HasSubstr("src/sched/pool.cc:2: upward include: sched (L4)"));
}

TEST_F(CheckLayersTest, IdlHeadersBelongToBase) {
  Write("src/hal/probe.cc",
        "#include \"kc/v1/options.pb.h\"\n"
        "#include \"kc/v1/agent.grpc.pb.h\"\n");
  Write("src/base/config.cc", "#include \"kc/v1/options.pb.h\"\n");
  const RunResult r = Run();
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(CheckLayersTest, ViolationsAreSortedByPathThenLine) {
  Write("src/hal/b.cc", "#include \"api/x.h\"\n");
  Write("src/comm/z.cc", "#include \"api/x.h\"\n#include \"api/y.h\"\n");
  Write("apps/a.cc", "#include \"api/internal/x.h\"\n");
  const RunResult r = Run();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const size_t apps = r.output.find("apps/a.cc:1:");
  const size_t z1 = r.output.find("src/comm/z.cc:1:");
  const size_t z2 = r.output.find("src/comm/z.cc:2:");
  const size_t hal = r.output.find("src/hal/b.cc:1:");
  ASSERT_NE(hal, std::string::npos) << r.output;
  EXPECT_LT(apps, z1);
  EXPECT_LT(z1, z2);
  EXPECT_LT(z2, hal);
}

TEST_F(CheckLayersTest, MissingSrcIsAUsageError) {
  fs::remove_all(root_ / "src");
  Write("apps/kc/main.cc", "#include \"api/job.h\"\n");
  const RunResult r = Run();
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("no src/"));
}

}  // namespace
}  // namespace kc
