// The draft make-draft trains: a llama-family (Qwen3's q/k norms included) or Gemma 3 decoder as
// plain differentiable ATen ops (float32, CPU), none of the inference kernels (they have no
// gradients). It shares the inference model's rotary tables (layers::Rotary) and Hugging Face's
// tensor names.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "specdec/config.hpp"

namespace specdec::detail {

// `layers` holds the chosen target layers; the head is [V, H] or, reduced, [V', H].
struct DraftNet {
  struct Layer {
    // Hugging Face's shapes. post_norm is Llama's pre-MLP norm and Gemma 3's norm of the attention
    // output; q_norm and k_norm (per head) are Qwen3's and Gemma 3's; pre_ff and post_ff Gemma 3's.
    at::Tensor in_norm, q, k, v, qb, kb, vb, o, ob, post_norm, gate, up, down, gb, ub, db, q_norm,
        k_norm, pre_ff, post_ff;
    bool sliding = false;  // Gemma 3: a sliding-window layer (local rotary base)
    // The tensors in kLayerTensors' order.
    std::array<at::Tensor*, 20> all() {
      return {&in_norm, &q,  &k,    &v,  &qb, &kb, &vb,     &o,      &ob,     &post_norm,
              &gate,    &up, &down, &gb, &ub, &db, &q_norm, &k_norm, &pre_ff, &post_ff};
    }
    std::array<const at::Tensor*, 20> all() const {
      const auto a = const_cast<Layer*>(this)->all();
      std::array<const at::Tensor*, 20> out;
      std::copy(a.begin(), a.end(), out.begin());
      return out;
    }
  };
  // A layer's tensors' Hugging Face names (after "model.layers.N."), in Layer::all()'s order.
  static const std::array<const char*, 20> kLayerTensors;
  ModelConfig c;
  at::Tensor embed;  // [V, H], never trained
  std::vector<Layer> layers;
  at::Tensor norm;     // [H]
  at::Tensor head;     // [V or V', H]
  at::Tensor fc;       // [H, 2H]: feature-fed drafts only
  at::Tensor fc_norm;  // [H]: feature-fed: the features' RMS norm weight (starts as the target's
                       // final norm)

  // The tensors the optimizer trains, in a fixed order (the optimizer state's order).
  std::vector<at::Tensor> trainable() const;
  // Hugging Face names of the tensors, with layers renumbered 0..n-1.
  std::map<std::string, at::Tensor> named() const;
  // ids [N, S] -> logits [N, S, V or V']. Feature-fed: `features` [N, S, H] are the target's
  // hidden states at the same positions (each position gets its predecessor's), and `last`
  // receives the draft's last-layer output [N, S, H] (its prediction of them).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& features = {},
                     at::Tensor* last = nullptr) const;
  // w * RMS-normalized x (the target's RMSNorm; Gemma 3's scales by 1 + w).
  at::Tensor rms(const at::Tensor& x, const at::Tensor& w) const;
  bool gemma() const { return c.model_type == "gemma3_text"; }
};

// Loads layers `ids` of the target (float32, CPU) into a DraftNet whose head is `head_ids`' rows
// of the target's head (all rows when empty).
DraftNet load_draft_net(const SourceCheckpoint& src, const std::vector<int64_t>& ids,
                        const std::vector<int64_t>& head_ids);

}  // namespace specdec::detail
