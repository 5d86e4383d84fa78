// Checks of flag values for CLI11. A flag's numeric range: CLI11's Range alone calls a value that
// is not a number at all ("abc") out of range; this says what is wrong with it.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <type_traits>

namespace specdec::cli {

template <class T>
CLI::Validator in_range(T lo, T hi) {
  const CLI::Range range(lo, hi);
  return CLI::Validator(
      [range](std::string& s) -> std::string {
        T value;
        if (!CLI::detail::lexical_cast(s, value))
          return "Value " + s + " is not " +
                 (std::is_integral<T>::value ? "an integer" : "a number");
        return range(s);
      },
      range.get_description());
}

// A text flag given an empty value ("").
inline CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& s) { return s.empty() ? std::string("the value is empty") : std::string(); },
      "");  // (a description would follow the type in --help: "TEXT:TEXT")
}

}  // namespace specdec::cli
