// The six layers of ARCHITECTURE.md (plus L0) as values, for the layer guard and log lines.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kc {

// Ordered bottom-up: a larger value is a higher layer.
enum class Layer : uint8_t {
  kBase = 0,      // L0 base
  kHal = 1,       // L1 hardware abstraction
  kComm = 2,      // L2 communication
  kParallel = 3,  // L3 parallel strategy
  kSched = 4,     // L4 scheduling
  kFault = 5,     // L5 fault tolerance
  kApi = 6,       // L6 interface and permissions
};

inline constexpr int kNumLayers = 7;

// "base", "hal", "comm", "parallel", "sched", "fault", "api": the folder names under src/.
std::string_view LayerName(Layer layer);
// The inverse of LayerName; nullopt for an unknown name.
std::optional<Layer> LayerFromName(std::string_view name);

}  // namespace kc
