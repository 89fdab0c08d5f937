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

// A number too big for its type, infinite or not a number is refused, naming the option,
// before anything runs: never clamped to the largest value (which would look up job
// 9223372036854775807, or issue a token that never expires).
TEST(KcCliTest, NumbersOutOfRangeAreRefusedNotClamped) {
  const std::string login = " --login " + WriteFile("cli_login.json", "{}");
  for (const std::string& args :
       {"job show 99999999999999999999" + login, "job show -99999999999999999999" + login,
        "job show 0x10" + login, "job cancel 1e3" + login,
        std::string("token issue ann --dir . --days inf"),
        std::string("token issue ann --dir . --days nan"),
        std::string("token issue ann --dir . --days 1e400"),
        std::string("train nope.yaml --steps 99999999999999999999"),
        std::string("plan nope.yaml --devices 99999999999999999999")}) {
    KcRun r = Kc(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    // Refused while parsing: nothing else was looked at.
    EXPECT_NE(r.output.find("out of range"), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(r.output.find("9223372036854775807"), std::string::npos) << args;
  }
}

// A login file with a value of the wrong type is an error naming the file and the key, for
// every command that reads it.
TEST(KcCliTest, AWrongTypeInTheLoginFileNamesFileAndKey) {
  for (const char* json :
       {R"({"server": "localhost:1", "ca": "", "token": "t", "insecure": "yes"})",
        R"({"server": 7470, "ca": "", "token": "t"})", R"({"server": "s", "ca": [], "token": "t"})",
        R"([1, 2])"}) {
    const std::string login = WriteFile("cli_bad_login.json", json);
    for (const char* command : {"jobs", "job show 1", "quota show", "audit verify"}) {
      KcRun r = Kc(std::string(command) + " --login " + login);
      EXPECT_EQ(r.exit_code, 2) << command << " with " << json << ": " << r.output;
      EXPECT_NE(r.output.find(login), std::string::npos) << r.output;
    }
  }
  const std::string login =
      WriteFile("cli_bad_login.json", R"({"server": "s", "ca": "", "token": "t", "insecure": 1})");
  KcRun r = Kc("jobs --login " + login);
  EXPECT_NE(r.output.find(login + ": insecure: expected true or false"), std::string::npos)
      << r.output;
}

// `.inf` and `.nan` in a job file are refused by kc itself, naming the file, the line and the
// key; nothing is sent to kcd.
TEST(KcCliTest, InfiniteNumbersInAJobFileAreRefusedWithFileLineAndKey) {
  const std::string model = WriteFile("cli_model.yaml",
                                      "name: m\nlayers: 1\nhidden: 64\n"
                                      "heads: 2\nvocab: 257\nseq_len: 32\n"
                                      "batch_per_rank: 4\n");
  for (const char* value : {".inf", ".nan", "-.inf"}) {
    const std::string job =
        WriteFile("cli_job.yaml", "name: j\nmodel: " + model + "\nexpected_hours: " + value + "\n");
    KcRun r = Kc("submit " + job + " --login /nonexistent/login.json");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(job + ":3: expected_hours: expected a number in (0, 100000]"),
              std::string::npos)
        << r.output;
  }
}

}  // namespace
