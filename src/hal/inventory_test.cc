#include "hal/inventory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/repo_root.h"

namespace kc::hal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using kc::testing::RepoRoot;

std::string Example(const std::string& name) { return RepoRoot() + "examples/clusters/" + name; }

Result<TopologySpec> Load(std::string_view text) { return LoadInventoryString(text, "inv.yaml"); }

// The message of a load that must fail with kInvalidArgument.
std::string LoadError(std::string_view text) {
  Result<TopologySpec> spec = Load(text);
  EXPECT_FALSE(spec.ok());
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), ErrorCode::kInvalidArgument) << spec.status();
  return spec.status().message();
}

// A figure after a round trip: bit for bit, or within 4 ulps where `exact` is false.
void ExpectFigure(double a, double b, bool exact, const std::string& what) {
  if (exact) {
    EXPECT_EQ(a, b) << what;
  } else {
    EXPECT_DOUBLE_EQ(a, b) << what;
  }
}

void ExpectFigure(const std::optional<double>& a, const std::optional<double>& b, bool exact,
                  const std::string& what) {
  EXPECT_EQ(a.has_value(), b.has_value()) << what;
  if (a && b) ExpectFigure(*a, *b, exact, what);
}

// Every field; figures bit for bit unless `exact` is false. A round trip must not lose a bit
// of a spec that came from a file.
void ExpectSpecsEqual(const TopologySpec& x, const TopologySpec& y, bool exact = true) {
  EXPECT_EQ(x.name, y.name);
  ExpectFigure(x.network.cross_rack_bandwidth_factor, y.network.cross_rack_bandwidth_factor, exact,
               "cross_rack_bandwidth_factor");
  ExpectFigure(x.network.cross_rack_latency, y.network.cross_rack_latency, exact,
               "cross_rack_latency");
  ASSERT_EQ(x.devices.size(), y.devices.size());
  for (size_t i = 0; i < x.devices.size(); ++i) {
    const DeviceDescriptor& a = x.devices[i];
    const DeviceDescriptor& b = y.devices[i];
    SCOPED_TRACE("device " + a.id);
    EXPECT_EQ(a.id, b.id);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.model, b.model);
    EXPECT_EQ(a.host, b.host);
    EXPECT_EQ(a.rack, b.rack);
    EXPECT_EQ(a.index_on_host, b.index_on_host);
    EXPECT_EQ(a.numa_node, b.numa_node);
    EXPECT_EQ(a.cpus, b.cpus);
    EXPECT_EQ(a.memory_bytes, b.memory_bytes);
    ExpectFigure(a.peak_flops_fp32, b.peak_flops_fp32, exact, "peak_flops_fp32");
    ExpectFigure(a.peak_flops_bf16, b.peak_flops_bf16, exact, "peak_flops_bf16");
    ExpectFigure(a.memory_bandwidth, b.memory_bandwidth, exact, "memory_bandwidth");
    ExpectFigure(a.network_bandwidth, b.network_bandwidth, exact, "network_bandwidth");
    ExpectFigure(a.network_latency, b.network_latency, exact, "network_latency");
  }
  ASSERT_EQ(x.links.size(), y.links.size());
  for (size_t i = 0; i < x.links.size(); ++i) {
    const Link& a = x.links[i];
    const Link& b = y.links[i];
    std::string what = "link " + std::to_string(a.a) + "-" + std::to_string(a.b);
    EXPECT_EQ(a.a, b.a) << what;
    EXPECT_EQ(a.b, b.b) << what;
    EXPECT_EQ(a.kind, b.kind) << what;
    ExpectFigure(a.declared_bandwidth, b.declared_bandwidth, exact, what);
    ExpectFigure(a.declared_latency, b.declared_latency, exact, what);
    ExpectFigure(a.measured_bandwidth, b.measured_bandwidth, exact, what);
    ExpectFigure(a.measured_latency, b.measured_latency, exact, what);
  }
  ASSERT_EQ(x.hosts.size(), y.hosts.size());
  for (size_t i = 0; i < x.hosts.size(); ++i) {
    const HostSpec& a = x.hosts[i];
    const HostSpec& b = y.hosts[i];
    SCOPED_TRACE("host " + a.name);
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.rack, b.rack);
    ASSERT_EQ(a.intra_host_default.has_value(), b.intra_host_default.has_value());
    if (!a.intra_host_default) continue;
    const IntraHostDefault& p = *a.intra_host_default;
    const IntraHostDefault& q = *b.intra_host_default;
    EXPECT_EQ(p.kind, q.kind);
    ExpectFigure(p.bandwidth, q.bandwidth, exact, "intra_host");
    ExpectFigure(p.latency, q.latency, exact, "intra_host");
    ExpectFigure(p.measured_bandwidth, q.measured_bandwidth, exact, "intra_host");
    ExpectFigure(p.measured_latency, q.measured_latency, exact, "intra_host");
  }
}

