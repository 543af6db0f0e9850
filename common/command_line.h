// What the programs' CLI11 command lines share (CLI11 2.1.2, Debian's libcli11-dev), so that every
// program reads a flag as it always did:
//
//   CLI::App app{"...", "lockstep run"};
//   app.add_option("--workers", workers, "...")->transform(DecimalInteger())->check(...);
//   AddBooleanFlag(app, "--leader-elect", leader_elect, "...");
//   CommandLineParse parsed = ParseCommandLine(app, args);  // .help, or .error naming the flag
//
// Header-only: CLI11 is too.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace lockstep {

// The arguments as App::parse(std::vector<std::string>&) takes them (last first). "--name=" is
// split into "--name" and "": CLI11 reads "--name=" as a bare "--name" and would take the next
// argument as its value, where the empty value was written.
inline std::vector<std::string> Cli11Arguments(const std::vector<std::string>& args) {
  std::vector<std::string> reversed;
  for (auto it = args.rbegin(); it != args.rend(); ++it) {
    const std::string& arg = *it;
    if (arg.size() > 3 && arg.rfind("--", 0) == 0 && arg.back() == '=' &&
        arg.find('=') == arg.size() - 1) {
      reversed.emplace_back();
      reversed.push_back(arg.substr(0, arg.size() - 1));
    } else {
      reversed.push_back(arg);
    }
  }
  return reversed;
}

// Integers in base 10, as written: CLI11 alone reads "010" as 8 and takes "0x10". Leading zeros
// are dropped; anything but a sign and digits is refused naming the value.
inline CLI::Validator DecimalInteger() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const size_t digits = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
        if (digits == text.size() ||
            text.find_first_not_of("0123456789", digits) != std::string::npos) {
          return "\"" + text + "\" is not a whole number";
        }
        const size_t first = text.find_first_not_of('0', digits);
        text = text.substr(0, digits) + (first == std::string::npos ? "0" : text.substr(first));
        return "";
      },
      "", "DECIMAL");
}

// A boolean flag: "--name" or "--name=true" sets it, "--name=false" clears it; it never takes
// the next argument. Any other value is refused naming it (CLI11 alone also takes yes, on, 1, ...).
inline CLI::Option* AddBooleanFlag(CLI::App& app, const std::string& name, bool& value,
                                   const std::string& help) {
  return app.add_flag(name, value, help)
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            return text == "true" || text == "false"
                       ? ""
                       : "expected true or false, got \"" + text + "\"";
          },
          "true|false", "BOOLEAN"));
}

// What ParseCommandLine found: the flags read into the app's variables, a request for the help,
// or a refusal (CLI11's message, naming the flag and the value).
struct CommandLineParse {
  bool help = false;
  std::string error;  // "" when the flags were read
};

// Parses `args` (those after the program's or command's name) into app's options. --help or -h
// anywhere before a "--" asks for the help whatever the rest of the line holds: CLI11 alone checks
// the other flags' values first, so `--help --metrics-port=70000` would have been refused. A
// prefix command (whose first positional starts another program's arguments) leaves --help to
// CLI11, which sees only the part before the program.
inline CommandLineParse ParseCommandLine(CLI::App& app, const std::vector<std::string>& args) {
  if (!app.get_prefix_command()) {
    for (const std::string& arg : args) {
      if (arg == "--") break;
      if (arg == "--help" || arg == "-h") return {true, ""};
    }
  }
  try {
    std::vector<std::string> reversed = Cli11Arguments(args);
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return {true, ""};
  } catch (const CLI::ParseError& error) {
    return {false, error.what()};
  }
  return {};
}

}  // namespace lockstep
