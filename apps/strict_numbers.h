// Numbers on a command line mean what they say: CLI11 reads integers with strtoll (which clamps
// 99999999999999999999 to the largest int64 and reads 0x10 and 010 as hex and octal) and
// floats with strtold (which takes inf, nan and 1e400). RefuseLooseNumbers makes every numeric
// option of an app, and of its subcommands, take only plain decimal numbers that fit and are
// finite, and refuses any other as out of range before the command runs. Header-only: kc and
// kcd share it.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <system_error>

namespace kc::app {

// "" when `text` is a number an option of CLI11 type `type` ("INT", "UINT", "FLOAT") takes
// as written; else why not.
inline std::string LooseNumberProblem(const std::string& type, const std::string& text) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  const auto refused = [&](const char* what) {
    return "\"" + text + "\" is out of range or not " + what;
  };
  if (type == "INT" || type == "UINT") {
    // Plain decimal: no base prefix, no leading '+', and within the type's range.
    if (type == "UINT") {
      uint64_t v = 0;
      auto [p, ec] = std::from_chars(begin, end, v);
      if (text.empty() || ec != std::errc() || p != end) {
        return refused("a whole number (of at most 64 bits)");
      }
    } else {
      int64_t v = 0;
      auto [p, ec] = std::from_chars(begin, end, v);
      if (text.empty() || ec != std::errc() || p != end) {
        return refused("a whole number (of at most 64 bits, with its sign)");
      }
    }
    if (text.size() > 1 && (text[0] == '0' || (text[0] == '-' && text[1] == '0'))) {
      return refused("a decimal number (a leading 0 is read as octal)");
    }
    return "";
  }
  if (type == "FLOAT") {
    double v = 0;
    auto [p, ec] = std::from_chars(begin, end, v);
    if (text.empty() || ec != std::errc() || p != end || !std::isfinite(v)) {
      return refused("a finite decimal number");
    }
    return "";
  }
  return "";
}

// Adds the check to every numeric option of `app` and its subcommands, before their own checks.
inline void RefuseLooseNumbers(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    // "FLOAT", or "FLOAT:..." with the descriptions of the option's own checks.
    const std::string full = option->get_type_name();
    const std::string type = full.substr(0, full.find(':'));
    if (type != "INT" && type != "UINT" && type != "FLOAT") continue;
    option->transform(CLI::Validator(
        [type](std::string& value) { return LooseNumberProblem(type, value); }, "", "NUMBER"));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    RefuseLooseNumbers(*sub);
  }
}

}  // namespace kc::app
