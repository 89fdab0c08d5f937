// Runs the kc binary as a user would and checks exit codes, output and error messages.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

namespace {

struct KcRun {
  int exit_code;
  std::string output;  // stdout and stderr together
};

KcRun Kc(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + " " + KC_BINARY + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(KcCliTest, TopoProbeTableNamesCpuMemoryAndNuma) {
  KcRun r = Kc("topo probe --quick --no-write");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cpu "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("memory "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("numa     node 0"), std::string::npos) << r.output;
}

TEST(KcCliTest, MisspelledSettingsKeyExitsTwoWithFileLineAndKey) {
  const std::string path = WriteFile("cli_typo.yaml", "log:\n  level: info\n  verbosty: 1\n");
  KcRun r = Kc("--config " + path + " topo probe");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(path + ":3: log.verbosty: unknown key"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("host "), std::string::npos) << "the command must not have run";
}

TEST(KcCliTest, WrongTypeInSettingsFromEnvironmentExitsTwo) {
  const std::string path = WriteFile("cli_type.yaml", "log:\n  verbosity: \"three\"\n");
  KcRun r = Kc("topo probe", "KC_CONFIG=" + path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(path + ":2: log.verbosity: expected an integer in [0, 9], got \"three\""),
            std::string::npos)
      << r.output;
}

TEST(KcCliTest, ConfigCheckPrintsTheEffectiveSettings) {
  const std::string path = WriteFile("cli_good.yaml", "boundary:\n  mode: production\n");
  KcRun r = Kc("config check " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("upward_call: warning"), std::string::npos) << r.output;
}

TEST(KcCliTest, MissingSettingsFileExitsTwo) {
  KcRun r = Kc("--config /nonexistent/kc.yaml topo probe");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("/nonexistent/kc.yaml"), std::string::npos) << r.output;
}

TEST(KcCliTest, UnknownCommandAndBadFlagExitTwo) {
  EXPECT_EQ(Kc("frobnicate").exit_code, 2);
  EXPECT_EQ(Kc("-v 12 topo probe").exit_code, 2);
  EXPECT_EQ(Kc("").exit_code, 2);
}

}  // namespace
