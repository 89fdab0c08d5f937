#include "comm/internal/store_wire.h"

#include <bit>
#include <charconv>
#include <cstring>

namespace kc::comm::internal {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the store protocol's integers are copied in host order");

// Appends fixed-width little-endian integers and length-prefixed byte strings.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Raw(&v, sizeof(v)); }
  void U64(uint64_t v) { Raw(&v, sizeof(v)); }
  void I64(int64_t v) { Raw(&v, sizeof(v)); }
  void Bytes(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_->append(s);
  }

 private:
  void Raw(const void* p, size_t n) { out_->append(static_cast<const char*>(p), n); }
  std::string* out_;
};

// Reads what Writer writes; every getter returns false once the input runs out.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool U8(uint8_t* v) { return Raw(v, sizeof(*v)); }
  bool U32(uint32_t* v) { return Raw(v, sizeof(*v)); }
  bool U64(uint64_t* v) { return Raw(v, sizeof(*v)); }
  bool I64(int64_t* v) { return Raw(v, sizeof(*v)); }
  bool Flag(bool* v) {
    uint8_t b;
    if (!U8(&b) || b > 1) return false;
    *v = b == 1;
    return true;
  }
  bool Bytes(std::string_view* s) {
    uint32_t n;
    if (!U32(&n) || n > in_.size()) return false;
    *s = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }
  size_t left() const { return in_.size(); }
  bool done() const { return in_.empty(); }

 private:
  bool Raw(void* p, size_t n) {
    if (in_.size() < n) return false;
    std::memcpy(p, in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  std::string_view in_;
};

bool ValidCode(uint32_t code) {
  for (ErrorCode c : kAllErrorCodes) {
    if (static_cast<uint32_t>(c) == code) return true;
  }
  return false;
}

// Appends a frame: the header with body_bytes filled in once the body is written.
template <typename Body>
void AppendFrame(Header h, std::string* out, Body body) {
  const size_t start = out->size();
  out->resize(start + kHeaderBytes);
  Writer w(out);
  body(w);
  h.body_bytes = static_cast<uint32_t>(out->size() - start - kHeaderBytes);
  EncodeHeader(h, reinterpret_cast<unsigned char*>(out->data() + start));
}

}  // namespace

Status ValidateKey(std::string_view op, std::string_view key) {
  if (key.empty()) return InvalidArgumentError(std::string(op) + ": empty key");
  if (key.size() > kMaxKeyBytes) {
    return InvalidArgumentError(std::string(op) + " key=" + QuoteKey(key) + ": key of " +
                                std::to_string(key.size()) + " bytes exceeds the limit of " +
                                std::to_string(kMaxKeyBytes));
  }
  return OkStatus();
}

Status ValidateValue(std::string_view op, std::string_view key, std::string_view value) {
  if (value.size() > kMaxValueBytes) {
    return InvalidArgumentError(std::string(op) + " key=" + QuoteKey(key) + ": value of " +
                                std::to_string(value.size()) + " bytes exceeds the limit of " +
                                std::to_string(kMaxValueBytes));
  }
  return OkStatus();
}

std::string QuoteKey(std::string_view key) {
  constexpr size_t kShown = 64;
  std::string out = "\"";
  for (size_t i = 0; i < key.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  out += '"';
  if (key.size() > kShown) out += "...";
  return out;
}

std::optional<int64_t> ParseCounter(std::string_view value) {
  int64_t v = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec != std::errc() || p != end) return std::nullopt;
  return v;
}

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kSet:
      return "set";
    case Op::kGet:
      return "get";
    case Op::kWait:
      return "wait";
    case Op::kAdd:
      return "add";
    case Op::kCompareSet:
      return "compare_set";
    case Op::kDelete:
      return "delete";
    case Op::kCheck:
      return "check";
    case Op::kHello:
      return "hello";
  }
  return "unknown";
}

void EncodeHeader(const Header& h, unsigned char* out) {
  const uint32_t magic = kMagic;
  const uint32_t code = static_cast<uint32_t>(h.code);
  std::memcpy(out, &magic, 4);
  std::memcpy(out + 4, &h.body_bytes, 4);
  std::memcpy(out + 8, &h.request_id, 8);
  out[16] = static_cast<unsigned char>(h.op);
  out[17] = out[18] = out[19] = 0;
  std::memcpy(out + 20, &code, 4);
}

bool DecodeHeader(const unsigned char* in, Header* h) {
  uint32_t magic, code;
  std::memcpy(&magic, in, 4);
  std::memcpy(&h->body_bytes, in + 4, 4);
  std::memcpy(&h->request_id, in + 8, 8);
  std::memcpy(&code, in + 20, 4);
  const uint8_t op = in[16];
  if (magic != kMagic || op < static_cast<uint8_t>(Op::kSet) ||
      op > static_cast<uint8_t>(Op::kHello) || in[17] != 0 || in[18] != 0 || in[19] != 0 ||
      !ValidCode(code)) {
    return false;
  }
  h->op = static_cast<Op>(op);
  h->code = static_cast<ErrorCode>(code);
  return true;
}