// Writes `spec` and loads the text again.
TopologySpec RoundTrip(const TopologySpec& spec) {
  Result<std::string> yaml = InventoryToYaml(spec);
  EXPECT_TRUE(yaml.ok()) << yaml.status();
  if (!yaml.ok()) return {};
  Result<TopologySpec> again = LoadInventoryString(*yaml, "written.yaml");
  EXPECT_TRUE(again.ok()) << again.status() << "\n" << *yaml;
  if (!again.ok()) return {};
  return *std::move(again);
}

// A valid two-host inventory; the error tests below change one line of it. Line numbers:
// 1 name, 3 A100, 4 memory_gb, 8 hosts, 9 name, 10 model, 11 count, 12 intra_host, 13 network.
constexpr char kSmall[] =
    "name: small\n"
    "models:\n"
    "  A100:\n"
    "    memory_gb: 80\n"
    "    peak_tflops_fp32: 19.5\n"
    "    peak_tflops_bf16: 312\n"
    "    memory_bandwidth_gbs: 2039\n"
    "hosts:\n"
    "  - name: \"n[0-1]\"\n"
    "    model: A100\n"
    "    count: 4\n"
    "    intra_host: {kind: nvlink, bandwidth_gbs: 300, latency_us: 2}\n"
    "    network: {bandwidth_gbs: 25, latency_us: 5}\n";

// kSmall with `from` replaced by `to` (which must occur once).
std::string Small(std::string_view from, std::string_view to) {
  std::string text = kSmall;
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at == std::string::npos) return text;
  return text.replace(at, from.size(), to);
}

// Hostlists ----------------------------------------------------------------------------------

TEST(InventoryHostlistTest, RangeKeepsTheZeroPaddingOfItsLowerBound) {
  Result<std::vector<std::string>> names = ExpandHostlist("dgx[00-15]");
  ASSERT_TRUE(names.ok()) << names.status();
  ASSERT_EQ(names->size(), 16u);
  EXPECT_EQ(names->front(), "dgx00");
  EXPECT_EQ((*names)[9], "dgx09");
  EXPECT_EQ(names->back(), "dgx15");
  EXPECT_THAT(*ExpandHostlist("n[08-10]"), ElementsAre("n08", "n09", "n10"));
  EXPECT_THAT(*ExpandHostlist("n[8-10]"), ElementsAre("n8", "n9", "n10"));
  EXPECT_THAT(*ExpandHostlist("n[098-100]"), ElementsAre("n098", "n099", "n100"));
}

TEST(InventoryHostlistTest, BracketsHoldCommaListsOfNumbersAndRanges) {
  EXPECT_THAT(*ExpandHostlist("a[1-3,7]"), ElementsAre("a1", "a2", "a3", "a7"));
  EXPECT_THAT(*ExpandHostlist("a[5]"), ElementsAre("a5"));
}

TEST(InventoryHostlistTest, CommasOutsideBracketsSeparateNames) {
  EXPECT_THAT(*ExpandHostlist("login,dgx[1-2],gpu-07"),
              ElementsAre("login", "dgx1", "dgx2", "gpu-07"));
}

TEST(InventoryHostlistTest, SeveralBracketsMultiplyOutFirstSlowest) {
  EXPECT_THAT(*ExpandHostlist("r[1-2]n[0-1]"), ElementsAre("r1n0", "r1n1", "r2n0", "r2n1"));
  EXPECT_THAT(*ExpandHostlist("dgx[00-01]/gpu[0-1]"),
              ElementsAre("dgx00/gpu0", "dgx00/gpu1", "dgx01/gpu0", "dgx01/gpu1"));
}

