// Delta chunks: a checkpoint chunk stored against the same chunk of the rank's previous save,
// so that a periodic checkpoint writes less than a full one and still restores bit-exactly.
//
// The encoding (docs/design/incremental-checkpoints.md): the XOR of the two chunks' 32-bit
// words, its bytes regrouped by their place in the word (every word's lowest byte, then every
// word's second byte, ...), compressed with zstd. Between two saves a float keeps its sign,
// exponent and high mantissa bits, so the XOR's high bytes are mostly zero and compress away;
// the low mantissa bits of a value training moved do not, which bounds what any lossless
// encoding saves.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kc::fault {

// `current` encoded against `base`: kInvalidArgument unless both have the same size, a
// multiple of 4.
Result<std::string> EncodeDelta(std::span<const std::byte> current,
                                std::span<const std::byte> base);

// The chunk `stored` encodes against `base`, into `out`: kDataLoss when `stored` is not a
// delta of `base`'s size (a corrupt or truncated file). The caller checks the content hash.
Status DecodeDelta(std::string_view stored, std::span<const std::byte> base,
                   std::vector<std::byte>* out);

}  // namespace kc::fault
