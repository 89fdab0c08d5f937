// The IDL (ARCHITECTURE.md rule 4): method annotations read back from the generated code, the
// proto ErrorCode kept equal to kc::ErrorCode, and the compiled IDL kept equal to the committed
// review snapshot, with a failure message that names what changed.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kc/v1/health.grpc.pb.h"
#include "kc/v1/health.pb.h"
#include "kc/v1/options.pb.h"

namespace kc {
namespace {

namespace pb = google::protobuf;

// ---------------------------------------------------------------------------------------------
// DiffDescriptorSets: what changed between two compiled IDLs, one line per change, named by
// fully qualified element (kc.v1.Health.Check, kc.v1.HealthCheckRequest.service).

// "modified: (kc.v1.rate_limit).calls_per_second: 10 -> 12; added: (kc.v1.errors)[2]: ...",
// or "" when the messages differ only in the order of a repeated field.
std::string DescribeChange(const pb::Message& before, const pb::Message& after) {
  std::string report;
  pb::util::MessageDifferencer differencer;
  differencer.set_repeated_field_comparison(pb::util::MessageDifferencer::AS_SET);
  differencer.set_report_moves(false);
  differencer.ReportDifferencesToString(&report);
  differencer.Compare(before, after);
  while (!report.empty() && report.back() == '\n') report.pop_back();
  for (size_t i = report.find('\n'); i != std::string::npos; i = report.find('\n', i)) {
    report.replace(i, 1, "; ");
  }
  return report;
}

bool SameMessage(const pb::Message& a, const pb::Message& b) {
  return pb::util::MessageDifferencer::Equals(a, b);
}

std::string StripDot(const std::string& type_name) {
  return !type_name.empty() && type_name[0] == '.' ? type_name.substr(1) : type_name;
}

// "int32", "repeated kc.v1.RateLimit", "optional string" (proto3 `optional`).
std::string FieldTypeText(const pb::FieldDescriptorProto& f) {
  std::string label;
  if (f.label() == pb::FieldDescriptorProto::LABEL_REPEATED) label = "repeated ";
  if (f.label() == pb::FieldDescriptorProto::LABEL_REQUIRED) label = "required ";
  if (f.proto3_optional()) label = "optional ";
  std::string type;
  if (f.type() == pb::FieldDescriptorProto::TYPE_MESSAGE ||
      f.type() == pb::FieldDescriptorProto::TYPE_ENUM) {
    type = StripDot(f.type_name());
  } else {
    type = pb::FieldDescriptor::TypeName(static_cast<pb::FieldDescriptor::Type>(f.type()));
  }
  return label + type;
}

// One comparison: DescriptorDiff().Run(before, after). Not thread-safe; use once.
class DescriptorDiff {
 public:
  std::vector<std::string> Run(const pb::FileDescriptorSet& before,
                               const pb::FileDescriptorSet& after) {
    std::map<std::string, const pb::FileDescriptorProto*> old_files, new_files;
    for (const auto& f : before.file()) old_files[f.name()] = &f;
    for (const auto& f : after.file()) new_files[f.name()] = &f;
    Elements old_elems, new_elems;
    for (const auto& [name, f] : old_files) Collect(*f, &old_elems);
    for (const auto& [name, f] : new_files) Collect(*f, &new_elems);

    DiffFiles(old_files, new_files);
    DiffMaps("service", old_elems.services, new_elems.services, &DescriptorDiff::DiffService);
    DiffMaps("message", old_elems.messages, new_elems.messages, &DescriptorDiff::DiffMessage);
    DiffMaps("enum", old_elems.enums, new_elems.enums, &DescriptorDiff::DiffEnum);
    DiffMaps("extension", old_elems.extensions, new_elems.extensions,
             &DescriptorDiff::DiffExtension);

    // Anything the itemised comparison does not look at (file order, a descriptor field
    // added to descriptor.proto later) still fails loudly.
    if (changes_.empty() && !SameMessage(before, after)) {
      const std::string change = DescribeChange(before, after);
      changes_.push_back("other change: " + (change.empty() ? "order of files or values" : change));
    }
    return std::move(changes_);
  }

