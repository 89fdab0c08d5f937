// Strict YAML configuration files: schema code names every key it expects, and anything
// else (unknown key, wrong type, missing key, out-of-range value) becomes an error of the
// form `FILE:LINE: key.path: what was expected, got "VALUE"`.
//
//   KC_ASSIGN_OR_RETURN(config::Document doc, config::Document::LoadFile(path));
//   config::Map model = doc.root().RequiredMap("model");
//   int64_t heads = model.Int("heads", config::Positive());
//   double dropout = model.OptionalDouble("dropout", 0.0, config::InRange(0.0, 1.0));
//   for (config::Map host : doc.root().RequiredMapList("hosts")) { ... }
//   KC_RETURN_IF_ERROR(doc.Finish());
//
// Reads never fail: a bad value is recorded in its Document and the read returns a harmless
// value, so schema code needs no checks until Finish(). User-facing rules are described in
// docs/user-guide/configuration.md.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kc::config {

namespace internal {
struct DocumentState;
}  // namespace internal

// A numeric constraint for Int and Double reads. Errors describe it in words ("a positive
// integer", "a number in [0, 1]"). The default accepts every value; designated initialisers
// give one-sided bounds, e.g. Range{.min = 2}.
struct Range {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;  // min itself is not allowed (Positive())
};
inline Range Positive() { return {.min = 0, .min_exclusive = true}; }          // > 0
inline Range NonNegative() { return {.min = 0}; }                              // >= 0
inline Range InRange(double lo, double hi) { return {.min = lo, .max = hi}; }  // [lo, hi]

// One YAML map of a Document, seen through the schema: each read names a key and says what
// it expects there. Reads never fail: a problem (missing required key, wrong type, value out
// of range) is recorded in the Document, and the read returns a harmless value (the fallback
// of an Optional read; otherwise zero, "", false, an empty list, the first choice, or a
// value inside `range`). Every key read, present or not, becomes a known key of this map;
// Document::Finish() reports the keys nobody read. Reading a map whose own value was wrong
// records nothing more.
// A cheap handle; copy it freely. Not thread-safe, like its Document.
// REQUIRES: the Document outlives this Map (moving the Document is fine).
class Map {
 public:
  // Required scalars: a missing key is an error. Int takes only an unquoted whole number
  // (8, -3; not "8", 8.0 or eight); Double takes unquoted numbers (0.1, 1e-4, 3, .inf);
  // Bool takes only unquoted true or false; String takes any scalar, quoted or not.
  int64_t Int(std::string_view key, Range range = {});
  double Double(std::string_view key, Range range = {});
  bool Bool(std::string_view key);
  std::string String(std::string_view key);
  // A string that must equal one of `choices` (an enum). Returns it, or choices[0] on error.
  std::string Choice(std::string_view key, std::initializer_list<std::string_view> choices);

  // Optional scalars: return `fallback` when the key is absent, or when its value is wrong
  // (which is still recorded as an error). The fallback itself is not checked.
  int64_t OptionalInt(std::string_view key, int64_t fallback, Range range = {});
  double OptionalDouble(std::string_view key, double fallback, Range range = {});
  bool OptionalBool(std::string_view key, bool fallback);
  std::string OptionalString(std::string_view key, std::string_view fallback);
  std::string OptionalChoice(std::string_view key, std::string_view fallback,
                             std::initializer_list<std::string_view> choices);

  // Lists of scalars, with the rules above for each element; an element's errors name it
  // as key[i] (0-based). An empty value (`key:`) reads as an empty list. The Optional forms
  // return `fallback` when the key is absent.
  std::vector<int64_t> IntList(std::string_view key, Range range = {});
  std::vector<double> DoubleList(std::string_view key, Range range = {});
  std::vector<std::string> StringList(std::string_view key);
  std::vector<int64_t> OptionalIntList(std::string_view key, std::vector<int64_t> fallback = {},
                                       Range range = {});
  std::vector<double> OptionalDoubleList(std::string_view key, std::vector<double> fallback = {},
                                         Range range = {});
  std::vector<std::string> OptionalStringList(std::string_view key,
                                              std::vector<std::string> fallback = {});

  // The nested map at `key`, whose paths read as key.child. An absent optional map, or an
  // empty value (`key:`), reads as an empty map: its optional keys take their fallbacks and
  // its required keys are reported missing. Reading the same key twice gives the same map.
  Map RequiredMap(std::string_view key);
  Map OptionalMap(std::string_view key);

  // The list of maps at `key`, one Map per element, whose paths read as key[i].child. An
  // element that is not a map is an error and reads as an empty, silent Map. An absent
  // optional list, or an empty value, gives no elements.
  std::vector<Map> RequiredMapList(std::string_view key);
  std::vector<Map> OptionalMapList(std::string_view key);

  // True if `key` is present (with any value). Does not make the key known.
  bool Has(std::string_view key) const;

  // Every key present, in document order, all made known: for maps whose keys are names
  // chosen by the user (e.g. one entry per host), read each with the calls above.
  std::vector<std::string> Keys();

  // Records a check the schema makes itself, in the same format: `what` is the expectation
  // ("expected a divisor of hidden (512)"); `, got "VALUE"` is appended when the key holds
  // a scalar. Points at the key's value, or at this map when the key is absent.
  void Reject(std::string_view key, std::string_view what);

  // This map's path as errors show it: "model", "cluster.hosts[3]"; "" for the top level.
  const std::string& path() const;

 private:
  friend class Document;
  friend struct internal::DocumentState;
  Map(internal::DocumentState* doc, int id) : doc_(doc), id_(id) {}

  // Owned by the Document, which the caller keeps alive (see REQUIRES above). The state is
  // heap-allocated, so moving the Document does not move it.
  internal::DocumentState* doc_;
  int id_;  // index of this map's record in *doc_
};

// A parsed configuration file and the errors found while reading it. Move-only. Not
// thread-safe; owned by the thread that reads the configuration.
class Document {
 public:
  // Reads and parses the YAML file at `path`; errors name the file by `path` as passed.
  // Returns kNotFound if the file does not exist, and kInvalidArgument if it cannot be read
  // (e.g. a directory), if it is not valid YAML ("FILE:LINE: YAML syntax error: ..."), or if
  // it holds more than one document or a top level other than a map. An empty file is an
  // empty map. Blocks on file I/O only.
  static Result<Document> LoadFile(const std::string& path);

  // As LoadFile, for YAML text in memory; `display_name` stands for the file in errors.
  static Result<Document> LoadString(std::string_view text, std::string display_name);

  Document(Document&&) noexcept;
  Document& operator=(Document&&) noexcept;
  ~Document();

  // The top-level map. Calling it again gives the same map.
  Map root();

  // OK if every read so far found what it expected and every key of every map that was
  // read is known. Otherwise kInvalidArgument whose message is the first line of errors().
  // Call it after all reads.
  Status Finish() const;

  // Every error recorded so far, plus the unknown keys of the maps read so far, one line
  // each in the form `FILE:LINE: key.path: ...`, sorted by position in the file.
  std::vector<std::string> errors() const;

  // The file name as passed to LoadFile, or LoadString's display name.
  const std::string& file_name() const;

 private:
  explicit Document(std::unique_ptr<internal::DocumentState> state);

  std::unique_ptr<internal::DocumentState> state_;
};

}  // namespace kc::config
