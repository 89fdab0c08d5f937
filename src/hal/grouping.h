// Grouping files: the groups (islands of fast links) as a YAML file the user can edit, to
// override the groups a Topology suggests. `kc topo report --write-groups FILE` writes one.
// Format and error messages: docs/user-guide/inventory.md.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "hal/topology.h"

namespace kc::hal {

// Reads the grouping file at `path` for the cluster `spec`. Returns the groups in file order
// with name and devices (ascending indices into spec.devices) filled in; min_bandwidth and
// spans_* keep their defaults. The groups may cover a subset of the devices (none, for
// `groups: []`): Topology::ResolveGroups completes them with the suggested groups. Returns
// kNotFound if the file does not exist, and kInvalidArgument, as "FILE:LINE: key.path: what",
// for an unknown device id, a device named twice (saying which group had it first), an empty
// group, a duplicate group name, or a `cluster` other than spec.name. Blocks on file I/O only.
Result<std::vector<Group>> LoadGrouping(const std::string& path, const TopologySpec& spec);

// As LoadGrouping, for YAML text in memory; `display_name` stands for the file in errors.
Result<std::vector<Group>> LoadGroupingString(std::string_view text, std::string display_name,
                                              const TopologySpec& spec);

// Writes `groups` in the grouping format, for the user to edit; runs of consecutive device
// ids are shortened ("dgx00/gpu[0-7]"). LoadGroupingString of the text gives back the names
// and devices. REQUIRES: every index in `groups` is a device of `spec`.
std::string GroupingToYaml(const std::vector<Group>& groups, const TopologySpec& spec);

}  // namespace kc::hal
