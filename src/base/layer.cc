#include "base/layer.h"

namespace kc {
namespace {
constexpr std::string_view kNames[kNumLayers] = {"base",  "hal",   "comm", "parallel",
                                                 "sched", "fault", "api"};
}  // namespace

std::string_view LayerName(Layer layer) { return kNames[static_cast<int>(layer)]; }

std::optional<Layer> LayerFromName(std::string_view name) {
  for (int i = 0; i < kNumLayers; ++i) {
    if (kNames[i] == name) return static_cast<Layer>(i);
  }
  return std::nullopt;
}

}  // namespace kc
