// Inventory files: a cluster written by hand in YAML (a library of device models, hosts as
// Slurm-style hostlists, intra-host links, the network), read into a TopologySpec and written
// back. The same format holds what `kc topo probe` measures. Format and error messages:
// docs/user-guide/inventory.md.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "hal/topology.h"

namespace kc::hal {

// Reads the inventory file at `path` into a spec for Topology::Build. Devices come host by
// host in file order, with ids "HOST/gpuN" (kinds simulated and cuda) or "HOST/cpuN" (kind
// cpu), N = index_on_host; explicit links are sorted by (a, b). Returns kNotFound if the file
// does not exist, and kInvalidArgument, as "FILE:LINE: key.path: what", for anything the file
// gets wrong (unknown key, wrong type, a zero or negative capacity, bad hostlist, duplicate
// host, unknown model, a link to an unknown device or to itself, no hosts, ...).
// Blocks on file I/O only; a 10,000-device file loads in milliseconds.
Result<TopologySpec> LoadInventory(const std::string& path);

// As LoadInventory, for YAML text in memory; `display_name` stands for the file in errors.
Result<TopologySpec> LoadInventoryString(std::string_view text, std::string display_name);

// Writes `spec` in the inventory format, one host entry per host, with explicit links and
// measured values. Loading the text gives back an equal spec (links sorted by (a, b)) when
// `spec` came from an inventory file; a figure computed elsewhere may come back one unit in
// the last place off, as the file's units (GB/s, TFLOP/s, µs) cannot hold every double.
// Returns kInvalidArgument, naming the device, host or link, when `spec` has a shape the
// format cannot express: devices not listed host by host in spec.hosts order with
// index_on_host 0, 1, ..., an id other than "HOST/gpuN" / "HOST/cpuN", devices of one host
// that differ in model, rack or network share, two models of one name that differ, or a link
// between devices of different hosts. Figures are not checked: a zero bandwidth is written
// as 0, and loading the text reports it.
Result<std::string> InventoryToYaml(const TopologySpec& spec);

// Expands a Slurm-style hostlist: comma-separated parts, each a name in which every
// "[...]" holds numbers and ranges ("1-3,7"); several brackets multiply out. A range keeps
// its lower bound's width: "dgx[08-10]" is dgx08 dgx09 dgx10. "a[1-2]b[0-1],c" is a1b0 a1b1
// a2b0 a2b1 c. Returns kInvalidArgument, saying what is wrong, for a bad expression (empty
// part, unmatched or nested bracket, a bound that is not a number, a range from high to low)
// or one that expands to more than `max_names` names.
Result<std::vector<std::string>> ExpandHostlist(std::string_view expr,
                                                size_t max_names = 1'000'000);

}  // namespace kc::hal