 private:
  // Every named element of a set, by fully qualified name.
  struct Elements {
    std::map<std::string, const pb::ServiceDescriptorProto*> services;
    std::map<std::string, const pb::DescriptorProto*> messages;
    std::map<std::string, const pb::EnumDescriptorProto*> enums;
    std::map<std::string, const pb::FieldDescriptorProto*> extensions;
  };

  static std::string Join(const std::string& scope, const std::string& name) {
    return scope.empty() ? name : scope + "." + name;
  }

  static void Collect(const pb::FileDescriptorProto& file, Elements* out) {
    for (const auto& s : file.service()) out->services[Join(file.package(), s.name())] = &s;
    for (const auto& e : file.enum_type()) out->enums[Join(file.package(), e.name())] = &e;
    for (const auto& x : file.extension()) out->extensions[Join(file.package(), x.name())] = &x;
    for (const auto& m : file.message_type()) CollectMessage(file.package(), m, out);
  }

  static void CollectMessage(const std::string& scope, const pb::DescriptorProto& m,
                             Elements* out) {
    const std::string name = Join(scope, m.name());
    out->messages[name] = &m;
    for (const auto& e : m.enum_type()) out->enums[Join(name, e.name())] = &e;
    for (const auto& x : m.extension()) out->extensions[Join(name, x.name())] = &x;
    for (const auto& n : m.nested_type()) CollectMessage(name, n, out);
  }

  void Add(std::string line) { changes_.push_back(std::move(line)); }

  template <typename Map, typename Fn>
  void DiffMaps(const std::string& kind, const Map& before, const Map& after, Fn diff) {
    for (const auto& [name, old_elem] : before) {
      auto it = after.find(name);
      if (it == after.end()) {
        Add(kind + " removed: " + name);
      } else {
        (this->*diff)(name, *old_elem, *it->second);
      }
    }
    for (const auto& [name, new_elem] : after) {
      if (!before.contains(name)) Add(kind + " added: " + name);
    }
  }

  void DiffOptions(const std::string& name, const pb::Message& before, const pb::Message& after) {
    if (SameMessage(before, after)) return;
    const std::string change = DescribeChange(before, after);
    Add("options changed: " + name + ": " + (change.empty() ? "order of repeated values" : change));
  }

  void DiffFiles(const std::map<std::string, const pb::FileDescriptorProto*>& before,
                 const std::map<std::string, const pb::FileDescriptorProto*>& after) {
    for (const auto& [name, f] : before) {
      if (!after.contains(name)) Add("file removed: " + name);
    }
    for (const auto& [name, f] : after) {
      auto it = before.find(name);
      if (it == before.end()) {
        Add("file added: " + name);
        continue;
      }
      const pb::FileDescriptorProto& o = *it->second;
      if (o.package() != f->package()) {
        Add("file changed: " + name + ": package " + o.package() + " -> " + f->package());
      }
      if (o.syntax() != f->syntax()) {
        Add("file changed: " + name + ": syntax " + o.syntax() + " -> " + f->syntax());
      }
      const std::set<std::string> old_deps(o.dependency().begin(), o.dependency().end());
      const std::set<std::string> new_deps(f->dependency().begin(), f->dependency().end());
      for (const auto& d : old_deps) {
        if (!new_deps.contains(d)) Add("import removed: " + name + ": " + d);
      }
      for (const auto& d : new_deps) {
        if (!old_deps.contains(d)) Add("import added: " + name + ": " + d);
      }
      DiffOptions(name, o.options(), f->options());
    }
  }

