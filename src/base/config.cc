// Strict configuration reading. The YAML text is parsed by yaml-cpp and copied at once into
// a small tree of our own, so yaml-cpp's exceptions are caught in one place (Load) and
// reads never touch yaml-cpp.
#include "base/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <tuple>
#include <utility>

namespace kc::config {
namespace internal {

struct Entry;

// A YAML value copied out of yaml-cpp. Immutable after Load.
struct Node {
  enum class Kind { kNull, kScalar, kMap, kList };
  Kind kind = Kind::kNull;
  std::string text;            // kScalar: the value, quotes removed
  bool plain = false;          // kScalar: unquoted and untagged, so it may be a number or bool
  int line = 0;                // 1-based; 0 when unknown
  int column = 0;              // 1-based
  std::vector<Entry> entries;  // kMap, in document order
  std::vector<Node> items;     // kList
};

struct Entry {
  std::string key;
  int line = 0;  // of the key
  int column = 0;
  Node value;
};

// What the schema knows about one map it has read.
struct MapRecord {
  std::string path;  // "model", "hosts[2]"; "" for the top level
  // The map's entries; nullptr when the map is absent, empty or of the wrong type. Points
  // into DocumentState::root, which is immutable after Load.
  const Node* node = nullptr;
  int line = 0;                              // where "required key is missing" points
  bool silent = false;                       // the map's own value was wrong; reads record nothing
  std::set<std::string, std::less<>> known;  // every key the schema asked for
};

struct ErrorRecord {
  int line;
  int column;
  std::string text;
};

// What a read found at a key.
struct Found {
  const Node* value = nullptr;  // nullptr: absent (or the map is silent)
  bool report = true;           // false when the map is silent
  std::string path;             // "model.heads"
  int line = 0;                 // where an error about this key points
  int column = 0;
};

// How to read one scalar type: the phrase errors use for it, and the conversion, which
// returns nullopt when the node is not an acceptable value.
template <typename T>
struct Spec {
  std::string expected;  // "a positive integer"
  std::function<std::optional<T>(const Node&)> convert;
};

// Everything a Document owns. Not thread-safe.
struct DocumentState {
  // Records an error; the same text twice (a key read twice) is kept once.
  void AddError(int line, int column, std::string_view path, std::string_view what);
  // A new record, or the existing one for a map node read before.
  int AddMap(std::string path, const Node* node, int line, bool silent);
  Map MapAt(int id) { return Map(this, id); }
  // Finds `key` in map `id` and makes it known.
  Found Lookup(int id, std::string_view key);

  template <typename T>
  T Read(int id, std::string_view key, bool required, T fallback, const Spec<T>& spec);
  template <typename T>
  std::vector<T> ReadList(int id, std::string_view key, bool required, std::vector<T> fallback,
                          const Spec<T>& spec, std::string_view plural);
  Map ReadMap(int id, std::string_view key, bool required);
  std::vector<Map> ReadMapList(int id, std::string_view key, bool required);

  std::vector<ErrorRecord> UnknownKeys() const;

