// Cost of building a 10,000-device topology (validation, indexes, suggested groups) and of
// estimating collectives over all of it. The bar: Build < 1 s; aim for 10s of ms.
#include <benchmark/benchmark.h>

#include <string>
#include <utility>
#include <vector>

#include "base/check.h"
#include "hal/report.h"
#include "hal/topology.h"

namespace kc::hal {
namespace {

// 1,250 hosts x 8 GPUs on NVSwitch, in 10 racks with a 2:1 oversubscribed spine.
TopologySpec Cluster10k() {
  constexpr int kHosts = 1250, kPerHost = 8, kRacks = 10;
  TopologySpec spec;
  spec.name = "bench-10k";
  spec.network = {.cross_rack_bandwidth_factor = 0.5, .cross_rack_latency = 2e-6};
  spec.devices.reserve(kHosts * kPerHost);
  for (int h = 0; h < kHosts; ++h) {
    HostSpec host{.name = "node" + std::to_string(h),
                  .rack = "rack" + std::to_string(h * kRacks / kHosts),
                  .intra_host_default = IntraHostDefault{
                      .kind = LinkKind::kNvlink, .bandwidth = 450e9, .latency = 2e-6}};
    for (int i = 0; i < kPerHost; ++i) {
      DeviceDescriptor d;
      d.id = host.name + "/gpu" + std::to_string(i);
      d.kind = DeviceKind::kSimulated;
      d.model = "H100-SXM5-80GB";
      d.host = host.name;
      d.index_on_host = i;
      d.memory_bytes = int64_t{80} << 30;
      d.peak_flops_fp32 = 67e12;
      d.peak_flops_bf16 = 989e12;
      d.memory_bandwidth = 3.35e12;
      d.network_bandwidth = 50e9;  // one 400 Gb/s NIC per GPU
      d.network_latency = 3e-6;
      spec.devices.push_back(std::move(d));
    }
    spec.hosts.push_back(std::move(host));
  }
  return spec;
}

const Topology& Topology10k() {
  static const Topology* t = [] {
    Result<Topology> r = Topology::Build(Cluster10k());
    KC_CHECK(r.ok()) << r.status();
    return new Topology(std::move(r).value());
  }();
  return *t;
}

void BM_Build10k(benchmark::State& state) {
  const TopologySpec spec = Cluster10k();
  for (auto _ : state) {
    state.PauseTiming();
    TopologySpec copy = spec;
    state.ResumeTiming();
    Result<Topology> t = Topology::Build(std::move(copy));
    benchmark::DoNotOptimize(t);
    state.PauseTiming();
    KC_CHECK(t.ok() && t->groups().size() == 1250);
    { Result<Topology> drop = std::move(t); }  // not timed: freeing the spec
    state.ResumeTiming();
  }
  state.counters["devices"] = static_cast<double>(spec.devices.size());
}
BENCHMARK(BM_Build10k)->Unit(benchmark::kMillisecond);

// An all-reduce of 1 GiB over all 10,000 devices, per algorithm (0 = auto: all three).
void BM_Collective(benchmark::State& state) {
  const Topology& t = Topology10k();
  const auto algo = static_cast<CollectiveAlgo>(state.range(0));
  std::vector<int> all(t.num_devices());
  for (int d = 0; d < t.num_devices(); ++d) all[d] = d;
  for (auto _ : state) {
    CollectiveCost c = t.Collective(CollectiveOp::kAllreduce, all, int64_t{1} << 30, algo);
    benchmark::DoNotOptimize(c);
  }
  state.SetLabel(std::string(CollectiveAlgoName(algo)));
}
BENCHMARK(BM_Collective)
    ->Arg(static_cast<int>(CollectiveAlgo::kAuto))
    ->Arg(static_cast<int>(CollectiveAlgo::kRing))
    ->Arg(static_cast<int>(CollectiveAlgo::kTree))
    ->Arg(static_cast<int>(CollectiveAlgo::kHierarchical))
    ->Unit(benchmark::kMillisecond);

// A tensor-parallel all-reduce inside one host of the 10k cluster.
void BM_CollectiveInsideHost(benchmark::State& state) {
  const Topology& t = Topology10k();
  const std::vector<int> host = {0, 1, 2, 3, 4, 5, 6, 7};
  for (auto _ : state) {
    CollectiveCost c = t.Collective(CollectiveOp::kAllreduce, host, int64_t{1} << 26);
    benchmark::DoNotOptimize(c);
  }
}
BENCHMARK(BM_CollectiveInsideHost);

void BM_Path(benchmark::State& state) {
  const Topology& t = Topology10k();
  int a = 0;
  for (auto _ : state) {
    a = (a + 7919) % t.num_devices();
    benchmark::DoNotOptimize(t.Path(a, (a + 1) % t.num_devices()));
  }
}
BENCHMARK(BM_Path);

void BM_MakeReport10k(benchmark::State& state) {
  const Topology& t = Topology10k();
  for (auto _ : state) {
    TopologyReport r = MakeReport(t);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_MakeReport10k)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kc::hal

BENCHMARK_MAIN();