  void DiffService(const std::string& name, const pb::ServiceDescriptorProto& before,
                   const pb::ServiceDescriptorProto& after) {
    std::map<std::string, const pb::MethodDescriptorProto*> old_methods, new_methods;
    for (const auto& m : before.method()) old_methods[m.name()] = &m;
    for (const auto& m : after.method()) new_methods[m.name()] = &m;
    for (const auto& [method_name, o] : old_methods) {
      const std::string full = Join(name, method_name);
      auto it = new_methods.find(method_name);
      if (it == new_methods.end()) {
        Add("method removed: " + full);
        continue;
      }
      const pb::MethodDescriptorProto& n = *it->second;
      if (o->input_type() != n.input_type()) {
        Add("method changed: " + full + ": input " + StripDot(o->input_type()) + " -> " +
            StripDot(n.input_type()));
      }
      if (o->output_type() != n.output_type()) {
        Add("method changed: " + full + ": output " + StripDot(o->output_type()) + " -> " +
            StripDot(n.output_type()));
      }
      if (o->client_streaming() != n.client_streaming() ||
          o->server_streaming() != n.server_streaming()) {
        Add("method changed: " + full + ": streaming");
      }
      DiffOptions(full, o->options(), n.options());
    }
    for (const auto& [method_name, m] : new_methods) {
      if (!old_methods.contains(method_name)) Add("method added: " + Join(name, method_name));
    }
    DiffOptions(name, before.options(), after.options());
  }

  // Fields (and extensions) are matched by name; an unmatched pair with the same number is
  // reported as a rename.
  void DiffFields(const std::string& kind, const std::string& scope,
                  const pb::RepeatedPtrField<pb::FieldDescriptorProto>& before,
                  const pb::RepeatedPtrField<pb::FieldDescriptorProto>& after,
                  const pb::DescriptorProto* old_msg, const pb::DescriptorProto* new_msg) {
    std::map<std::string, const pb::FieldDescriptorProto*> old_fields, new_fields;
    for (const auto& f : before) old_fields[f.name()] = &f;
    for (const auto& f : after) new_fields[f.name()] = &f;
    std::map<int, const pb::FieldDescriptorProto*> removed_by_number;
    for (const auto& [field_name, o] : old_fields) {
      auto it = new_fields.find(field_name);
      if (it == new_fields.end()) {
        removed_by_number[o->number()] = o;
      } else {
        DiffField(kind, Join(scope, field_name), *o, *it->second, old_msg, new_msg);
      }
    }
    for (const auto& [field_name, n] : new_fields) {
      if (old_fields.contains(field_name)) continue;
      auto it = removed_by_number.find(n->number());
      if (it != removed_by_number.end()) {
        Add(kind + " renamed: " + Join(scope, it->second->name()) + " -> " +
            Join(scope, field_name) + " (number " + std::to_string(n->number()) + ")");
        DiffField(kind, Join(scope, field_name), *it->second, *n, old_msg, new_msg);
        removed_by_number.erase(it);
      } else {
        Add(kind + " added: " + Join(scope, field_name) + " = " + std::to_string(n->number()) +
            " (" + FieldTypeText(*n) + ")");
      }
    }
    for (const auto& [number, o] : removed_by_number) {
      Add(kind + " removed: " + Join(scope, o->name()) + " = " + std::to_string(number) + " (" +
          FieldTypeText(*o) + ")");
    }
  }

  static std::string OneofName(const pb::FieldDescriptorProto& f, const pb::DescriptorProto* m) {
    if (m == nullptr || !f.has_oneof_index() || f.proto3_optional()) return "";
    return f.oneof_index() < m->oneof_decl_size() ? m->oneof_decl(f.oneof_index()).name() : "?";
  }

  void DiffField(const std::string& kind, const std::string& full,
                 const pb::FieldDescriptorProto& o, const pb::FieldDescriptorProto& n,
                 const pb::DescriptorProto* old_msg, const pb::DescriptorProto* new_msg) {
    const std::string what = kind + " changed: " + full + ": ";
    if (o.number() != n.number()) {
      Add(what + "number " + std::to_string(o.number()) + " -> " + std::to_string(n.number()));
    }
    if (FieldTypeText(o) != FieldTypeText(n)) {
      Add(what + "type " + FieldTypeText(o) + " -> " + FieldTypeText(n));
    }
    if (o.extendee() != n.extendee()) {
      Add(what + "extendee " + StripDot(o.extendee()) + " -> " + StripDot(n.extendee()));
    }
    if (o.default_value() != n.default_value()) {
      Add(what + "default " + o.default_value() + " -> " + n.default_value());
    }
    if (o.json_name() != n.json_name()) {
      Add(what + "json_name " + o.json_name() + " -> " + n.json_name());
    }
    const std::string old_oneof = OneofName(o, old_msg), new_oneof = OneofName(n, new_msg);
    if (old_oneof != new_oneof) {
      Add(what + "oneof '" + old_oneof + "' -> '" + new_oneof + "'");
    }
    DiffOptions(full, o.options(), n.options());
  }

