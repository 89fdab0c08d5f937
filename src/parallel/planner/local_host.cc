#include "parallel/planner/local_host.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "hal/cpu_devices.h"
#include "hal/measure.h"
#include "parallel/plan.h"

namespace kc::parallel::planner {

Status CheckLocalDevices(int devices, const hal::HostInfo& info) {
  if (devices > 4 * std::max(1, info.pus)) {
    return InvalidArgumentError(
        fmt::format("--devices {}: more than four per core of the {} cores this process may use",
                    devices, info.pus));
  }
  return OkStatus();
}

Result<MeasuredHost> MeasureLocalHost(const hal::HostInfo& info, int devices, bool quick) {
  const int cores = std::max(1, info.pus);
  KC_ASSIGN_OR_RETURN(hal::HostMeasurement host, hal::MeasureHost(info, {.quick = quick}));
  KC_ASSIGN_OR_RETURN(hal::TopologySpec spec,
                      hal::MakeCpuTopologySpec(
                          info, {.num_devices = std::min(devices, cores), .measured = host.cpu}));
  KC_ASSIGN_OR_RETURN(hal::Topology topology, hal::Topology::Build(std::move(spec)));
  KC_ASSIGN_OR_RETURN(PlannerCluster cluster, ClusterFromTopology(topology));
  MeasuredHost out{std::move(topology), std::move(cluster), {}};
  if (devices <= cores) {
    for (int i = 0; i < out.topology.num_devices(); ++i) {
      out.device_cpus.push_back(out.topology.device(i).cpus);
    }
    return out;
  }
  const double share = static_cast<double>(cores) / devices;
  ClusterSpec& c = out.cluster.spec;
  c.devices = devices;
  c.devices_per_node = devices;
  c.peak_flops *= share;
  c.memory_bytes *= share;
  c.memory_bandwidth *= share;
  c.oversubscription = 1 / share;
  out.device_cpus.assign(static_cast<size_t>(devices), {});
  out.cluster.notes.push_back(
      fmt::format("{} devices share {} cores, as kc train's ranks do: each gets {:.2f} of a core",
                  devices, cores, share));
  return out;
}

PlannerCluster FromCalibration(const Calibration& c, const std::string& model) {
  PlannerCluster out;
  out.spec = c.cluster;
  out.options = c.options;
  out.name = c.host;
  out.device_model = fmt::format("{}-core CPU slice", c.cpus_per_device);
  out.fp32 = true;
  out.spec.device = hal::DeviceKind::kCpu;
  if (c.model != model) {
    out.notes.push_back(
        fmt::format("calibrated with model {}: its kernel efficiencies stand in "
                    "for {}'s (kc plan {} --calibrate measures this one)",
                    c.model, model, model));
  }
  return out;
}

Result<LocalCluster> ProbeLocalCluster(int devices, const std::string& model,
                                       const std::string& calibration_path) {
  KC_ASSIGN_OR_RETURN(hal::HostInfo info, hal::ProbeHost());
  if (devices <= 0) devices = std::max(1, info.pus);
  KC_RETURN_IF_ERROR(CheckLocalDevices(devices, info));
  if (std::filesystem::exists(calibration_path)) {
    KC_ASSIGN_OR_RETURN(Calibration c, LoadCalibration(calibration_path));
    if (c.cluster.devices == devices) {
      return LocalCluster{FromCalibration(c, model), "calibration " + calibration_path};
    }
  }
  KC_ASSIGN_OR_RETURN(MeasuredHost measured, MeasureLocalHost(info, devices, /*quick=*/true));
  return LocalCluster{std::move(measured.cluster),
                      "quick probe, default efficiency (kc plan --calibrate to measure it)"};
}

Result<HostCalibration> CalibrateHost(const ModelSpec& spec, const hal::HostInfo& info,
                                      const HostCalibrationOptions& options) {
  auto progress = [&](const std::string& what) {
    if (options.progress) options.progress(what);
  };
  HostCalibration out;
  const int devices = options.devices > 0 ? options.devices : std::max(1, info.pus);
  KC_RETURN_IF_ERROR(CheckLocalDevices(devices, info));
  out.devices = devices;
  progress("measuring this host through L1 (memory, sgemm, shared memory)");
  KC_ASSIGN_OR_RETURN(MeasuredHost measured, MeasureLocalHost(info, devices, options.quick));
  const PlannerCluster& cluster = measured.cluster;
  out.notes = cluster.notes;

  CalibrationOptions co;
  co.peak_flops = cluster.spec.peak_flops;
  co.repetitions = options.quick ? 2 : 3;
  co.device_cpus = measured.device_cpus;
  const int64_t largest = std::min<int64_t>(options.max_micro_batch_size, 8);
  co.micro_batch_sizes.clear();
  for (int64_t b = 1; b <= largest; b *= 2) co.micro_batch_sizes.push_back(b);
  // Every tensor-parallel size a plan on these devices can have: each device its 1/t share.
  co.tensor_parallel.clear();
  for (int64_t t : Divisors(devices)) {
    if (spec.heads % t == 0 && spec.ffn_hidden % t == 0) {
      co.tensor_parallel.push_back(static_cast<int>(t));
    }
  }
  progress(fmt::format(
      "timing {}'s forward + backward at micro-batch {} and t {} on {} device{} at once", spec.name,
      fmt::join(co.micro_batch_sizes, ", "), fmt::join(co.tensor_parallel, ", "), devices,
      devices == 1 ? "" : "s"));
  KC_ASSIGN_OR_RETURN(ComputeCalibration compute, MeasureCompute(spec, co));
  // The engine's all-reduce between the devices: what tensor-, pipeline- and data-parallel
  // messages are timed with (one host: every link is this one).
  KC_ASSIGN_OR_RETURN(out.links, MeasureLinks({.device_cpus = co.device_cpus}));
  // How much of the gradient all-reduce the trainer's buckets hide behind the backward, with
  // the longest backward timed.
  KC_ASSIGN_OR_RETURN(out.overlap,
                      MeasureOverlap(spec, {.device_cpus = co.device_cpus,
                                            .micro_batch_size = co.micro_batch_sizes.back(),
                                            .repetitions = co.repetitions}));
  out.optimizer_seconds = compute.optimizer_seconds;

  Calibration& cal = out.calibration;
  cal.host = info.hostname;
  cal.model = spec.name;
  cal.cpus_per_device = static_cast<int>(measured.topology.device(0).cpus.size());
  cal.cluster = cluster.spec;
  cal.options = cluster.options;
  cal.options.matmul_efficiency = compute.fit.matmul_efficiency;
  cal.options.efficiency_half_size = compute.fit.efficiency_half_size;
  cal.options.efficiency_half_hidden = 0;  // measured on this model: its width is in the points
  cal.options.efficiency_points = EfficiencyTable(compute.points);
  const double params = static_cast<double>(ParameterCount(spec));
  if (cal.cluster.memory_bandwidth > 0) {
    cal.options.optimizer_step_bytes =
        compute.optimizer_seconds * cal.cluster.memory_bandwidth / params;
  }
  cal.options.measured_passes = PassTable(compute.points);
  if (devices > 1) cal.options.dp_overlap_fraction = out.overlap.fraction;
  if (out.links.bandwidth > 0) {
    cal.cluster.intra_node_bandwidth = out.links.bandwidth;
    cal.cluster.intra_node_latency = out.links.latency;
    cal.cluster.inter_node_bandwidth = out.links.bandwidth;
    cal.cluster.inter_node_latency = out.links.latency;
  }
  cal.points = std::move(compute.points);
  return out;
}

}  // namespace kc::parallel::planner
