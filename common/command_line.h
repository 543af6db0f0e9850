// What the programs' CLI11 command lines share (CLI11 2.1.2, Debian's libcli11-dev), so that every
// program reads a flag as it always did:
//
//   CLI::App app{"...", "lockstep run"};
//   app.add_option("--workers", workers, "...")->transform(DecimalInteger())->check(...);
//   AddBooleanFlag(app, "--leader-elect", leader_elect, "...");
//   std::vector<std::string> reversed = Cli11Arguments(args);
//   app.parse(reversed);  // throws CLI::ParseError; CLI::CallForHelp for --help
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

}  // namespace lockstep