  void DiffMessage(const std::string& name, const pb::DescriptorProto& before,
                   const pb::DescriptorProto& after) {
    DiffFields("field", name, before.field(), after.field(), &before, &after);
    auto reserved = [](const pb::DescriptorProto& m) {
      std::string out;
      for (const auto& r : m.reserved_range()) {
        out += std::to_string(r.start()) + ".." + std::to_string(r.end() - 1) + " ";
      }
      for (const auto& n : m.reserved_name()) out += "\"" + n + "\" ";
      return out;
    };
    if (reserved(before) != reserved(after)) {
      Add("message changed: " + name + ": reserved [" + reserved(before) + "] -> [" +
          reserved(after) + "]");
    }
    if (before.extension_range_size() != after.extension_range_size()) {
      Add("message changed: " + name + ": extension ranges");
    }
    DiffOptions(name, before.options(), after.options());
  }

  void DiffEnum(const std::string& name, const pb::EnumDescriptorProto& before,
                const pb::EnumDescriptorProto& after) {
    std::map<std::string, const pb::EnumValueDescriptorProto*> old_values, new_values;
    for (const auto& v : before.value()) old_values[v.name()] = &v;
    for (const auto& v : after.value()) new_values[v.name()] = &v;
    for (const auto& [value_name, o] : old_values) {
      const std::string full = Join(name, value_name);
      auto it = new_values.find(value_name);
      if (it == new_values.end()) {
        Add("enum value removed: " + full + " = " + std::to_string(o->number()));
        continue;
      }
      if (o->number() != it->second->number()) {
        Add("enum value changed: " + full + ": number " + std::to_string(o->number()) + " -> " +
            std::to_string(it->second->number()));
      }
      DiffOptions(full, o->options(), it->second->options());
    }
    for (const auto& [value_name, n] : new_values) {
      if (!old_values.contains(value_name)) {
        Add("enum value added: " + Join(name, value_name) + " = " + std::to_string(n->number()));
      }
    }
    DiffOptions(name, before.options(), after.options());
  }

  void DiffExtension(const std::string& name, const pb::FieldDescriptorProto& before,
                     const pb::FieldDescriptorProto& after) {
    DiffField("extension", name, before, after, nullptr, nullptr);
  }

  std::vector<std::string> changes_;
};

// What changed from `before` (the committed snapshot) to `after` (the compiled IDL); empty
// when they are equal. Each line names the element, e.g. "method removed: kc.v1.Health.Check"
// or "field added: kc.v1.HealthCheckRequest.foo = 2 (int32)".
std::vector<std::string> DiffDescriptorSets(const pb::FileDescriptorSet& before,
                                            const pb::FileDescriptorSet& after) {
  return DescriptorDiff().Run(before, after);
}

std::string JoinLines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) out += "  " + line + "\n";
  return out;
}

bool Contains(const std::vector<std::string>& lines, std::string_view needle) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(needle) != std::string::npos; });
}

// ---------------------------------------------------------------------------------------------

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

// The set compiled by the build from proto/kc/ (proto/CMakeLists.txt).
::testing::AssertionResult LoadCompiled(pb::FileDescriptorSet* set) {
  std::string bytes;
  if (!ReadFile(KC_IDL_DESCRIPTOR_SET, &bytes)) {
    return ::testing::AssertionFailure() << "cannot read " << KC_IDL_DESCRIPTOR_SET;
  }
  if (!set->ParseFromString(bytes)) {
    return ::testing::AssertionFailure() << "cannot parse " << KC_IDL_DESCRIPTOR_SET;
  }
  return ::testing::AssertionSuccess();
}