  std::string file;
  Node root;
  std::deque<MapRecord> maps;  // a deque, so records stay put as maps are added
  std::map<const Node*, int> map_ids;
  std::vector<ErrorRecord> errors;
};

}  // namespace internal

namespace {

using internal::DocumentState;
using internal::Entry;
using internal::ErrorRecord;
using internal::Found;
using internal::Node;
using internal::Spec;

constexpr int kMaxDepth = 100;
// Values a document may hold: a few per byte of its text (and a little more, for the aliases a
// small file uses to share settings), at most kMaxNodes. Aliases share their anchor's value, so
// a few hundred bytes of nested aliases name billions of values: reading them would cost time
// and memory out of all proportion to the file, which is refused instead at the budget.
constexpr int64_t kMaxNodes = 1'000'000;
constexpr int64_t kNodesPerByte = 2;
constexpr int64_t kNodesSlack = 4096;

int64_t NodeBudget(size_t text_bytes) {
  return std::min(kMaxNodes, kNodesSlack + kNodesPerByte * static_cast<int64_t>(text_bytes));
}
constexpr size_t kMaxQuotedBytes = 60;

// "FILE:LINE: ", or "FILE: " when the line is unknown.
std::string Where(const std::string& file, int line) {
  if (line <= 0) return file + ": ";
  return file + ":" + std::to_string(line) + ": ";
}

std::string JoinPath(std::string_view path, std::string_view key) {
  std::string out(path);
  if (!out.empty()) out += '.';
  out += key;
  return out;
}

std::string ElementPath(std::string_view path, size_t index) {
  return std::string(path) + "[" + std::to_string(index) + "]";
}

// `s` in double quotes, escaped, and cut short (at a UTF-8 boundary) when long.
std::string Quote(std::string_view s) {
  bool cut = false;
  if (s.size() > kMaxQuotedBytes) {
    size_t n = kMaxQuotedBytes;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
    s = s.substr(0, n);
    cut = true;
  }
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          constexpr char kHex[] = "0123456789abcdef";
          out += "\\x";
          out += kHex[(c >> 4) & 0xF];
          out += kHex[c & 0xF];
        } else {
          out += c;
        }
    }
  }
  if (cut) out += "...";
  out += '"';
  return out;
}

// The "VALUE" part of `got VALUE`.
std::string Describe(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kScalar:
      return Quote(node.text);
    case Node::Kind::kMap:
      return "a map";
    case Node::Kind::kList:
      return "a list";
    case Node::Kind::kNull:
      return "null";
  }
  return "null";
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// YAML 1.2 core-schema integers in base 10: [-+]?[0-9]+, within int64_t.
std::optional<int64_t> ParseInt(std::string_view s) {
  bool negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (s.empty() || !std::all_of(s.begin(), s.end(), IsDigit)) return std::nullopt;
  std::string digits = negative ? "-" + std::string(s) : std::string(s);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return value;
}

