// kc_api_reference: writes the API reference (docs/reference/api.md) from the IDL's compiled
// descriptor set with source info. Regenerate after a .proto change (docs/development.md).
#include <CLI/CLI.hpp>
#include <iostream>

#include "api/api_reference.h"
#include "base/file.h"

int main(int argc, char** argv) {
  CLI::App app{"kc_api_reference: the API reference, generated from the IDL", "kc_api_reference"};
  std::string set_path = KC_IDL_SOURCE_INFO_SET;
  std::string out_path;
  app.add_option("--descriptor-set", set_path,
                 "protoc --include_source_info descriptor set of proto/kc (default: the build's)");
  app.add_option("--out", out_path, "Write here (e.g. docs/reference/api.md) instead of stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  kc::Result<std::string> bytes = kc::ReadWholeFile(set_path);
  google::protobuf::FileDescriptorSet set;
  if (!bytes.ok() || !set.ParseFromString(*bytes)) {
    std::cerr << "kc_api_reference: " << set_path << ": "
              << (bytes.ok() ? "not a descriptor set" : bytes.status().message()) << "\n";
    return 2;
  }
  kc::Result<std::string> md = kc::api::ApiReferenceMarkdown(set);
  if (!md.ok()) {
    std::cerr << "kc_api_reference: " << md.status().message() << "\n";
    return 1;
  }
  if (out_path.empty()) {
    std::cout << *md;
    return 0;
  }
  if (kc::Status s = kc::WriteFileDurably(out_path, *md); !s.ok()) {
    std::cerr << "kc_api_reference: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