// The committed review snapshot, proto/kc/v1/descriptor_snapshot.txtpb.
::testing::AssertionResult LoadSnapshot(pb::FileDescriptorSet* set) {
  std::string text;
  if (!ReadFile(KC_IDL_SNAPSHOT, &text)) {
    return ::testing::AssertionFailure()
           << "cannot read " << KC_IDL_SNAPSHOT << "; run tools/idl_snapshot and commit it";
  }
  if (!pb::TextFormat::ParseFromString(text, set)) {
    return ::testing::AssertionFailure()
           << "cannot parse " << KC_IDL_SNAPSHOT << "; run tools/idl_snapshot and commit it";
  }
  return ::testing::AssertionSuccess();
}

// The files of `like`, in the same order, as the generated code (the descriptors linked into
// this binary) sees them.
pb::FileDescriptorSet GeneratedSet(const pb::FileDescriptorSet& like) {
  pb::FileDescriptorSet set;
  for (const auto& f : like.file()) {
    const pb::FileDescriptor* file = pb::DescriptorPool::generated_pool()->FindFileByName(f.name());
    if (file == nullptr) continue;  // reported by the diff as a removed file
    pb::FileDescriptorProto* proto = set.add_file();
    file->CopyTo(proto);
    file->CopyJsonNameTo(proto);
  }
  return set;
}

// options.proto and health.proto as generated: the base the planted changes are made to.
pb::FileDescriptorSet GeneratedSet() {
  pb::FileDescriptorSet names;
  names.add_file()->set_name(kc::v1::RateLimit::descriptor()->file()->name());
  names.add_file()->set_name(kc::v1::HealthCheckRequest::descriptor()->file()->name());
  return GeneratedSet(names);
}

pb::DescriptorProto* FindMessage(pb::FileDescriptorSet* set, std::string_view name) {
  for (auto& file : *set->mutable_file()) {
    for (auto& m : *file.mutable_message_type()) {
      if (m.name() == name) return &m;
    }
  }
  return nullptr;
}

pb::ServiceDescriptorProto* FindService(pb::FileDescriptorSet* set, std::string_view name) {
  for (auto& file : *set->mutable_file()) {
    for (auto& s : *file.mutable_service()) {
      if (s.name() == name) return &s;
    }
  }
  return nullptr;
}

