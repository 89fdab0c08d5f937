#include "base/settings.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace kc {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(SettingsTest, DefaultsAreDevelopmentModeAtInfo) {
  Result<Settings> s = LoadSettings(WriteFile("settings_empty.yaml", ""));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->log_level, log::Severity::kInfo);
  EXPECT_EQ(s->boundary_mode, "development");
  EXPECT_EQ(s->boundary.upward_call, AlertLevel::kSevere);
}

TEST(SettingsTest, ProductionModeWithAnOverride) {
  Result<Settings> s = LoadSettings(WriteFile("settings_prod.yaml",
                                              "boundary:\n"
                                              "  mode: production\n"
                                              "  peer_blocking_call: warning\n"
                                              "log:\n"
                                              "  level: warning\n"
                                              "  verbosity: 2\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->boundary.upward_call, AlertLevel::kWarning);
  EXPECT_EQ(s->boundary.peer_blocking_call, AlertLevel::kWarning);
  EXPECT_EQ(s->log_level, log::Severity::kWarning);
  EXPECT_EQ(s->log_verbosity, 2);
}

TEST(SettingsTest, MisspelledKeyNamesFileLineAndPath) {
  const std::string path = WriteFile("settings_typo.yaml",
                                     "log:\n"
                                     "  level: info\n"
                                     "boundary:\n"
                                     "  mdoe: production\n");
  Result<Settings> s = LoadSettings(path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.status().message().rfind(path + ":4: boundary.mdoe: unknown key", 0), 0u)
      << s.status().message();
  EXPECT_NE(s.status().message().find("did you mean \"mode\""), std::string::npos);
}

TEST(SettingsTest, OutOfRangeAndBadChoiceAreRejected) {
  Result<Settings> v = LoadSettings(WriteFile("settings_v.yaml", "log:\n  verbosity: 12\n"));
  EXPECT_EQ(v.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find(":2: log.verbosity:"), std::string::npos)
      << v.status().message();
  Result<Settings> m = LoadSettings(WriteFile("settings_m.yaml", "boundary:\n  mode: loud\n"));
  EXPECT_NE(m.status().message().find(":2: boundary.mode:"), std::string::npos)
      << m.status().message();
}

TEST(SettingsTest, AppliedPolicyReachesTheMonitor) {
  Settings s;
  s.boundary = MonitorPolicy::Production();
  ASSERT_TRUE(ApplySettings(s).ok());
  EXPECT_EQ(BoundaryMonitor::Global().policy().upward_call, AlertLevel::kWarning);
  ASSERT_TRUE(ApplySettings(Settings{}).ok());
  EXPECT_EQ(BoundaryMonitor::Global().policy().upward_call, AlertLevel::kSevere);
}

TEST(SettingsTest, YamlRoundTrips) {
  Settings s;
  s.boundary_mode = "production";
  s.boundary = MonitorPolicy::Production();
  s.log_verbosity = 3;
  Result<Settings> back = LoadSettings(WriteFile("settings_rt.yaml", SettingsToYaml(s)));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(SettingsToYaml(*back), SettingsToYaml(s));
}

}  // namespace
}  // namespace kc
