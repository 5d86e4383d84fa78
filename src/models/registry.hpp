// Architecture factories (one per file under src/models/).
#pragma once

#include <memory>

#include "specdec/model.hpp"
#include "specdec/weights.hpp"

namespace specdec::models {

// Llama, Mistral, Qwen2 and Qwen3 share one implementation (they differ only in config fields).
std::shared_ptr<const Model> make_llama(const ModelConfig& config, const WeightSource& weights,
                                        const LoadOptions& options);
std::shared_ptr<const Model> make_gemma3(const ModelConfig& config, const WeightSource& weights,
                                         const LoadOptions& options);
std::shared_ptr<const Model> make_gpt_neox(const ModelConfig& config, const WeightSource& weights,
                                           const LoadOptions& options);
std::shared_ptr<const Model> make_gpt2(const ModelConfig& config, const WeightSource& weights,
                                       const LoadOptions& options);
std::shared_ptr<const Model> make_opt(const ModelConfig& config, const WeightSource& weights,
                                      const LoadOptions& options);
std::shared_ptr<const Model> make_t5(const ModelConfig& config, const WeightSource& weights,
                                     const LoadOptions& options);

}  // namespace specdec::models
