// The cluster directory `kc init` makes: who may read what is in it.
#include "api/control_plane.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "tests/support/temp_dir.h"

namespace kc::api {
namespace {

// Sets the process's umask for the life of the object.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(umask(mask)) {}
  ~ScopedUmask() { umask(old_); }

 private:
  mode_t old_;
};

mode_t Mode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;
}

// The secrets (the CA's and kcd's keys, the first admin's token) and kcd's databases are
// their owner's alone, and the secrets were never anything else: no file of theirs had its
// mode changed after it was created (a chmod would show as IN_ATTRIB), even with a umask that
// takes nothing away.
TEST(ControlPlaneTest, InitMakesSecretsAndDatabasesReadableByTheirOwnerAloneFromTheStart) {
  kc::testing::TempDir dir("kc_init_modes");
  std::filesystem::create_directories(dir.Path("tls"));
  const int watch = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(watch, 0);
  ASSERT_GE(inotify_add_watch(watch, dir.path().c_str(), IN_ATTRIB), 0);
  ASSERT_GE(inotify_add_watch(watch, dir.Path("tls").c_str(), IN_ATTRIB), 0);
  {
    ScopedUmask none(0);
    Result<InitResult> init = InitCluster({.dir = dir.path(), .admin = "root"});
    ASSERT_TRUE(init.ok()) << init.status().message();
  }
  std::set<std::string> changed;
  alignas(inotify_event) char buf[1 << 16];
  ssize_t n;
  while ((n = read(watch, buf, sizeof buf)) > 0) {
    for (char* p = buf; p < buf + n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(p);
      if (e->len > 0) changed.insert(e->name);
      p += sizeof(inotify_event) + e->len;
    }
  }
  close(watch);
  for (const char* secret : {"tls/ca.key", "tls/server.key", "admin.token"}) {
    const std::string name = std::filesystem::path(secret).filename().string();
    for (const std::string& c : changed) {
      EXPECT_FALSE(c.starts_with(name)) << secret << ": its mode was changed after creation";
    }
    EXPECT_EQ(Mode(dir.Path(secret)), 0600u) << secret;
  }
  for (const char* own : {"kcd.db", "audit.db", "audit.key", "audit.head"}) {
    EXPECT_EQ(Mode(dir.Path(own)), 0600u) << own;
  }
  // What clients need to trust kcd, and who is who, stay readable.
  EXPECT_EQ(Mode(dir.Path("tls/ca.pem")), 0644u);
  EXPECT_EQ(Mode(dir.Path("roles.yaml")), 0644u);
}

}  // namespace
}  // namespace kc::api
