#include "hal/device.h"

namespace kc::hal {

std::string_view DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
    case DeviceKind::kSimulated:
      return "simulated";
  }
  return "cpu";
}

std::string_view LinkKindName(LinkKind kind) {
  switch (kind) {
    case LinkKind::kSharedMemory:
      return "shm";
    case LinkKind::kNvlink:
      return "nvlink";
    case LinkKind::kPcie:
      return "pcie";
    case LinkKind::kNetwork:
      return "network";
  }
  return "pcie";
}

std::optional<LinkKind> LinkKindFromName(std::string_view name) {
  for (LinkKind k :
       {LinkKind::kSharedMemory, LinkKind::kNvlink, LinkKind::kPcie, LinkKind::kNetwork}) {
    if (LinkKindName(k) == name) return k;
  }
  return std::nullopt;
}

}  // namespace kc::hal