TEST(InventoryHostlistTest, BadSyntaxIsInvalidArgumentSayingWhatIsWrong) {
  struct Case {
    const char* expr;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"", "empty hostlist"},
           {"dgx[00-03", "unclosed \"[\""},
           {"dgx00-03]", "\"]\" without \"[\""},
           {"dgx[]", "empty \"[]\""},
           {"dgx[[1]]", "\"[\" inside \"[...]\""},
           {"dgx[1-]", "\"1-\" is not a number or a range such as 1-3"},
           {"dgx[a-c]", "\"a-c\" is not a number or a range such as 1-3"},
           {"dgx[-1]", "\"-1\" is not a number or a range such as 1-3"},
           {"dgx[1,,2]", "empty item in \"1,,2\""},
           {"dgx[9-3]", "range \"9-3\" runs from high to low"},
           {"a,,b", "empty name between commas"},
           {"a,", "empty name between commas"},
           {"n[0-99][0-99]", "expands to more than 1000 names"},
       }) {
    Result<std::vector<std::string>> names = ExpandHostlist(c.expr, 1000);
    ASSERT_FALSE(names.ok()) << c.expr;
    EXPECT_EQ(names.status().code(), ErrorCode::kInvalidArgument) << c.expr;
    EXPECT_EQ(names.status().message(), c.message) << c.expr;
  }
}

// Examples -----------------------------------------------------------------------------------

