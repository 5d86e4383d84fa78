// A request's own choice of proposer over the defaults it starts from (the flags'): the server's
// requests and --prompts-file lines decide it the same way.
#pragma once

#include "specdec/config.hpp"

namespace specdec {

// `c` holds the defaults with the request's own prompt_lookup_num_tokens and suffix_speculation
// ("speculate") written over them where it gave them. Prompt lookup given alone turns the
// default's suffix speculation off; "speculate" given alone ("suffix" or "none"), the default's
// prompt lookup. Both given: kept as given (GenerationConfig::validate refuses both at once).
inline void choose_proposer(GenerationConfig& c, bool gave_lookup, bool gave_speculate) {
  if (gave_lookup && !gave_speculate) c.suffix_speculation = false;
  if (gave_speculate && !gave_lookup) c.prompt_lookup_num_tokens = 0;
}

}  // namespace specdec
