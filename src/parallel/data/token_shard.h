// Token shards: a fixed 64-byte header plus uint16 little-endian tokens, the byte-level
// tokenizer that fills them, and the manifest `kc data prepare` writes beside them.
// The byte layout is documented in src/parallel/doc/token_shard.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kc::parallel {

// The byte-level tokenizer: each byte is its own token (0-255), and 256 ends a document.
inline constexpr uint32_t kByteVocabSize = 257;
inline constexpr uint16_t kByteEotToken = 256;
// Header value of `eot_token` for a vocabulary without an end-of-text token.
inline constexpr uint32_t kNoEotToken = 0xffffffff;

inline constexpr uint32_t kTokenShardMagic = 0x3154434b;  // "KCT1"
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderBytes = 64;

// What a shard's header declares about its payload.
struct TokenShardHeader {
  uint32_t vocab_size = kByteVocabSize;  // every token is < vocab_size; 1 to 65536
  uint32_t eot_token = kByteEotToken;    // < vocab_size, or kNoEotToken
  uint64_t token_count = 0;
  uint64_t payload_checksum = 0;  // Fnv1a64 of the payload bytes as stored
};

// One shard read into memory.
struct TokenShard {
  TokenShardHeader header;
  std::vector<uint16_t> tokens;  // (token_count)
};

// FNV-1a, 64 bits (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
uint64_t Fnv1a64(std::span<const uint8_t> bytes, uint64_t hash = 0xcbf29ce484222325ULL);

// The bytes of a shard holding `tokens`: header then payload. `vocab_size` and `eot_token`
// come from `header`; its token_count and payload_checksum are computed.
// REQUIRES: every token < header.vocab_size (a bug otherwise; checked).
std::string EncodeTokenShard(std::span<const uint16_t> tokens, TokenShardHeader header = {});

// Parses and validates a whole shard held in `bytes`. `name` (usually the path) starts every
// error message. DATA_LOSS for a bad magic, a truncated or over-long file, a checksum
// mismatch, a token >= vocab_size or a malformed header field; UNIMPLEMENTED for another
// version or a token width other than 2.
Result<TokenShard> ParseTokenShard(std::string_view bytes, std::string_view name);

// Writes a shard to `path` (through `path`.tmp and a rename, so readers never see half a
// file). UNAVAILABLE, naming the file, when it cannot be written.
Status WriteTokenShard(const std::string& path, std::span<const uint16_t> tokens,
                       TokenShardHeader header = {});

// Reads and validates the shard at `path` (as ParseTokenShard). NOT_FOUND when the file does
// not exist, PERMISSION_DENIED or UNAVAILABLE when it cannot be read.
Result<TokenShard> ReadTokenShard(const std::string& path);

// Appends one token per byte of `text` to *tokens (no end-of-text token).
void ByteTokenize(std::string_view text, std::vector<uint16_t>* tokens);

// The text of byte tokens; the end-of-text token becomes "<|endoftext|>" and any other
// token >= 256 "<|N|>".
std::string ByteDetokenize(std::span<const uint16_t> tokens);
std::string ByteDetokenize(std::span<const int32_t> tokens);

// Splits `text` into documents at every line that is exactly `separator_line` (the line
// itself is dropped; "\n" and "\r\n" line ends). Empty documents are dropped. An empty
// separator gives `text` as one document (none when it is empty).
std::vector<std::string_view> SplitDocuments(std::string_view text,
                                             std::string_view separator_line);

// The manifest.json written beside a set of shards: which files hold each split.
struct ManifestShard {
  std::string file;  // relative to the manifest's directory
  uint64_t tokens = 0;
};
struct TokenManifest {
  std::string tokenizer = "byte";
  uint32_t vocab_size = kByteVocabSize;
  uint32_t eot_token = kByteEotToken;
  std::vector<ManifestShard> train;
  std::vector<ManifestShard> val;
};

// Writes `manifest` as JSON to `path` (atomically). UNAVAILABLE naming the file on failure.
Status WriteTokenManifest(const std::string& path, const TokenManifest& manifest);

// Reads a manifest. NOT_FOUND when the file does not exist; INVALID_ARGUMENT, naming the
// file and the field, when it is not a valid manifest.
Result<TokenManifest> ReadTokenManifest(const std::string& path);

}  // namespace kc::parallel
