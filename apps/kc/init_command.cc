// `kc init DIR`.
#include "apps/kc/init_command.h"

#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "api/control_plane.h"

namespace kc::app {

void AddInitCommand(CLI::App& app, Action* action) {
  CLI::App* init = app.add_subcommand(
      "init", "Create a cluster: roles file, TLS CA and certificate, the first admin's token");
  auto o = std::make_shared<api::InitOptions>();
  auto hosts = std::make_shared<std::vector<std::string>>();
  init->add_option("dir", o->dir, "The cluster directory to create")->required();
  init->add_option("--cluster", o->cluster, "The cluster's name (default local)");
  init->add_option("--admin", o->admin, "The first system admin's user name (default admin)");
  init->add_option("--inventory", o->inventory_path,
                   "The cluster's inventory (YAML), copied to DIR/topology.yaml");
  init->add_option("--host", *hosts,
                   "A name or address kcd is reached by, for its certificate (repeatable; "
                   "default localhost and 127.0.0.1)");
  init->callback([action, o, hosts] {
    *action = [o, hosts] {
      if (!hosts->empty()) o->hosts = *hosts;
      Result<api::InitResult> r = api::InitCluster(*o);
      if (!r.ok()) {
        std::cerr << "kc init: " << r.status().message() << "\n";
        return r.status().code() == ErrorCode::kUnavailable ||
                       r.status().code() == ErrorCode::kInternal
                   ? kExitFailure
                   : kExitBadInput;
      }
      std::cout << fmt::format(
          "cluster {} created in {}\n"
          "  roles:        {}/roles.yaml (system admin: {})\n"
          "  TLS:          {}/tls/ca.pem (clients trust it), server.pem, server.key\n"
          "  admin token:  {}/admin.token (keep it secret)\n"
          "start the control plane: kcd --dir {}\n",
          o->cluster, o->dir, o->dir, o->admin, o->dir, o->dir, o->dir);
      return kExitOk;
    };
  });
}

}  // namespace kc::app
