// What the `specdec` program says about the flags a user typed: Hugging Face's snake_case names
// taken as the dashed flags, an unknown subcommand or flag named with the closest real one, and the
// library's GenerationConfig field names in its errors turned into the flags that set them.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
class ParseError;
}  // namespace CLI

namespace specdec::cli {

// "--max_new_tokens" -> "--max-new-tokens" (only the name before any "="), for every argument that
// begins with "--".
void dash_flag_names(std::vector<std::string>& args);

// The closest of `names` to `typed`, when it is close enough to be what was meant ("" if none).
std::string closest(const std::string& typed, const std::vector<std::string>& names);
// A message for the first argument of `args` (args[0] is the program) that names no subcommand or
// no flag of the subcommand it goes to ("" when every one is known): which it is, the closest
// known name, and what to use instead for flags Hugging Face has and specdec does not; or a switch
// followed by a word (`--do_sample True`: a switch takes no value).
std::string unknown_name_message(const CLI::App& app, const std::vector<std::string>& args);

// CLI11's message for a parse error where its own is unclear (a flag given twice; an argument
// that is no flag's value); "" for the others, which CLI11 prints as it does.
std::string parse_error_message(const CLI::ParseError& error, const CLI::App& app);

// "GenerationConfig.max_new_tokens must be >= 1" -> "--max-new-tokens must be >= 1", for the
// fields the generation flags set.
std::string in_flag_words(const std::string& message);
// The same message for a --prompts-file line, whose keys are the fields' names: the prefix
// dropped ("max_new_tokens must be >= 1").
std::string in_key_words(const std::string& message);

}  // namespace specdec::cli
