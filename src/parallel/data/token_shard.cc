// Token shard encoding, validation and file I/O; the byte tokenizer; the shard manifest.
#include "parallel/data/token_shard.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace kc::parallel {
namespace {

// Header field offsets; see src/parallel/doc/token_shard.md.
constexpr size_t kMagicOffset = 0;
constexpr size_t kVersionOffset = 4;
constexpr size_t kTokenBytesOffset = 8;
constexpr size_t kVocabOffset = 12;
constexpr size_t kEotOffset = 16;
constexpr size_t kReserved1Offset = 20;
constexpr size_t kCountOffset = 24;
constexpr size_t kPayloadChecksumOffset = 32;
constexpr size_t kReserved2Offset = 40;
constexpr size_t kHeaderChecksumOffset = 56;
constexpr uint32_t kTokenBytes = 2;

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

Status ReadWholeFile(const std::string& path, std::string* out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    const std::string msg = fmt::format("{}: cannot open: {}", path, std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return NotFoundError(msg);
    if (err == EACCES || err == EPERM) return PermissionDeniedError(msg);
    return UnavailableError(msg);
  }
  out->clear();
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out->append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return UnavailableError(fmt::format("{}: read error", path));
  return OkStatus();
}

Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f)
      return UnavailableError(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f.flush()) return UnavailableError(fmt::format("{}: write failed", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return UnavailableError(fmt::format("{}: cannot rename to {}: {}", tmp, path, ec.message()));
  return OkStatus();
}

template <typename T>
std::string Detokenize(std::span<const T> tokens) {
  std::string out;
  out.reserve(tokens.size());
  for (T t : tokens) {
    if (t >= 0 && t < 256) {
      out.push_back(static_cast<char>(t));
    } else if (t == kByteEotToken) {
      out += "<|endoftext|>";
    } else {
      out += fmt::format("<|{}|>", static_cast<int64_t>(t));
    }
  }
  return out;
}

}  // namespace

