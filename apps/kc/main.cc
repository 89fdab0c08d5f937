// kc: the Kuangchao command-line tool. Parses arguments, loads settings, runs a subcommand.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <string>

#include "api/client.h"
#include "apps/kc/admin_commands.h"
#include "apps/kc/audit_command.h"
#include "apps/kc/bench_command.h"
#include "apps/kc/ckpt_command.h"
#include "apps/kc/cluster_commands.h"
#include "apps/kc/command.h"
#include "apps/kc/data_command.h"
#include "apps/kc/diagnose_command.h"
#include "apps/kc/init_command.h"
#include "apps/kc/plan_command.h"
#include "apps/kc/run_command.h"
#include "apps/kc/sim_command.h"
#include "apps/kc/topo_command.h"
#include "apps/kc/train_command.h"
#include "apps/strict_numbers.h"
#include "base/settings.h"

namespace kc::app {
namespace {

// Where settings come from: --config, else $KC_CONFIG, else built-in defaults.
Result<Settings> ResolveSettings(const std::string& flag) {
  std::string path = flag;
  if (path.empty()) {
    if (const char* env = std::getenv("KC_CONFIG"); env != nullptr) path = env;
  }
  if (path.empty()) return Settings{};
  return LoadSettings(path);
}

void AddConfigCommand(CLI::App& app, Action* action) {
  CLI::App* config = app.add_subcommand("config", "Validate settings files");
  config->require_subcommand(1);
  CLI::App* check =
      config->add_subcommand("check", "Validate a settings file and print the settings it gives");
  auto file = std::make_shared<std::string>();
  check->add_option("file", *file, "Settings file (YAML)")->required();
  check->callback([action, file] {
    *action = [file] {
      Result<Settings> s = LoadSettings(*file);
      if (!s.ok()) {
        std::cerr << "kc: " << s.status().message() << "\n";
        return kExitBadInput;
      }
      std::cout << "# " << *file << ": valid\n" << SettingsToYaml(*s);
      return kExitOk;
    };
  });
}

}  // namespace
}  // namespace kc::app

int main(int argc, char** argv) {
  kc::api::UseSystemResolver();
  using namespace kc::app;
  CLI::App app{"kc: the Kuangchao distributed training system", "kc"};
  app.require_subcommand(1);
  std::string config_path;
  int verbosity = -1;
  app.add_option("--config", config_path,
                 "Settings file (YAML); default $KC_CONFIG, else built-in defaults");
  app.add_option("-v,--verbosity", verbosity, "Debug log detail, 0-9 (overrides log.verbosity)")
      ->check(CLI::Range(0, 9));
  Action action;
  AddTopoCommand(app, &action);
  AddConfigCommand(app, &action);
  AddBenchCommand(app, &action);
  AddDataCommand(app, &action);
  AddTrainCommand(app, &action);
  AddRunCommand(app, &action);
  AddDiagnoseCommand(app, &action);
  AddPlanCommand(app, &action);
  AddCkptCommand(app, &action);
  AddSimCommand(app, &action);
  AddAuditCommand(app, &action);
  AddInitCommand(app, &action);
  AddClusterCommands(app, &action);
  AddAdminCommands(app, &action);
  RefuseLooseNumbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitBadInput;
  }

  kc::Result<kc::Settings> settings = ResolveSettings(config_path);
  if (!settings.ok()) {
    std::cerr << "kc: " << settings.status().message() << "\n";
    return kExitBadInput;
  }
  if (verbosity >= 0) settings->log_verbosity = verbosity;
  if (kc::Status s = kc::ApplySettings(*settings); !s.ok()) {
    std::cerr << "kc: " << s.message() << "\n";
    return kExitBadInput;
  }
  return action();
}
