// Inventory files: reading with kc::config (every check reported as FILE:LINE: key.path),
// hostlist expansion, and the writer that turns a spec back into the same format.
#include "hal/inventory.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "base/config.h"
#include "hal/internal/yaml_text.h"

namespace kc::hal {
namespace {

using internal::YamlString;

constexpr int64_t kMaxDevicesPerHost = 65'536;
constexpr int64_t kMaxDevices = 1'000'000;
constexpr size_t kMaxNumberDigits = 9;  // in a hostlist or cpu list; keeps every value in int

// Units of the file: GB/s and GB are 1e9 bytes, TFLOP/s is 1e12 FLOP/s, latencies are in µs.
double FromGiga(double q) { return q * 1e9; }
double FromTera(double q) { return q * 1e12; }
double FromMicro(double q) { return q / 1e6; }
int64_t BytesFromGb(double q) { return std::llround(q * 1e9); }

// Names of kinds as the file spells them. Local tables, so that reading does not depend on
// where device.h's name functions are defined.
constexpr std::pair<std::string_view, DeviceKind> kDeviceKinds[] = {
    {"simulated", DeviceKind::kSimulated},
    {"cuda", DeviceKind::kCuda},
    {"cpu", DeviceKind::kCpu},
};
constexpr std::pair<std::string_view, LinkKind> kIntraHostLinkKinds[] = {
    {"nvlink", LinkKind::kNvlink},
    {"pcie", LinkKind::kPcie},
    {"shm", LinkKind::kSharedMemory},
};

template <typename Kind, size_t N>
std::string_view KindName(const std::pair<std::string_view, Kind> (&table)[N], Kind kind) {
  for (const auto& [name, k] : table) {
    if (k == kind) return name;
  }
  return "";
}

template <typename Kind, size_t N>
Kind KindFromName(const std::pair<std::string_view, Kind> (&table)[N], std::string_view name) {
  for (const auto& [n, k] : table) {
    if (n == name) return k;
  }
  return table[0].second;
}

// "gpu" or "cpu": the middle of a device id.
std::string_view IdStem(DeviceKind kind) { return kind == DeviceKind::kCpu ? "cpu" : "gpu"; }

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

bool IsHostNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || IsDigit(c) || c == '.' || c == '_' ||
         c == '-';
}

bool IsValidHostName(std::string_view name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), IsHostNameChar);
}

// One item of a range list: lo-hi (or a single number, lo == hi); `width` is lo's digits.
struct NumberRange {
  int64_t lo = 0;
  int64_t hi = 0;
  size_t width = 0;
};

