// Test support: shell helpers and two hosts as Linux network namespaces joined by a veth
// pair, for the tests labelled `netns`. Header-only; tests include it.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kc::testing {

// Runs `cmd` in a shell with its output discarded; its exit code, or -1.
inline int Sh(const std::string& cmd) {
  const int status = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs `cmd` in a shell and returns its stdout; *exit_code gets its exit code.
inline std::string Capture(const std::string& cmd, int* exit_code) {
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  if (pipe == nullptr) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// Namespaces a and b, veth a<->b, 10.213.N.1 and 10.213.N.2; torn down in the destructor.
class TwoHosts {
 public:
  TwoHosts() {
    const int id = static_cast<int>(getpid() % 200) + 20;
    a_ = "kct_a" + std::to_string(getpid());
    b_ = "kct_b" + std::to_string(getpid());
    ip_a_ = "10.213." + std::to_string(id) + ".1";
    ip_b_ = "10.213." + std::to_string(id) + ".2";
    const std::string va = "kva" + std::to_string(getpid() % 100000);
    const std::string vb = "kvb" + std::to_string(getpid() % 100000);
    dev_a_ = va;
    dev_b_ = vb;
    ok_ = Sh("ip netns add " + a_) == 0 && Sh("ip netns add " + b_) == 0 &&
          Sh("ip link add " + va + " netns " + a_ + " type veth peer name " + vb + " netns " +
             b_) == 0 &&
          Sh("ip -n " + a_ + " addr add " + ip_a_ + "/24 dev " + va) == 0 &&
          Sh("ip -n " + b_ + " addr add " + ip_b_ + "/24 dev " + vb) == 0 &&
          Sh("ip -n " + a_ + " link set " + va + " up") == 0 &&
          Sh("ip -n " + b_ + " link set " + vb + " up") == 0 &&
          Sh("ip -n " + a_ + " link set lo up") == 0 && Sh("ip -n " + b_ + " link set lo up") == 0;
  }
  ~TwoHosts() {
    Sh("ip netns del " + a_);  // deleting a namespace removes its end of the veth pair
    Sh("ip netns del " + b_);
  }
  bool ok() const { return ok_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  const std::string& ip_a() const { return ip_a_; }
  const std::string& ip_b() const { return ip_b_; }
  const std::string& dev_a() const { return dev_a_; }
  const std::string& dev_b() const { return dev_b_; }

 private:
  std::string a_, b_, ip_a_, ip_b_, dev_a_, dev_b_;
  bool ok_ = false;
};

}  // namespace kc::testing
