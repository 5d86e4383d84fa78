// Umbrella header: the runtime (the library specdec::specdec). The tooling, fixture.hpp and
// make_draft.hpp, comes with the library specdec::tools.
#pragma once

#include "specdec/candidates.hpp"
#include "specdec/chat.hpp"
#include "specdec/config.hpp"
#include "specdec/error.hpp"
#include "specdec/generator.hpp"
#include "specdec/gguf.hpp"
#include "specdec/kv_cache.hpp"
#include "specdec/limits.hpp"
#include "specdec/lookahead.hpp"
#include "specdec/model.hpp"
#include "specdec/request_engine.hpp"
#include "specdec/sampling.hpp"
#include "specdec/stats.hpp"
#include "specdec/suffix.hpp"
#include "specdec/tokenizer.hpp"
#include "specdec/verifier.hpp"
#include "specdec/weights.hpp"
