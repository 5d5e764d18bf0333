#include "common/cli.h"

#include <cmath>
#include <filesystem>
#include <memory>
#include <sstream>
#include <system_error>
#include <utility>

#include "common/file_util.h"
#include "common/preflight.h"
#include "common/process.h"
#include "common/version.h"

namespace parasync {

Status SetUpServiceProcess(const ServiceProcess& p) {
  if (p.metrics_port != 0) {
    if (std::string problem = BindProblem(p.metrics_bind, p.metrics_port); !problem.empty()) {
      return Status::FailedPrecondition("--metrics-port " + std::to_string(p.metrics_port) +
                                        ": " + problem);
    }
  }
  if (!InitLogging(p.role, p.index, p.log_level)) {
    return Status::InvalidArgument("unknown --log-level " + p.log_level);
  }
  if (p.log_dir) {
    std::error_code ec;
    std::filesystem::create_directories(*p.log_dir, ec);
    if (ec) return PathError("cannot create --log-dir " + *p.log_dir, ec);
  }
  InstallShutdownSignalHandlers();
  KeepFreedMessageBuffers();
  return Status::Ok();
}

int StartupExitCode(const Status& status) {
  return status.code() == StatusCode::kInvalidArgument ||
                 status.code() == StatusCode::kFailedPrecondition
             ? kExitBadUsage
             : kExitRetryable;
}
namespace {

// Help is wrapped to this many columns, option help beside a column of names this wide.
constexpr size_t kHelpWidth = 100;
constexpr size_t kNameColumn = 34;

// Wraps `text` to `width` columns at spaces. A line of `text` that starts with a space (an
// example, a list) is kept as it is; blank lines are kept.
std::string Wrap(const std::string& text, size_t width) {
  std::string out;
  std::istringstream lines(text);
  std::string line;
  bool first = true;
  while (std::getline(lines, line)) {
    if (!first) out += '\n';
    first = false;
    if (line.empty() || line[0] == ' ') {
      out += line;
      continue;
    }
    std::istringstream words(line);
    std::string word;
    size_t column = 0;
    while (words >> word) {
      if (column > 0 && column + 1 + word.size() > width) {
        out += '\n';
        column = 0;
      } else if (column > 0) {
        out += ' ';
        ++column;
      }
      out += word;
      column += word.size();
    }
  }
  return out;
}

// CLI11's layout with the description and the options' help wrapped, and a blank line
// between the description and Usage.
class HouseFormatter : public CLI::Formatter {
 public:
  HouseFormatter() { column_width(kNameColumn); }

  std::string make_description(const CLI::App* app) const override {
    const std::string description = app->get_description();
    if (description.empty()) return std::string();
    return Wrap(description, kHelpWidth) + "\n\n";
  }

  std::string make_option_desc(const CLI::Option* option) const override {
    // Two columns spare for the deeper indentation of an option group's options.
    return Wrap(option->get_description(), kHelpWidth - kNameColumn - 2);
  }

  std::string make_footer(const CLI::App* app) const override {
    const std::string footer = app->get_footer();
    if (footer.empty()) return std::string();
    return Wrap(footer, kHelpWidth) + "\n";
  }
};

}  // namespace

void SetUpCommandLine(CLI::App& app, const ProgramHelp& help) {
  app.name(help.name);
  std::string description = help.name + ": " + help.purpose;
  if (!help.details.empty()) description += "\n\n" + help.details;
  app.description(description);
  std::string footer =
      "Exit status: 0 done; 1 a failure a retry may fix (a peer down, a timeout); 2 bad flags, "
      "configuration, data or state that a retry cannot fix, said in one line on stderr that "
      "names the flag, port, path or the values that disagree.";
  if (!help.exit_status.empty()) footer += " " + help.exit_status;
  if (!help.examples.empty()) {
    footer += "\n\nExamples:";
    std::istringstream lines(help.examples);
    std::string line;
    while (std::getline(lines, line)) footer += "\n" + (line.starts_with(" ") ? line : "  " + line);
  }
  app.footer(footer);
  app.formatter(std::make_shared<HouseFormatter>());
  app.option_defaults()->always_capture_default();
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_version_flag("--version", VersionLine(help.name), "Print the version and exit");
}

std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, whatever CLI11 wrote.
    std::string what = e.what();
    for (char& c : what) {
      if (c == '\n') c = ' ';
    }
    while (!what.empty() && what.back() == ' ') what.pop_back();
    return PrintErrorLine(app.get_name().c_str(), what + " (see --help)", kExitBadUsage);
  }
  return std::nullopt;
}

CLI::Option* AddSecondsOption(CLI::App& app, const std::string& name, double& seconds,
                              const std::string& help, double min, double max) {
  return app.add_option(name, seconds, help)
      ->check(CLI::Validator(
          [min, max](std::string& value) -> std::string {
            double parsed = 0;
            if (!CLI::detail::lexical_cast(value, parsed) || !std::isfinite(parsed) ||
                parsed < min || parsed > max) {
              std::ostringstream want;
              want << "seconds in [" << min << ", " << max << "] (a decimal, e.g. 0.5) are "
                   << "required, got '" << value << "'";
              return want.str();
            }
            return std::string();
          },
          std::string()))
      ->type_name("SECONDS");
}

}  // namespace parasync