void EncodeRequest(const Request& r, std::string* out) {
  AppendFrame({.request_id = r.request_id, .op = r.op}, out, [&](Writer& w) {
    switch (r.op) {
      case Op::kSet:
        w.Bytes(r.keys.at(0));
        w.Bytes(r.value);
        break;
      case Op::kGet:
        w.U64(r.timeout_ms);
        w.Bytes(r.keys.at(0));
        break;
      case Op::kWait:
        w.U64(r.timeout_ms);
        [[fallthrough]];
      case Op::kCheck:
        w.U32(static_cast<uint32_t>(r.keys.size()));
        for (std::string_view k : r.keys) w.Bytes(k);
        break;
      case Op::kAdd:
        w.I64(r.delta);
        w.Bytes(r.keys.at(0));
        break;
      case Op::kCompareSet:
        w.Bytes(r.keys.at(0));
        w.U8(r.expected.has_value() ? 1 : 0);
        w.Bytes(r.expected.value_or(std::string_view()));
        w.Bytes(r.value);
        break;
      case Op::kDelete:
      case Op::kHello:
        w.Bytes(r.keys.at(0));
        break;
    }
  });
}

bool DecodeRequestBody(const Header& h, std::string_view body, Request* r) {
  Reader in(body);
  *r = Request{.op = h.op, .request_id = h.request_id};
  std::string_view key;
  switch (h.op) {
    case Op::kSet:
      if (!in.Bytes(&key) || !in.Bytes(&r->value)) return false;
      r->keys.push_back(key);
      break;
    case Op::kGet:
      if (!in.U64(&r->timeout_ms) || !in.Bytes(&key)) return false;
      r->keys.push_back(key);
      break;
    case Op::kWait:
    case Op::kCheck: {
      if (h.op == Op::kWait && !in.U64(&r->timeout_ms)) return false;
      uint32_t count;
      // Each key takes at least its 4-byte length, which bounds the count before reserving.
      if (!in.U32(&count) || count > in.left() / 4) return false;
      r->keys.reserve(count);
      for (uint32_t i = 0; i < count; ++i) {
        if (!in.Bytes(&key)) return false;
        r->keys.push_back(key);
      }
      break;
    }
    case Op::kAdd:
      if (!in.I64(&r->delta) || !in.Bytes(&key)) return false;
      r->keys.push_back(key);
      break;
    case Op::kCompareSet: {
      bool has_expected;
      std::string_view expected;
      if (!in.Bytes(&key) || !in.Flag(&has_expected) || !in.Bytes(&expected) ||
          !in.Bytes(&r->value)) {
        return false;
      }
      if (!has_expected && !expected.empty()) return false;
      if (has_expected) r->expected = expected;
      r->keys.push_back(key);
      break;
    }
    case Op::kDelete:
    case Op::kHello:
      if (!in.Bytes(&key)) return false;
      r->keys.push_back(key);
      break;
  }
  return in.done();
}

Status CheckRequestLimits(const Request& r) {
  const std::string op = "store " + std::string(OpName(r.op));
  for (std::string_view k : r.keys) KC_RETURN_IF_ERROR(ValidateKey(op, k));
  if (r.op == Op::kSet || r.op == Op::kCompareSet) {
    KC_RETURN_IF_ERROR(ValidateValue(op, r.keys[0], r.value));
  }
  if (r.expected.has_value()) KC_RETURN_IF_ERROR(ValidateValue(op, r.keys[0], *r.expected));
  return OkStatus();
}

void EncodeReply(const Reply& r, std::string* out) {
  AppendFrame({.request_id = r.request_id, .op = r.op, .code = r.code}, out, [&](Writer& w) {
    if (r.code != ErrorCode::kOk) {
      w.Bytes(r.message.substr(0, kMaxMessageBytes));
      return;
    }
    switch (r.op) {
      case Op::kSet:
      case Op::kWait:
      case Op::kHello:
        break;
      case Op::kGet:
        w.Bytes(r.value);
        break;
      case Op::kAdd:
        w.I64(r.number);
        break;
      case Op::kCompareSet:
        w.U8(r.flag ? 1 : 0);
        w.U8(r.present ? 1 : 0);
        w.Bytes(r.present ? r.value : std::string_view());
        break;
      case Op::kDelete:
      case Op::kCheck:
        w.U8(r.flag ? 1 : 0);
        break;
    }
  });
}

bool DecodeReplyBody(const Header& h, std::string_view body, Reply* r) {
  Reader in(body);
  *r = Reply{.op = h.op, .request_id = h.request_id, .code = h.code};
  if (h.code != ErrorCode::kOk) return in.Bytes(&r->message) && in.done();
  switch (h.op) {
    case Op::kSet:
    case Op::kWait:
    case Op::kHello:
      break;
    case Op::kGet:
      if (!in.Bytes(&r->value)) return false;
      break;
    case Op::kAdd:
      if (!in.I64(&r->number)) return false;
      break;
    case Op::kCompareSet:
      if (!in.Flag(&r->flag) || !in.Flag(&r->present) || !in.Bytes(&r->value)) return false;
      if (!r->present && !r->value.empty()) return false;
      break;
    case Op::kDelete:
    case Op::kCheck:
      if (!in.Flag(&r->flag)) return false;
      break;
  }
  return in.done();
}

}  // namespace kc::comm::internal