TEST(InventoryTest, DgxA100x4HasThirtyTwoDevicesWithPublishedFigures) {
  Result<TopologySpec> spec = LoadInventory(Example("dgx-a100x4.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "dgx-a100x4");
  ASSERT_EQ(spec->devices.size(), 32u);
  ASSERT_EQ(spec->hosts.size(), 4u);
  EXPECT_TRUE(spec->links.empty());
  const DeviceDescriptor& d = spec->devices[13];
  EXPECT_EQ(d.id, "dgx01/gpu5");
  EXPECT_EQ(d.host, "dgx01");
  EXPECT_EQ(d.rack, "r0");
  EXPECT_EQ(d.index_on_host, 5);
  EXPECT_EQ(d.kind, DeviceKind::kSimulated);
  EXPECT_EQ(d.model, "A100-SXM4-80GB");
  EXPECT_EQ(d.memory_bytes, 80'000'000'000);
  EXPECT_EQ(d.peak_flops_bf16, 312e12);
  EXPECT_EQ(d.peak_flops_fp32, 19.5e12);
  EXPECT_EQ(d.memory_bandwidth, 2039e9);
  EXPECT_EQ(d.network_bandwidth, 25e9);
  EXPECT_EQ(d.network_latency, 5e-6);
  EXPECT_EQ(d.numa_node, 7);
  EXPECT_TRUE(d.cpus.empty());
  EXPECT_EQ(spec->hosts[3].name, "dgx03");
  ASSERT_TRUE(spec->hosts[3].intra_host_default.has_value());
  const IntraHostDefault& nvswitch = *spec->hosts[3].intra_host_default;
  EXPECT_EQ(nvswitch.kind, LinkKind::kNvlink);
  EXPECT_EQ(nvswitch.bandwidth, 300e9);
  EXPECT_EQ(nvswitch.latency, 2e-6);
  EXPECT_FALSE(nvswitch.measured_bandwidth.has_value());
  EXPECT_EQ(spec->network.cross_rack_bandwidth_factor, 1.0);
  EXPECT_EQ(spec->network.cross_rack_latency, 0.0);
}

TEST(InventoryTest, EveryExampleLoadsWithItsDeviceCount) {
  struct Case {
    const char* file;
    size_t devices;
    size_t hosts;
  };
  for (const Case& c : std::vector<Case>{{"dgx-a100x4.yaml", 32, 4},
                                         {"dgx-a100x16.yaml", 128, 16},
                                         {"h100x128.yaml", 1024, 128},
                                         {"mixed.yaml", 32, 4},
                                         {"synthetic-10k.yaml", 10'000, 1'250}}) {
    Result<TopologySpec> spec = LoadInventory(Example(c.file));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->devices.size(), c.devices) << c.file;
    EXPECT_EQ(spec->hosts.size(), c.hosts) << c.file;
  }
}

TEST(InventoryTest, H100ClusterSpansTwoRacksBehindAnOversubscribedSpine) {
  Result<TopologySpec> spec = LoadInventory(Example("h100x128.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->devices.front().rack, "rack-a");
  EXPECT_EQ(spec->devices.front().id, "h100-000/gpu0");
  EXPECT_EQ(spec->devices.back().rack, "rack-b");
  EXPECT_EQ(spec->devices.back().id, "h100-127/gpu7");
  EXPECT_EQ(spec->devices.back().peak_flops_bf16, 989e12);
  EXPECT_EQ(spec->devices.back().peak_flops_fp32, 67e12);
  EXPECT_EQ(spec->devices.back().memory_bandwidth, 3350e9);
  EXPECT_EQ(spec->devices.back().network_bandwidth, 50e9);
  EXPECT_EQ(spec->hosts.back().intra_host_default->bandwidth, 450e9);
  EXPECT_EQ(spec->network.cross_rack_bandwidth_factor, 0.5);
  EXPECT_EQ(spec->network.cross_rack_latency, 2e-6);
}

TEST(InventoryTest, MixedClusterHasNvlinkPairsOverAPcieDefault) {
  Result<TopologySpec> spec = LoadInventory(Example("mixed.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->hosts.size(), 4u);
  EXPECT_EQ(spec->hosts[0].intra_host_default->kind, LinkKind::kNvlink);
  EXPECT_EQ(spec->hosts[2].name, "pcie00");
  EXPECT_EQ(spec->hosts[2].intra_host_default->kind, LinkKind::kPcie);
  EXPECT_EQ(spec->hosts[2].intra_host_default->bandwidth, 32e9);
  // Four NVLink pairs on each PCIe host, devices 16-23 and 24-31, sorted.
  ASSERT_EQ(spec->links.size(), 8u);
  for (size_t i = 0; i < spec->links.size(); ++i) {
    const Link& link = spec->links[i];
    EXPECT_EQ(link.a, 16 + 2 * static_cast<int>(i));
    EXPECT_EQ(link.b, link.a + 1);
    EXPECT_EQ(link.kind, LinkKind::kNvlink);
    EXPECT_EQ(link.declared_bandwidth, 300e9);
  }
  EXPECT_EQ(spec->devices[17].id, "pcie00/gpu1");
  EXPECT_EQ(spec->devices[17].model, "A100-PCIE-80GB");
  EXPECT_EQ(spec->devices[17].memory_bandwidth, 1935e9);
}

TEST(InventoryTest, TenThousandDevicesLoadWellUnderASecond) {
  auto start = std::chrono::steady_clock::now();
  Result<TopologySpec> spec = LoadInventory(Example("synthetic-10k.yaml"));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->devices.size(), 10'000u);
  EXPECT_EQ(spec->devices.back().id, "node1249/gpu7");
  EXPECT_EQ(spec->devices.back().rack, "r9");
  RecordProperty("load_ms", static_cast<int>(seconds * 1000));
  std::printf("synthetic-10k.yaml loaded in %.1f ms\n", seconds * 1000);
  EXPECT_LT(seconds, 0.5);
}

TEST(InventoryTest, EveryExampleBuildsIntoATopology) {
  for (const char* file : {"dgx-a100x4.yaml", "dgx-a100x16.yaml", "h100x128.yaml", "mixed.yaml",
                           "synthetic-10k.yaml"}) {
    Result<TopologySpec> spec = LoadInventory(Example(file));
    ASSERT_TRUE(spec.ok()) << spec.status();
    size_t devices = spec->devices.size();
    Result<Topology> topology = Topology::Build(*std::move(spec));
    ASSERT_TRUE(topology.ok()) << file << ": " << topology.status();
    EXPECT_EQ(static_cast<size_t>(topology->num_devices()), devices) << file;
  }
}

// Round trips --------------------------------------------------------------------------------

TEST(InventoryTest, EveryExampleSurvivesWriteThenLoad) {
  for (const char* file : {"dgx-a100x4.yaml", "dgx-a100x16.yaml", "h100x128.yaml", "mixed.yaml",
                           "synthetic-10k.yaml"}) {
    SCOPED_TRACE(file);
    Result<TopologySpec> spec = LoadInventory(Example(file));
    ASSERT_TRUE(spec.ok()) << spec.status();
    ExpectSpecsEqual(*spec, RoundTrip(*spec));
  }
}

TEST(InventoryTest, MeasuredValuesCpuSlicesAndOddFiguresSurviveWriteThenLoad) {
  constexpr char kText[] =
      "name: \"probed: lab # 3\"\n"
      "network: {cross_rack_bandwidth_factor: 0.3, cross_rack_latency_us: 0.7}\n"
      "models:\n"
      "  \"Xeon(R) Gold 6338 @ 2.00GHz\":\n"
      "    kind: cpu\n"
      "    memory_gb: 68.719476736\n"
      "    peak_tflops_fp32: 0.1\n"
      "    peak_tflops_bf16: 0\n"
      "    memory_bandwidth_gbs: 102.4\n"
      "  RTX-4090:\n"
      "    kind: cuda\n"
      "    memory_gb: 25.757220864\n"
      "    peak_tflops_fp32: 82.58\n"
      "    peak_tflops_bf16: 165.2\n"
      "    memory_bandwidth_gbs: 1008\n"
      "hosts:\n"
      "  - name: cpu-box\n"
      "    rack: \"row 7\"\n"
      "    model: \"Xeon(R) Gold 6338 @ 2.00GHz\"\n"
      "    count: 2\n"
      "    intra_host: {kind: shm, bandwidth_gbs: 12.3, latency_us: 0.3,\n"
      "                 measured_bandwidth_gbs: 9.87654321, measured_latency_us: 0.45}\n"
      "    network: {bandwidth_gbs: 1.25, latency_us: 30}\n"
      "    numa_nodes: [0, 1]\n"
      "    cpus: [\"0-15,32-47\", \"16-31\"]\n"
      "  - name: \"ws[1-2]\"\n"
      "    model: RTX-4090\n"
      "    count: 3\n"
      "    intra_host: {kind: pcie, bandwidth_gbs: 25.6, latency_us: 7.1}\n"
      "    network: {bandwidth_gbs: 3.1, latency_us: 11}\n"
      "    numa_nodes: [0, -1, 0]\n"
      "    links:\n"
      "      - {between: [2, 0], kind: nvlink, bandwidth_gbs: 56.25, latency_us: 1.3,\n"
      "         measured_bandwidth_gbs: 51.123456789, measured_latency_us: 1.9}\n"
      "      - {between: [0, 1], kind: pcie, bandwidth_gbs: 25.6, latency_us: 7.1,\n"
      "         measured_latency_us: 6.5}\n";
  Result<TopologySpec> spec = Load(kText);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->devices.size(), 8u);
  EXPECT_EQ(spec->devices[1].id, "cpu-box/cpu1");
  EXPECT_EQ(spec->devices[1].kind, DeviceKind::kCpu);
  EXPECT_EQ(spec->devices[0].cpus.size(), 32u);
  EXPECT_EQ(spec->devices[0].memory_bytes, 68'719'476'736);
  EXPECT_EQ(spec->devices[2].id, "ws1/gpu0");
  EXPECT_EQ(spec->devices[2].kind, DeviceKind::kCuda);
  EXPECT_EQ(spec->devices[3].numa_node, -1);
  ASSERT_EQ(spec->links.size(), 4u);
  EXPECT_EQ(spec->links[0].a, 2);
  EXPECT_EQ(spec->links[0].b, 3);
  EXPECT_FALSE(spec->links[0].measured_bandwidth.has_value());
  EXPECT_EQ(spec->links[1].a, 2);
  EXPECT_EQ(spec->links[1].b, 4);
  EXPECT_EQ(spec->links[1].bandwidth(), 51.123456789e9);
  // 1.9 / 1e6, which need not be the double nearest 1.9e-6.
  EXPECT_DOUBLE_EQ(spec->links[1].latency(), 1.9e-6);
  EXPECT_DOUBLE_EQ(*spec->hosts[0].intra_host_default->measured_latency, 0.45e-6);
  ExpectSpecsEqual(*spec, RoundTrip(*spec));
}

TEST(InventoryTest, SpecBuiltInCodeSurvivesWriteThenLoadWithinAnUlp) {
  TopologySpec spec;
  spec.name = "built";
  spec.hosts.push_back({.name = "h0", .rack = "", .intra_host_default = std::nullopt});
  for (int i = 0; i < 2; ++i) {
    DeviceDescriptor d;
    d.id = "h0/gpu" + std::to_string(i);
    d.kind = DeviceKind::kSimulated;
    d.model = "X";
    d.host = "h0";
    d.index_on_host = i;
    d.memory_bytes = 123'456'789'012;
    d.peak_flops_fp32 = 1.0 / 3.0 * 1e13;
    d.peak_flops_bf16 = 2.0 / 3.0 * 1e13;
    d.memory_bandwidth = 987'654'321.123;
    d.network_bandwidth = 1e10 / 7;
    d.network_latency = 1.0 / 300'000;
    spec.devices.push_back(d);
  }
  spec.links.push_back({.a = 0,
                        .b = 1,
                        .kind = LinkKind::kNvlink,
                        .declared_bandwidth = 5e10 / 3,
                        .declared_latency = 3e-6 / 7,
                        .measured_bandwidth = 4.2e10 / 9,
                        .measured_latency = std::nullopt});
  ExpectSpecsEqual(spec, RoundTrip(spec), /*exact=*/false);
}

TEST(InventoryTest, WriterRefusesSpecsTheFormatCannotExpress) {
  Result<TopologySpec> spec = LoadInventory(Example("mixed.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();

  TopologySpec other_model = *spec;
  other_model.devices[3].memory_bytes += 1;
  Result<std::string> yaml = InventoryToYaml(other_model);
  ASSERT_FALSE(yaml.ok());
  EXPECT_EQ(yaml.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(yaml.status().message(), HasSubstr("dgx00/gpu3"));

  TopologySpec odd_id = *spec;
  odd_id.devices[5].id = "dgx00/accel5";
  EXPECT_EQ(InventoryToYaml(odd_id).status().code(), ErrorCode::kInvalidArgument);

  TopologySpec cross_host = *spec;
  cross_host.links.push_back({.a = 0, .b = 8, .kind = LinkKind::kNvlink, .declared_bandwidth = 1});
  EXPECT_EQ(InventoryToYaml(cross_host).status().code(), ErrorCode::kInvalidArgument);

  TopologySpec shuffled = *spec;
  std::swap(shuffled.devices[0], shuffled.devices[8]);
  EXPECT_EQ(InventoryToYaml(shuffled).status().code(), ErrorCode::kInvalidArgument);

  TopologySpec empty_host = *spec;
  empty_host.hosts.push_back({.name = "spare", .rack = "r0", .intra_host_default = std::nullopt});
  yaml = InventoryToYaml(empty_host);
  ASSERT_FALSE(yaml.ok());
  EXPECT_THAT(yaml.status().message(), HasSubstr("host spare has no devices"));
}

// Errors -------------------------------------------------------------------------------------

TEST(InventoryTest, SmallInventoryIsValid) {
  Result<TopologySpec> spec = Load(kSmall);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->devices.size(), 8u);
  EXPECT_EQ(spec->devices[4].id, "n1/gpu0");
  EXPECT_EQ(spec->devices[4].rack, "");
}

TEST(InventoryTest, HostlistNeedsNoQuotesOutsideFlowMaps) {
  Result<TopologySpec> spec = Load(Small("name: \"n[0-1]\"", "name: n[0-1]"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->hosts.size(), 2u);
}

TEST(InventoryTest, MissingFileIsNotFound) {
  Result<TopologySpec> spec = LoadInventory(RepoRoot() + "examples/clusters/no-such.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), ErrorCode::kNotFound);
}

TEST(InventoryTest, FileErrorsNameTheFileAndLine) {
  std::string path = ::testing::TempDir() + "inventory_test_bad.yaml";
  std::ofstream(path) << Small("    count: 4\n", "    count: four\n");
  Result<TopologySpec> spec = LoadInventory(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), StartsWith(path + ":11: hosts[0].count: "));
  std::remove(path.c_str());
}

TEST(InventoryTest, UnknownKeyIsRejectedWithItsPath) {
  EXPECT_EQ(LoadError(Small("    count: 4\n", "    count: 4\n    gpus: 4\n")),
            "inv.yaml:12: hosts[0].gpus: unknown key, did you mean \"cpus\"?");
  EXPECT_EQ(LoadError(Small("    count: 4\n", "    count: 4\n    gpus_per_host: 4\n")),
            "inv.yaml:12: hosts[0].gpus_per_host: unknown key (known keys: count, cpus, "
            "intra_host, links, model, name, network, numa_nodes, rack)");
  EXPECT_EQ(LoadError(Small("latency_us: 2}", "latency_us: 2, measured_bw_gbs: 2}")),
            "inv.yaml:12: hosts[0].intra_host.measured_bw_gbs: unknown key (known keys: "
            "bandwidth_gbs, kind, latency_us, measured_bandwidth_gbs, measured_latency_us)");
}

TEST(InventoryTest, WrongTypeIsRejected) {
  EXPECT_THAT(LoadError(Small("count: 4", "count: \"4\"")),
              StartsWith("inv.yaml:11: hosts[0].count: expected an integer in [1, 65536]"));
  EXPECT_THAT(LoadError(Small("    memory_gb: 80\n", "    memory_gb: [80]\n")),
              StartsWith("inv.yaml:4: models.A100.memory_gb: expected a number"));
}

TEST(InventoryTest, ZeroOrNegativeCapacitiesAreRejected) {
  EXPECT_EQ(LoadError(Small("memory_gb: 80", "memory_gb: 0")),
            "inv.yaml:4: models.A100.memory_gb: expected a number in (0, 9000000000], got \"0\"");
  EXPECT_EQ(LoadError(Small("peak_tflops_fp32: 19.5", "peak_tflops_fp32: -1")),
            "inv.yaml:5: models.A100.peak_tflops_fp32: expected a positive number, got \"-1\"");
  EXPECT_THAT(LoadError(Small("memory_bandwidth_gbs: 2039", "memory_bandwidth_gbs: 0")),
              StartsWith("inv.yaml:7: models.A100.memory_bandwidth_gbs: expected a positive"));
  EXPECT_EQ(LoadError(Small("bandwidth_gbs: 300", "bandwidth_gbs: 0")),
            "inv.yaml:12: hosts[0].intra_host.bandwidth_gbs: expected a positive number, "
            "got \"0\"");
  EXPECT_THAT(
      LoadError(Small("{bandwidth_gbs: 25, latency_us: 5}", "{bandwidth_gbs: 25, latency_us: -5}")),
      StartsWith("inv.yaml:13: hosts[0].network.latency_us: expected a non-negative"));
  EXPECT_THAT(LoadError(Small("count: 4", "count: 0")), StartsWith("inv.yaml:11: hosts[0].count"));
  EXPECT_THAT(
      LoadError(Small("name: small\n", "name: small\nnetwork: {cross_rack_bandwidth_factor: 0}\n")),
      StartsWith("inv.yaml:2: network.cross_rack_bandwidth_factor: expected a number in (0, 1]"));
}

TEST(InventoryTest, UnknownModelIsRejectedListingTheModels) {
  EXPECT_EQ(LoadError(Small("model: A100", "model: A10")),
            "inv.yaml:10: hosts[0].model: unknown model; models: \"A100\", got \"A10\"");
}

TEST(InventoryTest, BadHostlistIsRejected) {
  EXPECT_EQ(LoadError(Small("\"n[0-1]\"", "\"n[0-1\"")),
            "inv.yaml:9: hosts[0].name: invalid hostlist (unclosed \"[\"), got \"n[0-1\"");
  EXPECT_EQ(LoadError(Small("\"n[0-1]\"", "\"n[1-0]\"")),
            "inv.yaml:9: hosts[0].name: invalid hostlist (range \"1-0\" runs from high to low), "
            "got \"n[1-0]\"");
  EXPECT_THAT(LoadError(Small("\"n[0-1]\"", "\"rack/n[0-1]\"")),
              StartsWith("inv.yaml:9: hosts[0].name: host names hold only letters"));
}

TEST(InventoryTest, TwoEntriesDeclaringOneHostAreRejected) {
  std::string text = std::string(kSmall) +
                     "  - name: \"n[1-3]\"\n"
                     "    model: A100\n"
                     "    count: 4\n"
                     "    network: {bandwidth_gbs: 25, latency_us: 5}\n";
  EXPECT_EQ(LoadError(text),
            "inv.yaml:14: hosts[1].name: host \"n1\" is already declared by hosts[0], "
            "got \"n[1-3]\"");
}

TEST(InventoryTest, HostlistNamingAHostTwiceIsRejected) {
  EXPECT_EQ(LoadError(Small("\"n[0-1]\"", "\"n[0-1,1]\"")),
            "inv.yaml:9: hosts[0].name: host \"n1\" appears twice in the hostlist, got "
            "\"n[0-1,1]\"");
}

TEST(InventoryTest, EmptyClusterIsRejected) {
  std::string no_hosts = std::string(kSmall).substr(0, std::string(kSmall).find("hosts:"));
  EXPECT_EQ(LoadError(no_hosts + "hosts: []\n"),
            "inv.yaml:8: hosts: expected at least one host entry");
  EXPECT_EQ(LoadError(no_hosts), "inv.yaml:1: hosts: required key is missing");
  EXPECT_THAT(LoadError("name: x\nmodels: {}\nhosts: []\n"),
              StartsWith("inv.yaml:2: models: expected at least one device model"));
}

TEST(InventoryTest, BadLinksAreRejected) {
  auto with_links = [](std::string_view links) {
    return Small(
        "    network: {bandwidth_gbs: 25, latency_us: 5}\n",
        "    network: {bandwidth_gbs: 25, latency_us: 5}\n    links:\n" + std::string(links));
  };
  constexpr char kRest[] = "kind: nvlink, bandwidth_gbs: 100, latency_us: 1}\n";
  EXPECT_EQ(LoadError(with_links(std::string("      - {between: [1, 4], ") + kRest)),
            "inv.yaml:15: hosts[0].links[0].between: no device 4 on this host (count 4: indices "
            "0 to 3)");
  EXPECT_EQ(LoadError(with_links(std::string("      - {between: [2, 2], ") + kRest)),
            "inv.yaml:15: hosts[0].links[0].between: a link joins two different devices, not "
            "device 2 to itself");
  EXPECT_EQ(LoadError(with_links(std::string("      - {between: [0, 1, 2], ") + kRest)),
            "inv.yaml:15: hosts[0].links[0].between: expected two device indices on the host, "
            "as [0, 1]");
  EXPECT_EQ(LoadError(with_links(std::string("      - {between: [0, 1], ") + kRest +
                                 "      - {between: [1, 0], " + kRest)),
            "inv.yaml:16: hosts[0].links[1].between: duplicate link 0-1 (first at "
            "hosts[0].links[0])");
  EXPECT_THAT(LoadError(with_links("      - {between: [0, 1], kind: network, bandwidth_gbs: 1, "
                                   "latency_us: 1}\n")),
              StartsWith("inv.yaml:15: hosts[0].links[0].kind: expected one of \"nvlink\", "
                         "\"pcie\", \"shm\", got \"network\""));
  EXPECT_THAT(LoadError(with_links("      - {between: [0, 1], kind: pcie, bandwidth_gbs: 0, "
                                   "latency_us: 1}\n")),
              StartsWith("inv.yaml:15: hosts[0].links[0].bandwidth_gbs: expected a positive"));
  EXPECT_THAT(LoadError(with_links("      - {between: [0, 1], kind: pcie, bandwidth_gbs: 1, "
                                   "latency_us: 1, measured_bandwidth_gbs: -2}\n")),
              StartsWith("inv.yaml:15: hosts[0].links[0].measured_bandwidth_gbs: expected a "
                         "positive number"));
}

TEST(InventoryTest, PerDeviceListsMustHaveOneEntryPerDevice) {
  EXPECT_EQ(LoadError(Small("    count: 4\n", "    count: 4\n    numa_nodes: [0, 1]\n")),
            "inv.yaml:12: hosts[0].numa_nodes: expected one NUMA node per device (4), found 2");
  EXPECT_EQ(LoadError(Small("    count: 4\n", "    count: 4\n    cpus: [\"0\", \"1\", \"2\"]\n")),
            "inv.yaml:12: hosts[0].cpus: expected one cpu list per device (4), found 3");
  EXPECT_EQ(
      LoadError(
          Small("    count: 4\n", "    count: 4\n    cpus: [\"0\", \"1\", \"2-x\", \"3\"]\n")),
      "inv.yaml:12: hosts[0].cpus: cpus[2]: expected a cpu list such as \"0-3,8\" (\"2-x\" is "
      "not a number or a range such as 1-3)");
}

TEST(InventoryTest, DuplicateModelNameIsRejected) {
  EXPECT_THAT(LoadError(Small("models:\n", "models:\n  A100: {}\n")),
              HasSubstr("models.A100: duplicate key (first on line 3)"));
}

}  // namespace
}  // namespace kc::hal