// YAML 1.2 core-schema floats: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)? and
// [-+]?.inf in three spellings. NaN is refused: it is never a meaningful setting.
std::optional<double> ParseDouble(std::string_view s) {
  bool negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (s == ".inf" || s == ".Inf" || s == ".INF") {
    double inf = std::numeric_limits<double>::infinity();
    return negative ? -inf : inf;
  }
  size_t i = 0;
  auto digits = [&] {
    size_t start = i;
    while (i < s.size() && IsDigit(s[i])) ++i;
    return i - start;
  };
  size_t mantissa = digits();
  if (i < s.size() && s[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    if (digits() == 0) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  std::string text = negative ? "-" + std::string(s) : std::string(s);
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

bool Contains(const Range& range, double v) {
  if (std::isnan(v)) return false;
  if (range.min_exclusive ? !(v > range.min) : !(v >= range.min)) return false;
  return v <= range.max;
}

// A bound as users wrote it: 0, 0.5, 1024, 1e-06 for tiny or huge values.
std::string FormatNumber(double v) {
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[64];
  std::to_chars_result r{};
  if (std::fabs(v) < 1e15 && (v == 0 || std::fabs(v) >= 1e-6)) {
    r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed);
  } else {
    r = std::to_chars(buf, buf + sizeof(buf), v);
  }
  if (r.ec != std::errc()) return "?";
  return std::string(buf, r.ptr);
}

// "a positive integer", "numbers in [0, 1]", "an integer >= 2", ...
std::string RangePhrase(const Range& range, bool integer, bool plural) {
  std::string noun = integer ? "integer" : "number";
  if (plural) noun += 's';
  bool has_min = std::isfinite(range.min);
  bool has_max = std::isfinite(range.max);
  std::string adjective;
  std::string suffix;
  if (has_min && !has_max && range.min == 0) {
    adjective = range.min_exclusive ? "positive " : "non-negative ";
  } else if (has_min && has_max) {
    suffix = std::string(" in ") + (range.min_exclusive ? "(" : "[") + FormatNumber(range.min) +
             ", " + FormatNumber(range.max) + "]";
  } else if (has_min) {
    suffix = (range.min_exclusive ? " > " : " >= ") + FormatNumber(range.min);
  } else if (has_max) {
    suffix = " <= " + FormatNumber(range.max);
  }
  std::string phrase = adjective + noun + suffix;
  if (plural) return phrase;
  bool vowel = phrase[0] == 'a' || phrase[0] == 'e' || phrase[0] == 'i' || phrase[0] == 'o' ||
               phrase[0] == 'u';
  return (vowel ? "an " : "a ") + phrase;
}

// A value inside `range`, returned by reads that failed so that schema code running on
// before Finish() does not divide by zero or allocate -1 elements.
int64_t HarmlessInt(const Range& range) {
  constexpr double kLimit = 9e18;  // inside int64_t
  for (double c : {0.0, std::ceil(range.min), std::floor(range.min) + 1, std::floor(range.max)}) {
    if (std::isfinite(c) && std::fabs(c) < kLimit && Contains(range, c)) {
      return static_cast<int64_t>(c);
    }
  }
  return 0;
}

double HarmlessDouble(const Range& range) {
  for (double c : {0.0, 1.0, range.min, range.min + 1, range.max, (range.min + range.max) / 2}) {
    if (std::isfinite(c) && Contains(range, c)) return c;
  }
  return 0;
}

Spec<int64_t> IntSpec(const Range& range) {
  return {RangePhrase(range, /*integer=*/true, /*plural=*/false),
          [range](const Node& n) -> std::optional<int64_t> {
            if (n.kind != Node::Kind::kScalar || !n.plain) return std::nullopt;
            std::optional<int64_t> v = ParseInt(n.text);
            if (!v || !Contains(range, static_cast<double>(*v))) return std::nullopt;
            return v;
          }};
}

Spec<double> DoubleSpec(const Range& range) {
  return {RangePhrase(range, /*integer=*/false, /*plural=*/false),
          [range](const Node& n) -> std::optional<double> {
            if (n.kind != Node::Kind::kScalar || !n.plain) return std::nullopt;
            std::optional<double> v = ParseDouble(n.text);
            if (!v || !Contains(range, *v)) return std::nullopt;
            return v;
          }};
}

Spec<bool> BoolSpec() {
  return {"true or false", [](const Node& n) -> std::optional<bool> {
            if (n.kind != Node::Kind::kScalar || !n.plain) return std::nullopt;
            if (n.text == "true") return true;
            if (n.text == "false") return false;
            return std::nullopt;
          }};
}

// Whether `s` is well-formed UTF-8 (no stray continuation bytes, truncated or overlong
// sequences, surrogates, or code points past U+10FFFF): what every reader downstream (JSON,
// the IDL's string fields, terminals) assumes of text.
bool IsUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int extra = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(extra) >= s.size()) return false;  // cut short
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<size_t>(extra) + 1;
  }
  return true;
}

Spec<std::string> StringSpec() {
  return {"a string", [](const Node& n) -> std::optional<std::string> {
            if (n.kind != Node::Kind::kScalar || !IsUtf8(n.text)) return std::nullopt;
            return n.text;
          }};
}

Spec<std::string> ChoiceSpec(std::initializer_list<std::string_view> choices) {
  std::string expected = "one of ";
  for (const std::string_view& c : choices) {
    if (&c != choices.begin()) expected += ", ";
    expected += Quote(c);
  }
  std::vector<std::string> allowed(choices.begin(), choices.end());
  return {expected, [allowed](const Node& n) -> std::optional<std::string> {
            if (n.kind != Node::Kind::kScalar) return std::nullopt;
            if (std::find(allowed.begin(), allowed.end(), n.text) == allowed.end()) {
              return std::nullopt;
            }
            return n.text;
          }};
}

// "expected a positive integer, got "eight"", plus a hint when only the quotes are wrong.
template <typename T>
std::string Mismatch(const Spec<T>& spec, const Node& got) {
  std::string what = "expected " + spec.expected + ", got " + Describe(got);
  if (got.kind == Node::Kind::kScalar && !got.plain) {
    Node unquoted = got;
    unquoted.plain = true;
    if (spec.convert(unquoted)) {
      what += " (a quoted string; write " + got.text + " without quotes)";
    }
  }
  return what;
}