uint64_t Fnv1a64(std::span<const uint8_t> bytes, uint64_t hash) {
  for (uint8_t b : bytes) {
    hash ^= b;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::string EncodeTokenShard(std::span<const uint16_t> tokens, TokenShardHeader header) {
  std::string out(kTokenShardHeaderBytes + kTokenBytes * tokens.size(), '\0');
  uint8_t* p = reinterpret_cast<uint8_t*>(out.data());
  uint8_t* payload = p + kTokenShardHeaderBytes;
  for (size_t i = 0; i < tokens.size(); ++i) {
    KC_CHECK(tokens[i] < header.vocab_size)
        << "token " << tokens[i] << " at index " << i << " >= vocab size " << header.vocab_size;
    payload[2 * i] = static_cast<uint8_t>(tokens[i]);
    payload[2 * i + 1] = static_cast<uint8_t>(tokens[i] >> 8);
  }
  PutU32(p + kMagicOffset, kTokenShardMagic);
  PutU32(p + kVersionOffset, kTokenShardVersion);
  PutU32(p + kTokenBytesOffset, kTokenBytes);
  PutU32(p + kVocabOffset, header.vocab_size);
  PutU32(p + kEotOffset, header.eot_token);
  PutU64(p + kCountOffset, tokens.size());
  PutU64(p + kPayloadChecksumOffset, Fnv1a64({payload, kTokenBytes * tokens.size()}));
  PutU64(p + kHeaderChecksumOffset, Fnv1a64({p, kHeaderChecksumOffset}));
  return out;
}

Result<TokenShard> ParseTokenShard(std::string_view bytes, std::string_view name) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (bytes.size() >= 4 && GetU32(p) != kTokenShardMagic) {
    return DataLossError(
        fmt::format("{}: bad magic 0x{:08x} (expected 0x{:08x}, \"KCT1\"): not a "
                    "kc token shard",
                    name, GetU32(p), kTokenShardMagic));
  }
  if (bytes.size() < kTokenShardHeaderBytes) {
    return DataLossError(fmt::format("{}: truncated: {} bytes, shorter than the {}-byte header",
                                     name, bytes.size(), kTokenShardHeaderBytes));
  }
  const uint32_t version = GetU32(p + kVersionOffset);
  if (version != kTokenShardVersion) {
    return UnimplementedError(fmt::format("{}: shard format version {}; this build reads {}", name,
                                          version, kTokenShardVersion));
  }
  const uint64_t header_sum = Fnv1a64({p, kHeaderChecksumOffset});
  if (GetU64(p + kHeaderChecksumOffset) != header_sum) {
    return DataLossError(
        fmt::format("{}: header checksum mismatch (stored 0x{:016x}, computed "
                    "0x{:016x}): the header is corrupt",
                    name, GetU64(p + kHeaderChecksumOffset), header_sum));
  }
  const uint32_t token_bytes = GetU32(p + kTokenBytesOffset);
  if (token_bytes != kTokenBytes) {
    return UnimplementedError(fmt::format("{}: token width {} bytes; this build reads {}", name,
                                          token_bytes, kTokenBytes));
  }
  bool reserved_zero = GetU32(p + kReserved1Offset) == 0;
  for (size_t i = kReserved2Offset; i < kHeaderChecksumOffset; ++i) reserved_zero &= p[i] == 0;
  if (!reserved_zero) {
    return DataLossError(fmt::format("{}: reserved header bytes are not zero", name));
  }
  TokenShard shard;
  TokenShardHeader& h = shard.header;
  h.vocab_size = GetU32(p + kVocabOffset);
  h.eot_token = GetU32(p + kEotOffset);
  h.token_count = GetU64(p + kCountOffset);
  h.payload_checksum = GetU64(p + kPayloadChecksumOffset);
  if (h.vocab_size == 0 || h.vocab_size > 65536) {
    return DataLossError(
        fmt::format("{}: vocab size {} is not in 1..65536 (uint16 tokens)", name, h.vocab_size));
  }
  if (h.eot_token != kNoEotToken && h.eot_token >= h.vocab_size) {
    return DataLossError(fmt::format("{}: end-of-text token {} is not below the vocab size {}",
                                     name, h.eot_token, h.vocab_size));
  }
  const uint64_t payload_bytes = bytes.size() - kTokenShardHeaderBytes;
  if (h.token_count > payload_bytes / kTokenBytes) {
    return DataLossError(fmt::format(
        "{}: truncated: the header declares {} tokens ({} bytes) but only {} payload bytes follow",
        name, h.token_count, h.token_count * kTokenBytes, payload_bytes));
  }
  if (payload_bytes != h.token_count * kTokenBytes) {
    return DataLossError(
        fmt::format("{}: {} trailing bytes after the {} tokens the header declares", name,
                    payload_bytes - h.token_count * kTokenBytes, h.token_count));
  }
  const uint8_t* payload = p + kTokenShardHeaderBytes;
  const uint64_t sum = Fnv1a64({payload, payload_bytes});
  if (sum != h.payload_checksum) {
    return DataLossError(fmt::format(
        "{}: payload checksum mismatch (header 0x{:016x}, computed 0x{:016x}): the tokens are "
        "corrupt",
        name, h.payload_checksum, sum));
  }
  shard.tokens.resize(h.token_count);
  for (uint64_t i = 0; i < h.token_count; ++i) {
    const uint16_t t = static_cast<uint16_t>(payload[2 * i] | (payload[2 * i + 1] << 8));
    if (t >= h.vocab_size) {
      return DataLossError(fmt::format("{}: token {} at index {} is not below the vocab size {}",
                                       name, t, i, h.vocab_size));
    }
    shard.tokens[i] = t;
  }
  return shard;
}

Status WriteTokenShard(const std::string& path, std::span<const uint16_t> tokens,
                       TokenShardHeader header) {
  return WriteFileAtomically(path, EncodeTokenShard(tokens, header));
}

Result<TokenShard> ReadTokenShard(const std::string& path) {
  std::string bytes;
  KC_RETURN_IF_ERROR(ReadWholeFile(path, &bytes));
  return ParseTokenShard(bytes, path);
}

void ByteTokenize(std::string_view text, std::vector<uint16_t>* tokens) {
  tokens->reserve(tokens->size() + text.size());
  for (char c : text) tokens->push_back(static_cast<uint8_t>(c));
}

std::string ByteDetokenize(std::span<const uint16_t> tokens) { return Detokenize(tokens); }
std::string ByteDetokenize(std::span<const int32_t> tokens) { return Detokenize(tokens); }

std::vector<std::string_view> SplitDocuments(std::string_view text,
                                             std::string_view separator_line) {
  std::vector<std::string_view> docs;
  if (separator_line.empty()) {
    if (!text.empty()) docs.push_back(text);
    return docs;
  }
  size_t doc_start = 0;
  size_t line_start = 0;
  while (line_start < text.size()) {
    size_t nl = text.find('\n', line_start);
    const size_t line_end = nl == std::string_view::npos ? text.size() : nl;
    std::string_view line = text.substr(line_start, line_end - line_start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const size_t next = nl == std::string_view::npos ? text.size() : nl + 1;
    if (line == separator_line) {
      if (line_start > doc_start) docs.push_back(text.substr(doc_start, line_start - doc_start));
      doc_start = next;
    }
    line_start = next;
  }
  if (doc_start < text.size()) docs.push_back(text.substr(doc_start));
  return docs;
}

Status WriteTokenManifest(const std::string& path, const TokenManifest& manifest) {
  nlohmann::json j = {{"format", "kc-token-shards"},     {"version", 1},
                      {"tokenizer", manifest.tokenizer}, {"vocab_size", manifest.vocab_size},
                      {"eot_token", manifest.eot_token}, {"train", nlohmann::json::array()},
                      {"val", nlohmann::json::array()}};
  uint64_t train_tokens = 0, val_tokens = 0;
  for (const ManifestShard& s : manifest.train) {
    j["train"].push_back({{"file", s.file}, {"tokens", s.tokens}});
    train_tokens += s.tokens;
  }
  for (const ManifestShard& s : manifest.val) {
    j["val"].push_back({{"file", s.file}, {"tokens", s.tokens}});
    val_tokens += s.tokens;
  }
  j["train_tokens"] = train_tokens;
  j["val_tokens"] = val_tokens;
  return WriteFileAtomically(path, j.dump(2) + "\n");
}

Result<TokenManifest> ReadTokenManifest(const std::string& path) {
  std::string text;
  KC_RETURN_IF_ERROR(ReadWholeFile(path, &text));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(fmt::format("{}: not a JSON object", path));
  }
  auto bad = [&](std::string_view field, std::string_view want) {
    return InvalidArgumentError(fmt::format("{}: {}: expected {}", path, field, want));
  };
  if (j.value("format", "") != "kc-token-shards") {
    return bad("format", "\"kc-token-shards\" (not a kc data prepare manifest)");
  }
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != 1) {
    return bad("version", "1");
  }
  TokenManifest m;
  if (!j.contains("tokenizer") || !j["tokenizer"].is_string()) return bad("tokenizer", "a string");
  m.tokenizer = j["tokenizer"].get<std::string>();
  if (!j.contains("vocab_size") || !j["vocab_size"].is_number_unsigned() ||
      j["vocab_size"].get<uint64_t>() == 0 || j["vocab_size"].get<uint64_t>() > 65536) {
    return bad("vocab_size", "an integer in 1..65536");
  }
  m.vocab_size = j["vocab_size"].get<uint32_t>();
  if (!j.contains("eot_token") || !j["eot_token"].is_number_unsigned() ||
      j["eot_token"].get<uint64_t>() > kNoEotToken) {
    return bad("eot_token", "an unsigned 32-bit integer");
  }
  m.eot_token = j["eot_token"].get<uint32_t>();
  for (const char* split : {"train", "val"}) {
    if (!j.contains(split) || !j[split].is_array()) return bad(split, "a list of shards");
    std::vector<ManifestShard>& out = std::string_view(split) == "train" ? m.train : m.val;
    for (size_t i = 0; i < j[split].size(); ++i) {
      const nlohmann::json& s = j[split][i];
      const std::string field = fmt::format("{}[{}]", split, i);
      if (!s.is_object() || !s.contains("file") || !s["file"].is_string() ||
          s["file"].get<std::string>().empty()) {
        return bad(field + ".file", "a file name");
      }
      if (!s.contains("tokens") || !s["tokens"].is_number_unsigned()) {
        return bad(field + ".tokens", "a token count");
      }
      out.push_back({s["file"].get<std::string>(), s["tokens"].get<uint64_t>()});
    }
  }
  return m;
}

}  // namespace kc::parallel
