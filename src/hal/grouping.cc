// Grouping files: reading with kc::config against a spec's device ids, and writing.
#include "hal/grouping.h"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "base/check.h"
#include "base/config.h"
#include "hal/internal/yaml_text.h"
#include "hal/inventory.h"

namespace kc::hal {
namespace {

using internal::YamlString;

Result<std::vector<Group>> ParseGrouping(config::Document doc, const TopologySpec& spec) {
  config::Map root = doc.root();
  std::string cluster = root.OptionalString("cluster", "");
  if (root.Has("cluster") && cluster != spec.name) {
    root.Reject("cluster",
                "this file is for another cluster; the topology is \"" + spec.name + "\"");
  }
  // An empty list is valid: no group is overridden.
  std::vector<config::Map> maps = root.RequiredMapList("groups");

  std::unordered_map<std::string_view, int> index_of;
  index_of.reserve(spec.devices.size());
  for (size_t i = 0; i < spec.devices.size(); ++i) {
    index_of.emplace(spec.devices[i].id, static_cast<int>(i));
  }
  std::vector<int> owner(spec.devices.size(), -1);  // device -> group index
  std::unordered_map<std::string, size_t> group_of_name;
  std::vector<Group> groups;
  groups.reserve(maps.size());
  for (size_t g = 0; g < maps.size(); ++g) {
    config::Map m = maps[g];
    Group& group = groups.emplace_back();
    group.name = m.String("name");
    if (m.Has("name")) {
      if (group.name.empty()) {
        m.Reject("name", "expected a non-empty name");
      } else if (auto [it, inserted] = group_of_name.emplace(group.name, g); !inserted) {
        m.Reject("name",
                 "duplicate group name (first at groups[" + std::to_string(it->second) + "])");
      }
    }
    std::vector<std::string> patterns = m.StringList("devices");
    if (m.Has("devices") && patterns.empty()) {
      m.Reject("devices", "expected at least one device; a group cannot be empty");
    }
    // After the first problem in a group, the rest of its list is not checked.
    bool bad = false;
    for (size_t p = 0; p < patterns.size() && !bad; ++p) {
      Result<std::vector<std::string>> ids =
          ExpandHostlist(patterns[p], std::max<size_t>(spec.devices.size(), 1));
      if (!ids.ok()) {
        m.Reject("devices", "devices[" + std::to_string(p) + "]: invalid pattern \"" + patterns[p] +
                                "\" (" + ids.status().message() + ")");
        break;
      }
      for (const std::string& id : *ids) {
        auto it = index_of.find(id);
        if (it == index_of.end()) {
          m.Reject("devices", "unknown device \"" + id + "\"");
          bad = true;
          break;
        }
        int& o = owner[static_cast<size_t>(it->second)];
        if (o == static_cast<int>(g)) {
          m.Reject("devices", "device \"" + id + "\" is named twice in this group");
          bad = true;
          break;
        }
        if (o >= 0) {
          m.Reject("devices", "device \"" + id + "\" is already in group \"" +
                                  groups[static_cast<size_t>(o)].name + "\" (groups[" +
                                  std::to_string(o) + "])");
          bad = true;
          break;
        }
        o = static_cast<int>(g);
        group.devices.push_back(it->second);
      }
    }
    std::sort(group.devices.begin(), group.devices.end());
  }
  KC_RETURN_IF_ERROR(doc.Finish());
  return groups;
}

// An id split as prefix + number ("dgx00/gpu" + 7); number -1 when the id does not end in
// a number written without leading zeros.
std::pair<std::string_view, int64_t> SplitTrailingNumber(std::string_view id) {
  size_t digits = 0;
  while (digits < id.size() && digits < 9 &&
         std::isdigit(static_cast<unsigned char>(id[id.size() - 1 - digits])) != 0) {
    ++digits;
  }
  std::string_view number = id.substr(id.size() - digits);
  if (digits == 0 || (digits > 1 && number[0] == '0')) return {id, -1};
  return {id.substr(0, id.size() - digits), std::stoll(std::string(number))};
}

// The devices of one group as patterns: runs of consecutive numbers become "prefix[a-b]".
std::vector<std::string> DevicePatterns(const std::vector<int>& devices, const TopologySpec& spec) {
  std::vector<std::string> out;
  for (size_t i = 0; i < devices.size();) {
    const std::string& id = spec.devices[static_cast<size_t>(devices[i])].id;
    auto [prefix, number] = SplitTrailingNumber(id);
    size_t j = i;
    if (number >= 0) {
      while (j + 1 < devices.size()) {
        auto [p, n] = SplitTrailingNumber(spec.devices[static_cast<size_t>(devices[j + 1])].id);
        if (p != prefix || n != number + static_cast<int64_t>(j + 1 - i)) break;
        ++j;
      }
    }
    if (j == i) {
      out.push_back(id);
    } else {
      out.push_back(std::string(prefix) + "[" + std::to_string(number) + "-" +
                    std::to_string(number + static_cast<int64_t>(j - i)) + "]");
    }
    i = j + 1;
  }
  return out;
}

}  // namespace

Result<std::vector<Group>> LoadGrouping(const std::string& path, const TopologySpec& spec) {
  KC_ASSIGN_OR_RETURN(config::Document doc, config::Document::LoadFile(path));
  return ParseGrouping(std::move(doc), spec);
}

Result<std::vector<Group>> LoadGroupingString(std::string_view text, std::string display_name,
                                              const TopologySpec& spec) {
  KC_ASSIGN_OR_RETURN(config::Document doc,
                      config::Document::LoadString(text, std::move(display_name)));
  return ParseGrouping(std::move(doc), spec);
}

std::string GroupingToYaml(const std::vector<Group>& groups, const TopologySpec& spec) {
  std::ostringstream out;
  out << "# Kuangchao groups (docs/user-guide/inventory.md). A device is in at most one group;\n"
         "# devices no group names keep their suggested group. \"h/gpu[0-3]\" is h/gpu0 to "
         "h/gpu3.\n";
  out << "cluster: " << YamlString(spec.name) << "\n";
  out << "groups:\n";
  for (const Group& group : groups) {
    for (int d : group.devices) {
      KC_CHECK(d >= 0 && static_cast<size_t>(d) < spec.devices.size())
          << "group " << group.name << " names device " << d << " of " << spec.devices.size();
    }
    out << "  - name: " << YamlString(group.name) << "\n";
    out << "    devices: [";
    std::vector<std::string> patterns = DevicePatterns(group.devices, spec);
    for (size_t i = 0; i < patterns.size(); ++i) {
      out << (i == 0 ? "" : ", ") << YamlString(patterns[i]);
    }
    out << "]\n";
  }
  return out.str();
}

}  // namespace kc::hal