// Parses a number of at most kMaxNumberDigits digits, or returns nullopt.
std::optional<int64_t> ParseNumber(std::string_view s) {
  if (s.empty() || s.size() > kMaxNumberDigits || !std::all_of(s.begin(), s.end(), IsDigit)) {
    return std::nullopt;
  }
  int64_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

// Parses "1-3,7" (the inside of a hostlist bracket, or a Linux cpu list). On error returns a
// phrase for the message.
Result<std::vector<NumberRange>> ParseRangeList(std::string_view text) {
  std::vector<NumberRange> out;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string_view item = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty()) return InvalidArgumentError("empty item in \"" + std::string(text) + "\"");
    size_t dash = item.find('-');
    std::string_view lo_text = item.substr(0, dash);
    std::string_view hi_text = dash == std::string_view::npos ? lo_text : item.substr(dash + 1);
    std::optional<int64_t> lo = ParseNumber(lo_text);
    std::optional<int64_t> hi = ParseNumber(hi_text);
    if (!lo || !hi) {
      return InvalidArgumentError("\"" + std::string(item) +
                                  "\" is not a number or a range such as 1-3");
    }
    if (*lo > *hi) {
      return InvalidArgumentError("range \"" + std::string(item) + "\" runs from high to low");
    }
    out.push_back({*lo, *hi, lo_text.size()});
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// `v` in decimal, zero-padded to `width` digits.
std::string Padded(int64_t v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// Expands one comma-free part of a hostlist ("dgx[00-03]-ib[0-1]") into `out`.
Status ExpandPart(std::string_view part, size_t max_names, std::vector<std::string>* out) {
  // Alternatives for each segment, in order: a literal is one alternative.
  std::vector<std::vector<std::string>> segments;
  size_t total = 1;
  size_t i = 0;
  while (i < part.size()) {
    if (part[i] == ']') return InvalidArgumentError("\"]\" without \"[\"");
    if (part[i] != '[') {
      size_t next = part.find_first_of("[]", i);
      if (next == std::string_view::npos) next = part.size();
      segments.push_back({std::string(part.substr(i, next - i))});
      i = next;
      continue;
    }
    size_t close = part.find(']', i + 1);
    if (close == std::string_view::npos) return InvalidArgumentError("unclosed \"[\"");
    std::string_view inside = part.substr(i + 1, close - i - 1);
    if (inside.find('[') != std::string_view::npos) {
      return InvalidArgumentError("\"[\" inside \"[...]\"");
    }
    if (inside.empty()) return InvalidArgumentError("empty \"[]\"");
    KC_ASSIGN_OR_RETURN(std::vector<NumberRange> ranges, ParseRangeList(inside));
    size_t count = 0;
    for (const NumberRange& r : ranges) count += static_cast<size_t>(r.hi - r.lo + 1);
    if (count > max_names || total * count > max_names) {
      return InvalidArgumentError("expands to more than " + std::to_string(max_names) + " names");
    }
    total *= count;
    std::vector<std::string> alternatives;
    alternatives.reserve(count);
    for (const NumberRange& r : ranges) {
      for (int64_t v = r.lo; v <= r.hi; ++v) alternatives.push_back(Padded(v, r.width));
    }
    segments.push_back(std::move(alternatives));
    i = close + 1;
  }
  if (out->size() + total > max_names) {
    return InvalidArgumentError("expands to more than " + std::to_string(max_names) + " names");
  }
  // Multiply out, first segment slowest: a[1-2]b[0-1] -> a1b0 a1b1 a2b0 a2b1.
  std::vector<size_t> choice(segments.size(), 0);
  for (size_t n = 0; n < total; ++n) {
    std::string name;
    for (size_t s = 0; s < segments.size(); ++s) name += segments[s][choice[s]];
    out->push_back(std::move(name));
    for (size_t s = segments.size(); s-- > 0;) {
      if (++choice[s] < segments[s].size()) break;
      choice[s] = 0;
    }
  }
  return OkStatus();
}

// A Linux cpu list ("0-3,8") into the cpu indices, ascending as written; "" is no cpus.
Result<std::vector<int>> ParseCpuList(std::string_view text) {
  std::vector<int> cpus;
  if (text.empty()) return cpus;
  KC_ASSIGN_OR_RETURN(std::vector<NumberRange> ranges, ParseRangeList(text));
  for (const NumberRange& r : ranges) {
    if (r.hi - r.lo >= 1'000'000) return InvalidArgumentError("more than 1000000 cpus");
    for (int64_t v = r.lo; v <= r.hi; ++v) cpus.push_back(static_cast<int>(v));
  }
  return cpus;
}

// The reverse of ParseCpuList: runs of consecutive cpus as ranges.
std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

// Reading ---------------------------------------------------------------------------------

struct Model {
  DeviceKind kind = DeviceKind::kSimulated;
  int64_t memory_bytes = 0;
  double peak_flops_fp32 = 0;
  double peak_flops_bf16 = 0;
  double memory_bandwidth = 0;
};

// The fields shared by `intra_host` and an entry of `links`.
struct LinkFields {
  LinkKind kind = LinkKind::kPcie;
  double bandwidth = 0;
  double latency = 0;
  std::optional<double> measured_bandwidth;
  std::optional<double> measured_latency;
};

LinkFields ReadLinkFields(config::Map m) {
  LinkFields f;
  f.kind = KindFromName(kIntraHostLinkKinds, m.Choice("kind", {"nvlink", "pcie", "shm"}));
  f.bandwidth = FromGiga(m.Double("bandwidth_gbs", config::Positive()));
  f.latency = FromMicro(m.Double("latency_us", config::NonNegative()));
  // Read even when absent, so that a misspelling gets a "did you mean".
  double measured_bw = m.OptionalDouble("measured_bandwidth_gbs", 1, config::Positive());
  double measured_lat = m.OptionalDouble("measured_latency_us", 0, config::NonNegative());
  if (m.Has("measured_bandwidth_gbs")) f.measured_bandwidth = FromGiga(measured_bw);
  if (m.Has("measured_latency_us")) f.measured_latency = FromMicro(measured_lat);
  return f;
}

// "A100-SXM4-80GB", "H100-SXM5-80GB" (at most a few, for error messages).
std::string ListNames(const std::vector<std::string>& names) {
  constexpr size_t kMaxListed = 5;
  std::string out;
  for (size_t i = 0; i < names.size() && i < kMaxListed; ++i) {
    out += (i == 0 ? "\"" : ", \"") + names[i] + "\"";
  }
  if (names.size() > kMaxListed) out += ", ...";
  return out;
}

Result<TopologySpec> ParseInventory(config::Document doc) {
  config::Map root = doc.root();
  TopologySpec spec;
  spec.name = root.String("name");
  if (root.Has("name") && spec.name.empty()) root.Reject("name", "expected a non-empty name");

  config::Map network = root.OptionalMap("network");
  spec.network.cross_rack_bandwidth_factor = network.OptionalDouble(
      "cross_rack_bandwidth_factor", 1.0, {.min = 0, .max = 1, .min_exclusive = true});
  spec.network.cross_rack_latency =
      FromMicro(network.OptionalDouble("cross_rack_latency_us", 0, config::NonNegative()));

  // The model library: one map per model, keyed by its name.
  config::Map models_map = root.RequiredMap("models");
  std::vector<std::string> model_names = models_map.Keys();
  if (root.Has("models") && model_names.empty()) {
    root.Reject("models", "expected at least one device model");
  }
  std::unordered_map<std::string, Model> models;
  for (const std::string& name : model_names) {
    config::Map m = models_map.RequiredMap(name);
    Model model;
    model.kind = KindFromName(kDeviceKinds,
                              m.OptionalChoice("kind", "simulated", {"simulated", "cuda", "cpu"}));
    // At most 9e9 GB, so that the byte count fits in int64_t.
    model.memory_bytes =
        BytesFromGb(m.Double("memory_gb", {.min = 0, .max = 9e9, .min_exclusive = true}));
    model.peak_flops_fp32 = FromTera(m.Double("peak_tflops_fp32", config::Positive()));
    // 0: no bf16 arithmetic.
    model.peak_flops_bf16 = FromTera(m.Double("peak_tflops_bf16", config::NonNegative()));
    model.memory_bandwidth = FromGiga(m.Double("memory_bandwidth_gbs", config::Positive()));
    models.emplace(name, model);
  }

  std::vector<config::Map> entries = root.RequiredMapList("hosts");
  if (root.Has("hosts") && entries.empty()) {
    root.Reject("hosts", "expected at least one host entry");
  }
  std::unordered_map<std::string, size_t> entry_of_host;  // host name -> index of its entry
  int64_t num_devices = 0;
  for (size_t e = 0; e < entries.size(); ++e) {
    config::Map h = entries[e];
    std::string expr = h.String("name");
    std::vector<std::string> names;
    if (h.Has("name")) {
      Result<std::vector<std::string>> expanded = ExpandHostlist(expr, kMaxDevices);
      if (!expanded.ok()) {
        h.Reject("name", "invalid hostlist (" + expanded.status().message() + ")");
      } else {
        names = std::move(expanded).value();
      }
    }
    std::string rack = h.OptionalString("rack", "");
    std::string model_name = h.String("model");
    auto model_it = models.find(model_name);
    if (model_it == models.end() && h.Has("model") && !model_names.empty()) {
      h.Reject("model", "unknown model; models: " + ListNames(model_names));
    }
    int64_t count = h.Int("count", {.min = 1, .max = kMaxDevicesPerHost});

    std::optional<IntraHostDefault> intra;
    config::Map intra_map = h.OptionalMap("intra_host");
    if (h.Has("intra_host")) {
      LinkFields f = ReadLinkFields(intra_map);
      intra = IntraHostDefault{.kind = f.kind,
                               .bandwidth = f.bandwidth,
                               .latency = f.latency,
                               .measured_bandwidth = f.measured_bandwidth,
                               .measured_latency = f.measured_latency};
    }

    // Optional only for a host that talks to no other (a single-host topology, such as the
    // one `kc topo probe` writes without --peers); Topology::Build rejects a multi-host
    // topology with a host that declares no network.
    double network_bandwidth = 0;
    double network_latency = 0;
    if (h.Has("network")) {
      config::Map net = h.RequiredMap("network");
      network_bandwidth = FromGiga(net.Double("bandwidth_gbs", config::Positive()));
      network_latency = FromMicro(net.Double("latency_us", config::NonNegative()));
    }

    std::vector<int64_t> numa = h.OptionalIntList("numa_nodes", {}, {.min = -1});
    if (h.Has("numa_nodes") && static_cast<int64_t>(numa.size()) != count) {
      h.Reject("numa_nodes", "expected one NUMA node per device (" + std::to_string(count) +
                                 "), found " + std::to_string(numa.size()));
      numa.clear();
    }
    std::vector<std::string> cpu_lists = h.OptionalStringList("cpus");
    std::vector<std::vector<int>> cpus;
    if (h.Has("cpus") && static_cast<int64_t>(cpu_lists.size()) != count) {
      h.Reject("cpus", "expected one cpu list per device (" + std::to_string(count) + "), found " +
                           std::to_string(cpu_lists.size()));
    } else {
      for (size_t i = 0; i < cpu_lists.size(); ++i) {
        Result<std::vector<int>> parsed = ParseCpuList(cpu_lists[i]);
        if (!parsed.ok()) {
          h.Reject("cpus", "cpus[" + std::to_string(i) +
                               "]: expected a cpu list such as \"0-3,8\" (" +
                               parsed.status().message() + ")");
          cpus.clear();
          break;
        }
        cpus.push_back(std::move(parsed).value());
      }
    }

    // Explicit links, as (lo, hi) indices on the host; checked against `count`.
    struct HostLink {
      int lo;
      int hi;
      LinkFields fields;
    };
    std::vector<HostLink> host_links;
    std::unordered_map<int64_t, size_t> link_of_pair;  // lo * count + hi -> index in links
    std::vector<config::Map> link_maps = h.OptionalMapList("links");
    for (size_t l = 0; l < link_maps.size(); ++l) {
      config::Map lm = link_maps[l];
      std::vector<int64_t> between = lm.IntList("between", config::NonNegative());
      LinkFields fields = ReadLinkFields(lm);
      if (!lm.Has("between")) continue;
      if (between.size() != 2) {
        lm.Reject("between", "expected two device indices on the host, as [0, 1]");
        continue;
      }
      int64_t lo = std::min(between[0], between[1]);
      int64_t hi = std::max(between[0], between[1]);
      if (hi >= count) {
        lm.Reject("between", "no device " + std::to_string(hi) + " on this host (count " +
                                 std::to_string(count) + ": indices 0 to " +
                                 std::to_string(count - 1) + ")");
        continue;
      }
      if (lo == hi) {
        lm.Reject("between", "a link joins two different devices, not device " +
                                 std::to_string(lo) + " to itself");
        continue;
      }
      auto [it, inserted] = link_of_pair.emplace(lo * count + hi, l);
      if (!inserted) {
        lm.Reject("between", "duplicate link " + std::to_string(lo) + "-" + std::to_string(hi) +
                                 " (first at " + h.path() + ".links[" + std::to_string(it->second) +
                                 "])");
        continue;
      }
      host_links.push_back({static_cast<int>(lo), static_cast<int>(hi), fields});
    }

    if (model_it == models.end()) continue;  // reported above (or a missing key)
    const Model& model = model_it->second;
    for (const std::string& host : names) {
      if (!IsValidHostName(host)) {
        h.Reject("name", "host names hold only letters, digits, '.', '_' and '-'");
        break;
      }
      auto [it, inserted] = entry_of_host.emplace(host, e);
      if (!inserted) {
        h.Reject("name", it->second == e ? "host \"" + host + "\" appears twice in the hostlist"
                                         : "host \"" + host + "\" is already declared by hosts[" +
                                               std::to_string(it->second) + "]");
        break;
      }
      if (num_devices + count > kMaxDevices) {
        h.Reject("count",
                 "the cluster would have more than " + std::to_string(kMaxDevices) + " devices");
        break;
      }
      int base = static_cast<int>(num_devices);
      num_devices += count;
      spec.hosts.push_back({.name = host, .rack = rack, .intra_host_default = intra});
      for (int i = 0; i < count; ++i) {
        DeviceDescriptor& d = spec.devices.emplace_back();
        d.id = host;
        d.id += '/';
        d.id += IdStem(model.kind);
        d.id += std::to_string(i);
        d.kind = model.kind;
        d.model = model_name;
        d.host = host;
        d.rack = rack;
        d.index_on_host = i;
        if (!numa.empty()) d.numa_node = static_cast<int>(numa[static_cast<size_t>(i)]);
        if (!cpus.empty()) d.cpus = cpus[static_cast<size_t>(i)];
        d.memory_bytes = model.memory_bytes;
        d.peak_flops_fp32 = model.peak_flops_fp32;
        d.peak_flops_bf16 = model.peak_flops_bf16;
        d.memory_bandwidth = model.memory_bandwidth;
        d.network_bandwidth = network_bandwidth;
        d.network_latency = network_latency;
      }
      for (const HostLink& hl : host_links) {
        Link& link = spec.links.emplace_back();
        link.a = base + hl.lo;
        link.b = base + hl.hi;
        link.kind = hl.fields.kind;
        link.declared_bandwidth = hl.fields.bandwidth;
        link.declared_latency = hl.fields.latency;
        link.measured_bandwidth = hl.fields.measured_bandwidth;
        link.measured_latency = hl.fields.measured_latency;
      }
    }
  }
  KC_RETURN_IF_ERROR(doc.Finish());
  std::sort(spec.links.begin(), spec.links.end(),
            [](const Link& x, const Link& y) { return std::tie(x.a, x.b) < std::tie(y.a, y.b); });
  return spec;
}

// Writing ---------------------------------------------------------------------------------

// The shortest decimal that reads back as `x`; .inf for infinity.
std::string ShortestDouble(double x) {
  if (std::isinf(x)) return x > 0 ? ".inf" : "-.inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}

// `v` in the file's unit: the shortest decimal q near `approx` that reads back as exactly `v`
// (`error(q)` is 0), so that every value reading produced is written without loss. A value
// no q reaches (some computed in code) gets the q that reads back nearest to it.
std::string InUnit(double approx, const std::function<double(double)>& error) {
  if (!std::isfinite(approx)) return ShortestDouble(approx);
  double best = approx;
  double best_error = error(approx);
  double up = approx;
  double down = approx;
  constexpr int kSteps = 8;  // a few ulps each way
  for (int i = 0; i < kSteps && best_error != 0; ++i) {
    up = std::nextafter(up, std::numeric_limits<double>::infinity());
    down = std::nextafter(down, -std::numeric_limits<double>::infinity());
    for (double q : {up, down}) {
      double e = error(q);
      if (e < best_error) {
        best = q;
        best_error = e;
      }
    }
  }
  return ShortestDouble(best);
}

std::string Giga(double v) {
  return InUnit(v / 1e9, [v](double q) { return std::fabs(FromGiga(q) - v); });
}
std::string Tera(double v) {
  return InUnit(v / 1e12, [v](double q) { return std::fabs(FromTera(q) - v); });
}
std::string Micro(double v) {
  return InUnit(v * 1e6, [v](double q) { return std::fabs(FromMicro(q) - v); });
}
std::string Gb(int64_t bytes) {
  return InUnit(static_cast<double>(bytes) / 1e9, [bytes](double q) {
    return std::fabs(static_cast<double>(BytesFromGb(q) - bytes));
  });
}

// "kind: nvlink, bandwidth_gbs: 300, latency_us: 2[, measured_...]" for a flow map.
std::string LinkFieldsYaml(LinkKind kind, double bandwidth, double latency,
                           const std::optional<double>& measured_bandwidth,
                           const std::optional<double>& measured_latency) {
  std::string out = "kind: " + std::string(KindName(kIntraHostLinkKinds, kind)) +
                    ", bandwidth_gbs: " + Giga(bandwidth) + ", latency_us: " + Micro(latency);
  if (measured_bandwidth) out += ", measured_bandwidth_gbs: " + Giga(*measured_bandwidth);
  if (measured_latency) out += ", measured_latency_us: " + Micro(*measured_latency);
  return out;
}

bool SameModel(const DeviceDescriptor& a, const DeviceDescriptor& b) {
  return a.model == b.model && a.kind == b.kind && a.memory_bytes == b.memory_bytes &&
         a.peak_flops_fp32 == b.peak_flops_fp32 && a.peak_flops_bf16 == b.peak_flops_bf16 &&
         a.memory_bandwidth == b.memory_bandwidth;
}

}  // namespace

Result<std::vector<std::string>> ExpandHostlist(std::string_view expr, size_t max_names) {
  if (expr.empty()) return InvalidArgumentError("empty hostlist");
  std::vector<std::string> names;
  // Split at the commas outside brackets.
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= expr.size(); ++i) {
    if (i < expr.size()) {
      if (expr[i] == '[') ++depth;
      if (expr[i] == ']') --depth;
      if (expr[i] != ',' || depth > 0) continue;
    }
    std::string_view part = expr.substr(start, i - start);
    if (part.empty()) return InvalidArgumentError("empty name between commas");
    KC_RETURN_IF_ERROR(ExpandPart(part, max_names, &names));
    start = i + 1;
  }
  return names;
}

Result<TopologySpec> LoadInventory(const std::string& path) {
  KC_ASSIGN_OR_RETURN(config::Document doc, config::Document::LoadFile(path));
  return ParseInventory(std::move(doc));
}

Result<TopologySpec> LoadInventoryString(std::string_view text, std::string display_name) {
  KC_ASSIGN_OR_RETURN(config::Document doc,
                      config::Document::LoadString(text, std::move(display_name)));
  return ParseInventory(std::move(doc));
}

Result<std::string> InventoryToYaml(const TopologySpec& spec) {
  const std::vector<DeviceDescriptor>& devices = spec.devices;
  if (spec.hosts.empty()) return InvalidArgumentError("inventory: the spec has no hosts");
  std::unordered_map<std::string_view, size_t> host_index;
  for (size_t i = 0; i < spec.hosts.size(); ++i) {
    const HostSpec& host = spec.hosts[i];
    if (!host_index.emplace(host.name, i).second) {
      return InvalidArgumentError("inventory: host " + host.name + " is listed twice");
    }
    if (host.intra_host_default && host.intra_host_default->kind == LinkKind::kNetwork) {
      return InvalidArgumentError("inventory: host " + host.name +
                                  ": the intra-host default is nvlink, pcie or shm, not network");
    }
  }

  // Devices come host by host: host h owns devices [first[h], first[h + 1]).
  std::vector<size_t> first(spec.hosts.size() + 1, devices.size());
  std::vector<int> host_of(devices.size());
  size_t h = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceDescriptor& d = devices[i];
    if (i == 0 || d.host != devices[i - 1].host) {
      h = (i == 0) ? 0 : h + 1;
      if (h >= spec.hosts.size() || spec.hosts[h].name != d.host) {
        return InvalidArgumentError("inventory: device " + d.id +
                                    ": devices must be listed host by host, in the order of "
                                    "the spec's hosts");
      }
      first[h] = i;
    }
    host_of[i] = static_cast<int>(h);
    const HostSpec& host = spec.hosts[h];
    int index = static_cast<int>(i - first[h]);
    std::string id = d.host + "/" + std::string(IdStem(d.kind)) + std::to_string(index);
    if (d.index_on_host != index || d.id != id) {
      return InvalidArgumentError("inventory: device " + d.id + ": expected id " + id +
                                  " and index_on_host " + std::to_string(index));
    }
    if (!IsValidHostName(d.host)) {
      return InvalidArgumentError("inventory: host \"" + d.host +
                                  "\": host names hold only letters, digits, '.', '_' and '-'");
    }
    if (d.numa_node < -1 ||
        std::any_of(d.cpus.begin(), d.cpus.end(), [](int c) { return c < 0; })) {
      return InvalidArgumentError("inventory: device " + d.id + ": negative NUMA node or cpu");
    }
    if (d.rack != host.rack) {
      return InvalidArgumentError("inventory: device " + d.id + ": rack \"" + d.rack +
                                  "\" differs from its host's rack \"" + host.rack + "\"");
    }
    const DeviceDescriptor& head = devices[first[h]];
    if (!SameModel(d, head) || d.network_bandwidth != head.network_bandwidth ||
        d.network_latency != head.network_latency) {
      return InvalidArgumentError("inventory: device " + d.id + " differs from " + head.id +
                                  " in its model or network share; one host holds one model");
    }
  }
  if (devices.empty() || h + 1 != spec.hosts.size()) {
    size_t empty = devices.empty() ? 0 : h + 1;
    return InvalidArgumentError("inventory: host " + spec.hosts[empty].name + " has no devices");
  }

  // The model library, in order of first use; one name, one set of figures.
  std::vector<size_t> model_heads;
  std::unordered_map<std::string, size_t> model_head;
  for (size_t hi = 0; hi < spec.hosts.size(); ++hi) {
    const DeviceDescriptor& d = devices[first[hi]];
    auto [it, inserted] = model_head.emplace(d.model, first[hi]);
    if (inserted) {
      model_heads.push_back(first[hi]);
    } else if (!SameModel(d, devices[it->second])) {
      return InvalidArgumentError("inventory: device " + d.id + " and " + devices[it->second].id +
                                  " share the model name \"" + d.model +
                                  "\" but differ in its figures");
    }
  }

  // Links by host, sorted.
  std::vector<std::vector<const Link*>> links_of(spec.hosts.size());
  for (const Link& link : spec.links) {
    int n = static_cast<int>(devices.size());
    if (link.a < 0 || link.b < 0 || link.a >= n || link.b >= n || link.a == link.b ||
        host_of[link.a] != host_of[link.b]) {
      return InvalidArgumentError("inventory: link " + std::to_string(link.a) + "-" +
                                  std::to_string(link.b) +
                                  " does not join two devices of one host");
    }
    if (link.kind == LinkKind::kNetwork) {
      return InvalidArgumentError("inventory: link " + std::to_string(link.a) + "-" +
                                  std::to_string(link.b) +
                                  ": a link inside a host is nvlink, pcie or shm, not network");
    }
    links_of[host_of[link.a]].push_back(&link);
  }

  std::ostringstream out;
  out << "# Kuangchao inventory (docs/user-guide/inventory.md). Units: GB = 1e9 bytes, GB/s per\n"
         "# direction, TFLOP/s = 1e12 FLOP/s, latencies in microseconds.\n";
  out << "name: " << YamlString(spec.name) << "\n";
  out << "network:\n";
  out << "  cross_rack_bandwidth_factor: "
      << ShortestDouble(spec.network.cross_rack_bandwidth_factor) << "\n";
  out << "  cross_rack_latency_us: " << Micro(spec.network.cross_rack_latency) << "\n";
  out << "models:\n";
  for (size_t i : model_heads) {
    const DeviceDescriptor& d = devices[i];
    out << "  " << YamlString(d.model) << ":\n";
    out << "    kind: " << KindName(kDeviceKinds, d.kind) << "\n";
    out << "    memory_gb: " << Gb(d.memory_bytes) << "\n";
    out << "    peak_tflops_fp32: " << Tera(d.peak_flops_fp32) << "\n";
    out << "    peak_tflops_bf16: " << Tera(d.peak_flops_bf16) << "\n";
    out << "    memory_bandwidth_gbs: " << Giga(d.memory_bandwidth) << "\n";
  }
  out << "hosts:\n";
  for (size_t hi = 0; hi < spec.hosts.size(); ++hi) {
    const HostSpec& host = spec.hosts[hi];
    size_t begin = first[hi];
    size_t end = first[hi + 1];
    const DeviceDescriptor& d = devices[begin];
    out << "  - name: " << host.name << "\n";
    if (!host.rack.empty()) out << "    rack: " << YamlString(host.rack) << "\n";
    out << "    model: " << YamlString(d.model) << "\n";
    out << "    count: " << (end - begin) << "\n";
    if (host.intra_host_default) {
      const IntraHostDefault& x = *host.intra_host_default;
      out << "    intra_host: {"
          << LinkFieldsYaml(x.kind, x.bandwidth, x.latency, x.measured_bandwidth,
                            x.measured_latency)
          << "}\n";
    }
    if (d.network_bandwidth > 0) {
      out << "    network: {bandwidth_gbs: " << Giga(d.network_bandwidth)
          << ", latency_us: " << Micro(d.network_latency) << "}\n";
    }
    bool any_numa = std::any_of(devices.begin() + static_cast<ptrdiff_t>(begin),
                                devices.begin() + static_cast<ptrdiff_t>(end),
                                [](const DeviceDescriptor& x) { return x.numa_node != -1; });
    if (any_numa) {
      out << "    numa_nodes: [";
      for (size_t i = begin; i < end; ++i) out << (i == begin ? "" : ", ") << devices[i].numa_node;
      out << "]\n";
    }
    bool any_cpus = std::any_of(devices.begin() + static_cast<ptrdiff_t>(begin),
                                devices.begin() + static_cast<ptrdiff_t>(end),
                                [](const DeviceDescriptor& x) { return !x.cpus.empty(); });
    if (any_cpus) {
      out << "    cpus: [";
      for (size_t i = begin; i < end; ++i) {
        out << (i == begin ? "\"" : ", \"") << FormatCpuList(devices[i].cpus) << "\"";
      }
      out << "]\n";
    }
    std::vector<const Link*>& links = links_of[hi];
    if (!links.empty()) {
      std::sort(links.begin(), links.end(), [](const Link* x, const Link* y) {
        return std::minmax(x->a, x->b) < std::minmax(y->a, y->b);
      });
      out << "    links:\n";
      for (const Link* link : links) {
        auto [lo, hi_index] = std::minmax(link->a, link->b);
        out << "      - {between: [" << (lo - static_cast<int>(begin)) << ", "
            << (hi_index - static_cast<int>(begin)) << "], "
            << LinkFieldsYaml(link->kind, link->declared_bandwidth, link->declared_latency,
                              link->measured_bandwidth, link->measured_latency)
            << "}\n";
      }
    }
  }
  return out.str();
}

}  // namespace kc::hal
