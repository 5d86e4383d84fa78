// Umbrella header: everything a user of specdec needs.
#pragma once

#include "specdec/candidates.hpp"
#include "specdec/chat.hpp"
#include "specdec/config.hpp"
#include "specdec/error.hpp"
#include "specdec/fixture.hpp"
#include "specdec/generator.hpp"
#include "specdec/gguf.hpp"
#include "specdec/kv_cache.hpp"
#include "specdec/limits.hpp"
#include "specdec/lookahead.hpp"
#include "specdec/model.hpp"
#include "specdec/sampling.hpp"
#include "specdec/stats.hpp"
#include "specdec/tokenizer.hpp"
#include "specdec/verifier.hpp"
#include "specdec/weights.hpp"
