#include "api/api_reference.h"

#include <fmt/format.h>
#include <google/protobuf/descriptor.h>

#include <set>
#include <vector>

#include "api/permissions.h"
#include "kc/v1/options.pb.h"

namespace kc::api {
namespace {

namespace pb = google::protobuf;

constexpr std::string_view kPublicService = "kc.v1.Health";

// A descriptor's leading comment, its lines joined into one paragraph.
template <typename D>
std::string Comment(const D* d) {
  pb::SourceLocation loc;
  if (!d->GetSourceLocation(&loc)) return "";
  std::string out;
  std::string_view text = loc.leading_comments;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? "" : text.substr(nl + 1);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    while (!line.empty() && line.back() == ' ') line.remove_suffix(1);
    if (line.empty()) continue;
    if (!out.empty()) out += ' ';
    out += line;
  }
  return out;
}

// For a table cell.
std::string Cell(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

std::string TypeName(const pb::FieldDescriptor* f) {
  std::string t;
  if (f->message_type() != nullptr) {
    t = fmt::format("`{}`", f->message_type()->full_name());
  } else if (f->enum_type() != nullptr) {
    t = fmt::format("`{}`", f->enum_type()->full_name());
  } else {
    t = f->type_name();
  }
  if (f->is_repeated()) return "repeated " + t;
  if (f->has_presence() && f->containing_oneof() != nullptr) return "optional " + t;
  return t;
}

std::string Limit(const kc::v1::RateLimit& l) {
  return fmt::format(
      "{} calls/s, burst {}, {}", l.calls_per_second(), l.burst(),
      l.scope() == kc::v1::RateLimit::GLOBAL ? "shared by all callers" : "per caller");
}

std::string Permission(const std::string& action) {
  if (action.empty()) return "none (no permission-table check)";
  const std::optional<Action> a = ActionFromName(action);
  if (!a) return fmt::format("`{}` (not in the permission table)", action);
  const PermissionRule& rule = PermissionTable()[static_cast<size_t>(*a)];
  std::vector<std::string> scopes;
  for (int r = 0; r < kNumRoles; ++r) {
    scopes.push_back(
        fmt::format("{} {}", RoleName(static_cast<Role>(r)), ScopeName(rule.scope[r])));
  }
  return fmt::format("`{}`: {}", action, fmt::join(scopes, ", "));
}

void Enum(const pb::EnumDescriptor* e, std::string* out) {
  *out += fmt::format("#### enum `{}`\n\n", e->full_name());
  if (const std::string c = Comment(e); !c.empty()) *out += c + "\n\n";
  *out += "| value | number | |\n| --- | --- | --- |\n";
  for (int i = 0; i < e->value_count(); ++i) {
    const pb::EnumValueDescriptor* v = e->value(i);
    *out += fmt::format("| `{}` | {} | {} |\n", v->name(), v->number(), Cell(Comment(v)));
  }
  *out += "\n";
}

void Message(const pb::Descriptor* m, std::string_view title, std::string* out) {
  *out += fmt::format("#### {}`{}`\n\n", title, m->full_name());
  if (const std::string c = Comment(m); !c.empty()) *out += c + "\n\n";
  if (m->field_count() == 0) {
    *out += "No fields.\n\n";
  } else {
    *out += "| field | number | type | |\n| --- | --- | --- | --- |\n";
    for (int i = 0; i < m->field_count(); ++i) {
      const pb::FieldDescriptor* f = m->field(i);
      *out += fmt::format("| `{}` | {} | {} | {} |\n", f->name(), f->number(), TypeName(f),
                          Cell(Comment(f)));
    }
    *out += "\n";
  }
  for (int i = 0; i < m->enum_type_count(); ++i) Enum(m->enum_type(i), out);
}

// The messages and enums `m`'s fields refer to, transitively, in first-use order.
void Referenced(const pb::Descriptor* m, std::set<std::string>* seen,
                std::vector<const pb::Descriptor*>* messages,
                std::vector<const pb::EnumDescriptor*>* enums) {
  for (int i = 0; i < m->field_count(); ++i) {
    const pb::FieldDescriptor* f = m->field(i);
    if (const pb::Descriptor* t = f->message_type(); t != nullptr) {
      if (seen->insert(t->full_name()).second) {
        messages->push_back(t);
        Referenced(t, seen, messages, enums);
      }
    } else if (const pb::EnumDescriptor* e = f->enum_type();
               e != nullptr && e->containing_type() != m && seen->insert(e->full_name()).second) {
      enums->push_back(e);
    }
  }
}

void Service(const pb::ServiceDescriptor* s, std::string* out) {
  *out += fmt::format("## {}\n\n", s->full_name());
  *out += fmt::format("Defined in `proto/{}`.", s->file()->name());
  *out += s->full_name() == kPublicService ? " Public: no token needed.\n\n"
                                           : " Every call needs a bearer token.\n\n";
  if (const std::string c = Comment(s); !c.empty()) *out += c + "\n\n";
  const kc::v1::RateLimit service_limit = s->options().GetExtension(kc::v1::default_rate_limit);
  if (s->options().HasExtension(kc::v1::default_rate_limit)) {
    *out += fmt::format("Default rate limit: {}.\n\n", Limit(service_limit));
  }
  std::set<std::string> seen;
  std::vector<const pb::Descriptor*> messages;
  std::vector<const pb::EnumDescriptor*> enums;
  for (int i = 0; i < s->method_count(); ++i) {
    const pb::MethodDescriptor* m = s->method(i);
    const pb::MethodOptions& o = m->options();
    *out += fmt::format("### {}\n\n", m->name());
    *out += fmt::format("`rpc {}({}) returns ({})`\n\n", m->name(), m->input_type()->full_name(),
                        m->output_type()->full_name());
    if (const std::string c = Comment(m); !c.empty()) *out += c + "\n\n";
    std::vector<std::string> errors;
    for (int e = 0; e < o.ExtensionSize(kc::v1::errors); ++e) {
      std::string name = kc::v1::ErrorCode_Name(o.GetExtension(kc::v1::errors, e));
      errors.push_back(fmt::format("`{}`", name.substr(std::string_view("ERROR_CODE_").size())));
    }
    *out += "| | |\n| --- | --- |\n";
    *out += fmt::format("| permission | {} |\n", Permission(o.GetExtension(kc::v1::permission)));
    *out += fmt::format("| errors | {} |\n",
                        errors.empty() ? "none" : fmt::format("{}", fmt::join(errors, ", ")));
    *out += fmt::format("| rate limit | {} |\n\n", Limit(o.HasExtension(kc::v1::rate_limit)
                                                             ? o.GetExtension(kc::v1::rate_limit)
                                                             : service_limit));
    for (const pb::Descriptor* d : {m->input_type(), m->output_type()}) {
      if (!seen.insert(d->full_name()).second) continue;
      Message(d, d == m->input_type() ? "Request " : "Response ", out);
    }
    Referenced(m->input_type(), &seen, &messages, &enums);
    Referenced(m->output_type(), &seen, &messages, &enums);
  }
  if (messages.empty() && enums.empty()) return;
  *out += fmt::format("### Types used by {}\n\n", s->name());
  for (const pb::Descriptor* d : messages) Message(d, "", out);
  for (const pb::EnumDescriptor* e : enums) Enum(e, out);
}

}  // namespace

Result<std::string> ApiReferenceMarkdown(const pb::FileDescriptorSet& files) {
  pb::DescriptorPool pool;
  pb::FileDescriptorProto descriptor_proto;  // what options.proto imports
  pb::FileDescriptorProto::descriptor()->file()->CopyTo(&descriptor_proto);
  if (pool.BuildFile(descriptor_proto) == nullptr) {
    return InternalError("api reference: cannot build google/protobuf/descriptor.proto");
  }
  std::vector<const pb::FileDescriptor*> built;
  for (const pb::FileDescriptorProto& f : files.file()) {
    const pb::FileDescriptor* fd = pool.BuildFile(f);
    if (fd == nullptr) {
      return InvalidArgumentError(
          fmt::format("api reference: {} does not build (its imports must come first)", f.name()));
    }
    built.push_back(fd);
  }
  std::string out =
      "# API reference\n\n"
      "<!-- Generated from proto/kc/**/*.proto by kc_api_reference; do not edit. To regenerate:\n"
      "     see docs/development.md (\"API reference\"). -->\n\n"
      "Every service kcd serves, from the IDL (`proto/kc/v1/`). Calls carry the caller's token\n"
      "as `authorization: Bearer TOKEN`. The server enforces each method's rate limit and\n"
      "declared errors generically: a call over the limit gets `RESOURCE_EXHAUSTED` before its\n"
      "handler runs, and an error a method does not declare reaches the caller as `INTERNAL`\n"
      "([design](../design/idl.md#enforcement)). The permission row names the action of the\n"
      "[permission table](../operations/roles.md#what-each-role-may-do) the method checks and\n"
      "each role's scope for it. Error meanings and retry guidance: `src/api/errors.md`.\n\n";
  for (const pb::FileDescriptor* fd : built) {
    for (int i = 0; i < fd->service_count(); ++i) Service(fd->service(i), &out);
  }
  while (out.ends_with("\n\n")) out.pop_back();
  return out;
}

}  // namespace kc::api