// Optimal string alignment distance (Levenshtein plus adjacent swaps), ignoring case.
size_t EditDistance(std::string_view a, std::string_view b) {
  auto lower = [](char c) {
    return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  };
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
          lower(a[i - 2]) == lower(b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The known key closest to `key` if it is a likely misspelling, else "".
std::string ClosestKey(std::string_view key, const std::set<std::string, std::less<>>& known) {
  size_t limit = key.size() <= 4 ? 1 : 2;
  std::string best;
  size_t best_distance = limit + 1;
  for (const std::string& k : known) {
    size_t d = EditDistance(key, k);
    if (d < best_distance) {
      best = k;
      best_distance = d;
    }
  }
  return best;
}

// Where a text's documents start, and their first values, read as parser events without
// building them. (YAML::LoadAll builds every document, and loops for ever on one that starts
// with a stray ',': yaml-cpp 0.7 parses an empty document there without moving on, so every
// next document starts where the last did.)
class DocumentScan final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    starts.push_back(mark);
    first_nodes.push_back(YAML::Mark::null_mark());
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Value(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Value(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Value(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Value(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Value(mark);
  }
  void OnMapEnd() override {}

  std::vector<YAML::Mark> starts;       // per document
  std::vector<YAML::Mark> first_nodes;  // per document; null when it has none yet

 private:
  void Value(const YAML::Mark& mark) {
    if (!first_nodes.empty() && first_nodes.back().is_null()) first_nodes.back() = mark;
  }
};

// Copies a yaml-cpp tree into a Node tree. May throw yaml-cpp exceptions; Load catches them.
class TreeBuilder {
 public:
  TreeBuilder(const std::string& file, int64_t max_nodes) : file_(file), max_nodes_(max_nodes) {}

  // Non-OK (kInvalidArgument) on a key that is not a scalar, a duplicate key, nesting
  // deeper than kMaxDepth, or more than max_nodes values (aliases expand here).
  Status Build(const YAML::Node& in, const std::string& path, int depth, Node* out) {
    YAML::Mark mark = in.Mark();
    out->line = mark.is_null() ? 0 : mark.line + 1;
    out->column = mark.is_null() ? 0 : mark.column + 1;
    if (++num_nodes_ > max_nodes_) {
      return InvalidArgumentError(
          Where(file_, out->line) + "more than " + std::to_string(max_nodes_) +
          " values in the document, the most its size allows (an alias expanded too often?)");
    }
    if (depth > kMaxDepth) {
      return InvalidArgumentError(Where(file_, out->line) + path + ": nested more than " +
                                  std::to_string(kMaxDepth) + " levels deep (a recursive alias?)");
    }
    switch (in.Type()) {
      case YAML::NodeType::Scalar:
        out->kind = Node::Kind::kScalar;
        out->text = in.Scalar();
        out->plain = in.Tag() == "?";
        return OkStatus();
      case YAML::NodeType::Sequence: {
        out->kind = Node::Kind::kList;
        out->items.reserve(in.size());
        for (const YAML::Node& item : in) {
          out->items.emplace_back();
          KC_RETURN_IF_ERROR(
              Build(item, ElementPath(path, out->items.size() - 1), depth + 1, &out->items.back()));
        }
        return OkStatus();
      }
      case YAML::NodeType::Map: {
        out->kind = Node::Kind::kMap;
        std::map<std::string, int, std::less<>> first_line;
        for (const auto& kv : in) {
          YAML::Mark key_mark = kv.first.Mark();
          int key_line = key_mark.is_null() ? 0 : key_mark.line + 1;
          if (!kv.first.IsScalar()) {
            return InvalidArgumentError(Where(file_, key_line) + (path.empty() ? "" : path + ": ") +
                                        "keys must be strings, got " +
                                        (kv.first.IsMap()        ? "a map"
                                         : kv.first.IsSequence() ? "a list"
                                                                 : "null"));
          }
          std::string key_path = JoinPath(path, kv.first.Scalar());
          auto [it, inserted] = first_line.emplace(kv.first.Scalar(), key_line);
          if (!inserted) {
            return InvalidArgumentError(Where(file_, key_line) + key_path +
                                        ": duplicate key (first on line " +
                                        std::to_string(it->second) + ")");
          }
          Entry& entry = out->entries.emplace_back();
          entry.key = kv.first.Scalar();
          entry.line = key_line;
          entry.column = key_mark.is_null() ? 0 : key_mark.column + 1;
          KC_RETURN_IF_ERROR(Build(kv.second, key_path, depth + 1, &entry.value));
        }
        return OkStatus();
      }
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined:
        out->kind = Node::Kind::kNull;
        return OkStatus();
    }
    return OkStatus();
  }

 private:
  const std::string& file_;  // the Document's file name, which outlives the builder
  const int64_t max_nodes_;
  int64_t num_nodes_ = 0;
};

}  // namespace

namespace internal {

void DocumentState::AddError(int line, int column, std::string_view path, std::string_view what) {
  std::string text = Where(file, line);
  if (!path.empty()) {
    text += path;
    text += ": ";
  }
  text += what;
  for (const ErrorRecord& e : errors) {
    if (e.text == text) return;
  }
  errors.push_back({line, column, std::move(text)});
}

int DocumentState::AddMap(std::string path, const Node* node, int line, bool silent) {
  if (node != nullptr) {
    auto it = map_ids.find(node);
    if (it != map_ids.end()) return it->second;
  }
  int id = static_cast<int>(maps.size());
  MapRecord& record = maps.emplace_back();
  record.path = std::move(path);
  record.node = node;
  record.line = line;
  record.silent = silent;
  if (node != nullptr) map_ids.emplace(node, id);
  return id;
}

Found DocumentState::Lookup(int id, std::string_view key) {
  MapRecord& record = maps[static_cast<size_t>(id)];
  record.known.emplace(key);
  Found found;
  found.path = JoinPath(record.path, key);
  found.report = !record.silent;
  found.line = record.line;
  if (record.silent || record.node == nullptr) return found;
  for (const Entry& entry : record.node->entries) {
    if (entry.key != key) continue;
    found.value = &entry.value;
    // A scalar can sit on a later line than its key; anything else is best shown by the key.
    bool at_value = entry.value.kind == Node::Kind::kScalar && entry.value.line > 0;
    found.line = at_value ? entry.value.line : entry.line;
    found.column = at_value ? entry.value.column : entry.column;
    break;
  }
  return found;
}

template <typename T>
T DocumentState::Read(int id, std::string_view key, bool required, T fallback,
                      const Spec<T>& spec) {
  Found found = Lookup(id, key);
  if (found.value == nullptr) {
    if (required && found.report) {
      AddError(found.line, found.column, found.path, "required key is missing");
    }
    return fallback;
  }
  std::optional<T> value = spec.convert(*found.value);
  if (!value) {
    if (found.report) AddError(found.line, found.column, found.path, Mismatch(spec, *found.value));
    return fallback;
  }
  return *std::move(value);
}

template <typename T>
std::vector<T> DocumentState::ReadList(int id, std::string_view key, bool required,
                                       std::vector<T> fallback, const Spec<T>& spec,
                                       std::string_view plural) {
  Found found = Lookup(id, key);
  if (found.value == nullptr) {
    if (required && found.report) {
      AddError(found.line, found.column, found.path, "required key is missing");
    }
    return fallback;
  }
  const Node& list = *found.value;
  if (list.kind == Node::Kind::kNull) return {};
  if (list.kind != Node::Kind::kList) {
    AddError(found.line, found.column, found.path,
             "expected a list of " + std::string(plural) + ", got " + Describe(list));
    return fallback;
  }
  std::vector<T> out;
  out.reserve(list.items.size());
  bool ok = true;
  for (size_t i = 0; i < list.items.size(); ++i) {
    const Node& item = list.items[i];
    std::optional<T> value = spec.convert(item);
    if (value) {
      out.push_back(*std::move(value));
    } else {
      AddError(item.line, item.column, ElementPath(found.path, i), Mismatch(spec, item));
      ok = false;
    }
  }
  return ok ? out : fallback;
}

Map DocumentState::ReadMap(int id, std::string_view key, bool required) {
  Found found = Lookup(id, key);
  if (!found.report) return MapAt(AddMap(found.path, nullptr, 0, /*silent=*/true));
  if (found.value == nullptr) {
    if (required) {
      AddError(found.line, found.column, found.path, "required key is missing");
      return MapAt(AddMap(found.path, nullptr, 0, /*silent=*/true));
    }
    return MapAt(AddMap(found.path, nullptr, found.line, /*silent=*/false));
  }
  const Node& value = *found.value;
  switch (value.kind) {
    case Node::Kind::kMap:
      return MapAt(AddMap(found.path, &value, found.line, /*silent=*/false));
    case Node::Kind::kNull:
      return MapAt(AddMap(found.path, nullptr, found.line, /*silent=*/false));
    case Node::Kind::kScalar:
    case Node::Kind::kList:
      break;
  }
  AddError(found.line, found.column, found.path, "expected a map, got " + Describe(value));
  return MapAt(AddMap(found.path, nullptr, 0, /*silent=*/true));
}

std::vector<Map> DocumentState::ReadMapList(int id, std::string_view key, bool required) {
  Found found = Lookup(id, key);
  if (!found.report) return {};
  if (found.value == nullptr) {
    if (required) AddError(found.line, found.column, found.path, "required key is missing");
    return {};
  }
  const Node& list = *found.value;
  if (list.kind == Node::Kind::kNull) return {};
  if (list.kind != Node::Kind::kList) {
    AddError(found.line, found.column, found.path,
             "expected a list of maps, got " + Describe(list));
    return {};
  }
  std::vector<Map> out;
  out.reserve(list.items.size());
  for (size_t i = 0; i < list.items.size(); ++i) {
    const Node& item = list.items[i];
    std::string path = ElementPath(found.path, i);
    if (item.kind == Node::Kind::kMap) {
      out.push_back(MapAt(AddMap(std::move(path), &item, item.line, /*silent=*/false)));
    } else {
      AddError(item.line, item.column, path, "expected a map, got " + Describe(item));
      out.push_back(MapAt(AddMap(std::move(path), nullptr, 0, /*silent=*/true)));
    }
  }
  return out;
}

std::vector<ErrorRecord> DocumentState::UnknownKeys() const {
  std::vector<ErrorRecord> out;
  for (const MapRecord& record : maps) {
    if (record.silent || record.node == nullptr) continue;
    for (const Entry& entry : record.node->entries) {
      if (record.known.count(entry.key) != 0) continue;
      std::string text =
          Where(file, entry.line) + JoinPath(record.path, entry.key) + ": unknown key";
      std::string suggestion = ClosestKey(entry.key, record.known);
      if (!suggestion.empty()) {
        text += ", did you mean " + Quote(suggestion) + "?";
      } else if (!record.known.empty()) {
        std::string list;
        for (const std::string& k : record.known) list += (list.empty() ? "" : ", ") + k;
        text += " (known keys: " + list + ")";
      }
      out.push_back({entry.line, entry.column, std::move(text)});
    }
  }
  return out;
}

}  // namespace internal

// Map ------------------------------------------------------------------------------------

int64_t Map::Int(std::string_view key, Range range) {
  return doc_->Read(id_, key, /*required=*/true, HarmlessInt(range), IntSpec(range));
}

double Map::Double(std::string_view key, Range range) {
  return doc_->Read(id_, key, /*required=*/true, HarmlessDouble(range), DoubleSpec(range));
}

bool Map::Bool(std::string_view key) {
  return doc_->Read(id_, key, /*required=*/true, false, BoolSpec());
}

std::string Map::String(std::string_view key) {
  return doc_->Read(id_, key, /*required=*/true, std::string(), StringSpec());
}

std::string Map::Choice(std::string_view key, std::initializer_list<std::string_view> choices) {
  std::string harmless = choices.size() == 0 ? "" : std::string(*choices.begin());
  return doc_->Read(id_, key, /*required=*/true, std::move(harmless), ChoiceSpec(choices));
}

int64_t Map::OptionalInt(std::string_view key, int64_t fallback, Range range) {
  return doc_->Read(id_, key, /*required=*/false, fallback, IntSpec(range));
}

double Map::OptionalDouble(std::string_view key, double fallback, Range range) {
  return doc_->Read(id_, key, /*required=*/false, fallback, DoubleSpec(range));
}

bool Map::OptionalBool(std::string_view key, bool fallback) {
  return doc_->Read(id_, key, /*required=*/false, fallback, BoolSpec());
}

std::string Map::OptionalString(std::string_view key, std::string_view fallback) {
  return doc_->Read(id_, key, /*required=*/false, std::string(fallback), StringSpec());
}

std::string Map::OptionalChoice(std::string_view key, std::string_view fallback,
                                std::initializer_list<std::string_view> choices) {
  return doc_->Read(id_, key, /*required=*/false, std::string(fallback), ChoiceSpec(choices));
}

std::vector<int64_t> Map::IntList(std::string_view key, Range range) {
  return doc_->ReadList<int64_t>(id_, key, /*required=*/true, {}, IntSpec(range),
                                 RangePhrase(range, /*integer=*/true, /*plural=*/true));
}

std::vector<double> Map::DoubleList(std::string_view key, Range range) {
  return doc_->ReadList<double>(id_, key, /*required=*/true, {}, DoubleSpec(range),
                                RangePhrase(range, /*integer=*/false, /*plural=*/true));
}

std::vector<std::string> Map::StringList(std::string_view key) {
  return doc_->ReadList<std::string>(id_, key, /*required=*/true, {}, StringSpec(), "strings");
}

std::vector<int64_t> Map::OptionalIntList(std::string_view key, std::vector<int64_t> fallback,
                                          Range range) {
  return doc_->ReadList(id_, key, /*required=*/false, std::move(fallback), IntSpec(range),
                        RangePhrase(range, /*integer=*/true, /*plural=*/true));
}

std::vector<double> Map::OptionalDoubleList(std::string_view key, std::vector<double> fallback,
                                            Range range) {
  return doc_->ReadList(id_, key, /*required=*/false, std::move(fallback), DoubleSpec(range),
                        RangePhrase(range, /*integer=*/false, /*plural=*/true));
}

std::vector<std::string> Map::OptionalStringList(std::string_view key,
                                                 std::vector<std::string> fallback) {
  return doc_->ReadList(id_, key, /*required=*/false, std::move(fallback), StringSpec(), "strings");
}

Map Map::RequiredMap(std::string_view key) { return doc_->ReadMap(id_, key, /*required=*/true); }

Map Map::OptionalMap(std::string_view key) { return doc_->ReadMap(id_, key, /*required=*/false); }

std::vector<Map> Map::RequiredMapList(std::string_view key) {
  return doc_->ReadMapList(id_, key, /*required=*/true);
}

std::vector<Map> Map::OptionalMapList(std::string_view key) {
  return doc_->ReadMapList(id_, key, /*required=*/false);
}

bool Map::Has(std::string_view key) const {
  const internal::MapRecord& record = doc_->maps[static_cast<size_t>(id_)];
  if (record.silent || record.node == nullptr) return false;
  return std::any_of(record.node->entries.begin(), record.node->entries.end(),
                     [key](const Entry& e) { return e.key == key; });
}

std::vector<std::string> Map::Keys() {
  internal::MapRecord& record = doc_->maps[static_cast<size_t>(id_)];
  std::vector<std::string> keys;
  if (record.silent || record.node == nullptr) return keys;
  for (const Entry& entry : record.node->entries) {
    record.known.insert(entry.key);
    keys.push_back(entry.key);
  }
  return keys;
}

void Map::Reject(std::string_view key, std::string_view what) {
  Found found = doc_->Lookup(id_, key);
  if (!found.report) return;
  std::string text(what);
  if (found.value != nullptr && found.value->kind == Node::Kind::kScalar) {
    text += ", got " + Describe(*found.value);
  }
  doc_->AddError(found.line, found.column, found.path, text);
}

const std::string& Map::path() const { return doc_->maps[static_cast<size_t>(id_)].path; }

// Document -------------------------------------------------------------------------------

Document::Document(std::unique_ptr<internal::DocumentState> state) : state_(std::move(state)) {}
Document::Document(Document&&) noexcept = default;
Document& Document::operator=(Document&&) noexcept = default;
Document::~Document() = default;

Result<Document> Document::LoadFile(const std::string& path) {
  std::error_code ec;
  std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) {
    return NotFoundError(path + ": config file not found");
  }
  if (status.type() == std::filesystem::file_type::directory) {
    return InvalidArgumentError(path + ": cannot read config file: it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return InvalidArgumentError(path + ": cannot read config file: " +
                                std::error_code(errno, std::generic_category()).message());
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return InvalidArgumentError(path + ": cannot read config file: read failed");
  return LoadString(text, path);
}

Result<Document> Document::LoadString(std::string_view text, std::string display_name) {
  auto state = std::make_unique<internal::DocumentState>();
  state->file = std::move(display_name);
  const std::string& file = state->file;
  try {
    // The documents first, as events: a second one is refused before anything is built.
    std::istringstream in{std::string(text)};
    YAML::Parser parser(in);
    DocumentScan scan;
    while (scan.starts.size() < 2 && parser.HandleNextDocument(scan)) {
    }
    if (scan.starts.size() > 1) {
      if (scan.starts[1].pos == scan.starts[0].pos) {
        return InvalidArgumentError(Where(file, scan.starts[0].line + 1) +
                                    "YAML syntax error: no document can start here");
      }
      const YAML::Mark mark = scan.first_nodes[1].is_null() ? scan.starts[1] : scan.first_nodes[1];
      return InvalidArgumentError(Where(file, mark.line + 1) +
                                  "expected one YAML document, found a second one");
    }
    if (!scan.starts.empty()) {
      KC_RETURN_IF_ERROR(TreeBuilder(file, NodeBudget(text.size()))
                             .Build(YAML::Load(std::string(text)), "", 0, &state->root));
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(Where(file, e.mark.is_null() ? 0 : e.mark.line + 1) +
                                "YAML syntax error: " + e.msg);
  } catch (const std::exception& e) {
    return InternalError(file + ": YAML parser failed: " + e.what());
  }
  const Node& root = state->root;
  switch (root.kind) {
    case Node::Kind::kMap:
      state->AddMap("", &root, 1, /*silent=*/false);
      break;
    case Node::Kind::kNull:
      state->AddMap("", nullptr, 1, /*silent=*/false);
      break;
    case Node::Kind::kScalar:
    case Node::Kind::kList:
      return InvalidArgumentError(Where(file, root.line) + "expected a map at the top level, got " +
                                  Describe(root));
  }
  return Document(std::move(state));
}

Map Document::root() { return Map(state_.get(), 0); }

Status Document::Finish() const {
  std::vector<std::string> all = errors();
  if (all.empty()) return OkStatus();
  return InvalidArgumentError(all.front());
}

std::vector<std::string> Document::errors() const {
  std::vector<ErrorRecord> all = state_->errors;
  std::vector<ErrorRecord> unknown = state_->UnknownKeys();
  all.insert(all.end(), std::make_move_iterator(unknown.begin()),
             std::make_move_iterator(unknown.end()));
  std::stable_sort(all.begin(), all.end(), [](const ErrorRecord& a, const ErrorRecord& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
  std::vector<std::string> out;
  out.reserve(all.size());
  for (ErrorRecord& e : all) out.push_back(std::move(e.text));
  return out;
}

const std::string& Document::file_name() const { return state_->file; }

}  // namespace kc::config