std::vector<kc::v1::ErrorCode> DeclaredErrors(const pb::MethodDescriptor& method) {
  std::vector<kc::v1::ErrorCode> out;
  const auto& options = method.options();
  for (int i = 0; i < options.ExtensionSize(kc::v1::errors); ++i) {
    out.push_back(options.GetExtension(kc::v1::errors, i));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

TEST(IdlTest, HealthCheckDeclaresItsErrorsAndRateLimit) {
  const pb::FileDescriptor* file = kc::v1::HealthCheckRequest::descriptor()->file();
  const pb::ServiceDescriptor* service = file->FindServiceByName("Health");
  ASSERT_NE(service, nullptr);
  EXPECT_EQ(service->full_name(), kc::v1::Health::service_full_name());
  const pb::MethodDescriptor* check = service->FindMethodByName("Check");
  ASSERT_NE(check, nullptr);
  EXPECT_EQ(check->input_type(), kc::v1::HealthCheckRequest::descriptor());
  EXPECT_EQ(check->output_type(), kc::v1::HealthCheckResponse::descriptor());

  EXPECT_EQ(DeclaredErrors(*check),
            (std::vector<kc::v1::ErrorCode>{kc::v1::ERROR_CODE_NOT_FOUND,
                                            kc::v1::ERROR_CODE_RESOURCE_EXHAUSTED}));

  ASSERT_TRUE(check->options().HasExtension(kc::v1::rate_limit));
  const kc::v1::RateLimit& limit = check->options().GetExtension(kc::v1::rate_limit);
  EXPECT_EQ(limit.calls_per_second(), 10.0);
  EXPECT_EQ(limit.burst(), 20u);
  EXPECT_EQ(limit.scope(), kc::v1::RateLimit::PER_CALLER);

  ASSERT_TRUE(service->options().HasExtension(kc::v1::default_rate_limit));
  const kc::v1::RateLimit& service_limit =
      service->options().GetExtension(kc::v1::default_rate_limit);
  EXPECT_EQ(service_limit.calls_per_second(), 100.0);
  EXPECT_EQ(service_limit.burst(), 200u);
  EXPECT_EQ(service_limit.scope(), kc::v1::RateLimit::GLOBAL);
}

TEST(IdlTest, ProtoErrorCodeMatchesKcErrorCodeOneToOne) {
  const pb::EnumDescriptor* proto_enum = kc::v1::ErrorCode_descriptor();
  ASSERT_EQ(static_cast<size_t>(proto_enum->value_count()), std::size(kAllErrorCodes));
  for (ErrorCode code : kAllErrorCodes) {
    const int number = static_cast<int>(code);
    const std::string expected = "ERROR_CODE_" + std::string(ErrorCodeName(code));
    const pb::EnumValueDescriptor* value = proto_enum->FindValueByNumber(number);
    ASSERT_NE(value, nullptr) << "kc::ErrorCode " << ErrorCodeName(code) << " = " << number
                              << " is missing from kc.v1.ErrorCode";
    EXPECT_EQ(value->name(), expected) << "value " << number;
  }
  for (int i = 0; i < proto_enum->value_count(); ++i) {
    const pb::EnumValueDescriptor* value = proto_enum->value(i);
    const bool known =
        std::any_of(std::begin(kAllErrorCodes), std::end(kAllErrorCodes), [&](ErrorCode c) {
          return static_cast<int>(c) == value->number() &&
                 "ERROR_CODE_" + std::string(ErrorCodeName(c)) == value->name();
        });
    EXPECT_TRUE(known) << value->full_name() << " = " << value->number()
                       << " has no equal in kc::ErrorCode (src/base/status.h)";
  }
}

// Rule 4 for every service in the IDL, not only Health: each method has an effective rate
// limit (its own or the service default) and declares the errors it may return, which then
// include RESOURCE_EXHAUSTED and never OK.
TEST(IdlTest, EveryMethodDeclaresErrorsAndARateLimit) {
  pb::FileDescriptorSet compiled;
  ASSERT_TRUE(LoadCompiled(&compiled));
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  for (const auto& file_proto : compiled.file()) {
    const pb::FileDescriptor* file = pool->FindFileByName(file_proto.name());
    ASSERT_NE(file, nullptr) << file_proto.name() << " is not linked into kc_idl";
    for (int s = 0; s < file->service_count(); ++s) {
      const pb::ServiceDescriptor* service = file->service(s);
      for (int m = 0; m < service->method_count(); ++m) {
        const pb::MethodDescriptor* method = service->method(m);
        const kc::v1::RateLimit& limit =
            method->options().HasExtension(kc::v1::rate_limit)
                ? method->options().GetExtension(kc::v1::rate_limit)
                : service->options().GetExtension(kc::v1::default_rate_limit);
        EXPECT_GT(limit.calls_per_second(), 0.0)
            << method->full_name() << " has no rate limit: set (kc.v1.rate_limit) on it or "
            << "(kc.v1.default_rate_limit) on " << service->full_name();
        const std::vector<kc::v1::ErrorCode> errors = DeclaredErrors(*method);
        const std::set<kc::v1::ErrorCode> unique(errors.begin(), errors.end());
        EXPECT_EQ(unique.size(), errors.size()) << method->full_name() << " lists a code twice";
        EXPECT_FALSE(unique.contains(kc::v1::ERROR_CODE_OK))
            << method->full_name() << " lists ERROR_CODE_OK as an error";
        EXPECT_TRUE(unique.contains(kc::v1::ERROR_CODE_RESOURCE_EXHAUSTED))
            << method->full_name() << " is rate limited but does not list "
            << "ERROR_CODE_RESOURCE_EXHAUSTED in (kc.v1.errors)";
      }
    }
  }
}

TEST(IdlTest, CompiledIdlMatchesCommittedSnapshot) {
  pb::FileDescriptorSet snapshot, compiled;
  ASSERT_TRUE(LoadSnapshot(&snapshot));
  ASSERT_TRUE(LoadCompiled(&compiled));
  const std::vector<std::string> changes = DiffDescriptorSets(snapshot, compiled);
  EXPECT_TRUE(changes.empty())
      << "The IDL (proto/kc/) differs from its reviewed snapshot " << KC_IDL_SNAPSHOT << ":\n"
      << JoinLines(changes)
      << "A cross-process interface changed (ARCHITECTURE.md rule 4). If that is intended, run "
         "tools/idl_snapshot and commit proto/kc/v1/descriptor_snapshot.txtpb together with "
         "the proto change, so that review sees it.";
}

// The diff sees no change between protoc's descriptor set and the descriptors in the
// generated code, so the planted-change tests below start from the real IDL.
TEST(IdlDiffTest, CompiledSetAgreesWithGeneratedCode) {
  pb::FileDescriptorSet compiled;
  ASSERT_TRUE(LoadCompiled(&compiled));
  EXPECT_EQ(JoinLines(DiffDescriptorSets(compiled, GeneratedSet(compiled))), "");
}

TEST(IdlDiffTest, EqualSetsHaveNoChanges) {
  const pb::FileDescriptorSet set = GeneratedSet();
  EXPECT_TRUE(DiffDescriptorSets(set, set).empty());
}

TEST(IdlDiffTest, NamesEveryPlantedChange) {
  const pb::FileDescriptorSet before = GeneratedSet();
  pb::FileDescriptorSet after = before;

  pb::DescriptorProto* request = FindMessage(&after, "HealthCheckRequest");
  pb::DescriptorProto* response = FindMessage(&after, "HealthCheckResponse");
  pb::DescriptorProto* rate_limit = FindMessage(&after, "RateLimit");
  pb::ServiceDescriptorProto* health = FindService(&after, "Health");
  ASSERT_NE(request, nullptr);
  ASSERT_NE(response, nullptr);
  ASSERT_NE(rate_limit, nullptr);
  ASSERT_NE(health, nullptr);
  ASSERT_EQ(health->method_size(), 1);

  // A field added.
  pb::FieldDescriptorProto* foo = request->add_field();
  foo->set_name("foo");
  foo->set_number(2);
  foo->set_label(pb::FieldDescriptorProto::LABEL_OPTIONAL);
  foo->set_type(pb::FieldDescriptorProto::TYPE_INT32);
  // A field's type changed.
  pb::FieldDescriptorProto* status = response->mutable_field(0);
  ASSERT_EQ(status->name(), "status");
  status->set_type(pb::FieldDescriptorProto::TYPE_INT32);
  status->clear_type_name();
  // A field renamed and another renumbered.
  rate_limit->mutable_field(1)->set_name("burst_size");
  rate_limit->mutable_field(2)->set_number(7);
  // A method removed, and one added with another rate limit.
  pb::MethodDescriptorProto watch = health->method(0);
  watch.set_name("Watch");
  watch.set_server_streaming(true);
  watch.mutable_options()->MutableExtension(kc::v1::rate_limit)->set_calls_per_second(1);
  health->clear_method();
  *health->add_method() = watch;
  // An enum value added.
  pb::EnumValueDescriptorProto* draining = response->mutable_enum_type(0)->add_value();
  draining->set_name("DRAINING");
  draining->set_number(3);

  const std::vector<std::string> changes = DiffDescriptorSets(before, after);
  const std::string all = JoinLines(changes);
  EXPECT_TRUE(Contains(changes, "field added: kc.v1.HealthCheckRequest.foo = 2 (int32)")) << all;
  EXPECT_TRUE(Contains(changes,
                       "field changed: kc.v1.HealthCheckResponse.status: type "
                       "kc.v1.HealthCheckResponse.ServingStatus -> int32"))
      << all;
  EXPECT_TRUE(Contains(changes,
                       "field renamed: kc.v1.RateLimit.burst -> kc.v1.RateLimit."
                       "burst_size (number 2)"))
      << all;
  EXPECT_TRUE(Contains(changes, "field changed: kc.v1.RateLimit.scope: number 3 -> 7")) << all;
  EXPECT_TRUE(Contains(changes, "method removed: kc.v1.Health.Check")) << all;
  EXPECT_TRUE(Contains(changes, "method added: kc.v1.Health.Watch")) << all;
  EXPECT_TRUE(
      Contains(changes, "enum value added: kc.v1.HealthCheckResponse.ServingStatus.DRAINING = 3"))
      << all;
  EXPECT_EQ(changes.size(), 7u) << all;
}

TEST(IdlDiffTest, NamesChangedMethodSignatureAndOptions) {
  const pb::FileDescriptorSet before = GeneratedSet();
  pb::FileDescriptorSet after = before;
  pb::ServiceDescriptorProto* health = FindService(&after, "Health");
  ASSERT_NE(health, nullptr);
  pb::MethodDescriptorProto* check = health->mutable_method(0);
  check->set_output_type(".kc.v1.HealthCheckRequest");
  check->mutable_options()->MutableExtension(kc::v1::rate_limit)->set_calls_per_second(1000);
  check->mutable_options()->AddExtension(kc::v1::errors, kc::v1::ERROR_CODE_UNAVAILABLE);
  health->mutable_options()->ClearExtension(kc::v1::default_rate_limit);

  const std::vector<std::string> changes = DiffDescriptorSets(before, after);
  const std::string all = JoinLines(changes);
  EXPECT_TRUE(Contains(changes,
                       "method changed: kc.v1.Health.Check: output "
                       "kc.v1.HealthCheckResponse -> kc.v1.HealthCheckRequest"))
      << all;
  EXPECT_TRUE(Contains(changes, "options changed: kc.v1.Health.Check: ")) << all;
  EXPECT_TRUE(Contains(changes, "(kc.v1.rate_limit).calls_per_second: 10 -> 1000")) << all;
  EXPECT_TRUE(Contains(changes, "added: (kc.v1.errors)[2]: ERROR_CODE_UNAVAILABLE")) << all;
  EXPECT_TRUE(Contains(changes, "options changed: kc.v1.Health: ")) << all;
  EXPECT_EQ(changes.size(), 3u) << all;
}

TEST(IdlDiffTest, ReportsAReorderingAsAChange) {
  const pb::FileDescriptorSet before = GeneratedSet();
  pb::FileDescriptorSet reordered_errors = before;
  pb::ServiceDescriptorProto* health = FindService(&reordered_errors, "Health");
  ASSERT_NE(health, nullptr);
  pb::MethodOptions* options = health->mutable_method(0)->mutable_options();
  ASSERT_EQ(options->ExtensionSize(kc::v1::errors), 2);
  const kc::v1::ErrorCode first = options->GetExtension(kc::v1::errors, 0);
  options->SetExtension(kc::v1::errors, 0, options->GetExtension(kc::v1::errors, 1));
  options->SetExtension(kc::v1::errors, 1, first);
  EXPECT_EQ(JoinLines(DiffDescriptorSets(before, reordered_errors)),
            "  options changed: kc.v1.Health.Check: order of repeated values\n");

  pb::FileDescriptorSet reordered_files = before;
  reordered_files.mutable_file()->SwapElements(0, 1);
  EXPECT_EQ(JoinLines(DiffDescriptorSets(before, reordered_files)),
            "  other change: order of files or values\n");
}

TEST(IdlDiffTest, NamesAddedAndRemovedFilesAndMessages) {
  const pb::FileDescriptorSet before = GeneratedSet();
  pb::FileDescriptorSet after = before;
  pb::FileDescriptorProto* extra = after.add_file();
  extra->set_name("kc/v1/job.proto");
  extra->set_package("kc.v1");
  extra->add_message_type()->set_name("JobSpec");
  after.mutable_file(1)->mutable_message_type()->RemoveLast();  // HealthCheckResponse

  const std::vector<std::string> changes = DiffDescriptorSets(before, after);
  const std::string all = JoinLines(changes);
  EXPECT_TRUE(Contains(changes, "file added: kc/v1/job.proto")) << all;
  EXPECT_TRUE(Contains(changes, "message added: kc.v1.JobSpec")) << all;
  EXPECT_TRUE(Contains(changes, "message removed: kc.v1.HealthCheckResponse")) << all;
  EXPECT_TRUE(Contains(changes, "enum removed: kc.v1.HealthCheckResponse.ServingStatus")) << all;
}

}  // namespace
}  // namespace kc
