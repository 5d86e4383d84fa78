// make-draft: a small draft distilled from the target itself (first layers, reduced-vocabulary
// head, KL distillation with libtorch autograd).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace specdec {

class Model;

struct MakeDraftOptions {
  std::string target;  // checkpoint folder, or a GGUF file / a folder holding one (llama family,
                       // Gemma 3)
  std::string out;     // output folder: must not exist, unless `resume`
  // The target layers the draft starts from: the first `layers`, or exactly `layer_ids` when set.
  int64_t layers = 1;
  std::vector<int64_t> layer_ids;
  // Head restricted to the `vocab_subset` most frequent tokens of the training data (plus the EOS
  // ids); 0 = the whole vocabulary.
  int64_t vocab_subset = 0;
  // A feature-fed (EAGLE-style) draft: its input is fc([embed(x_p); n(h_{p-1})]) with h the
  // target's last-layer hidden states (ModelConfig::feature_size), n an RMS norm whose weight
  // (fc_norm) starts as the target's final norm, fc starting as [I, 0]; it learns the target's
  // next-token distribution and, so that it can draft on from its own output, the target's hidden
  // state at p (smooth-L1 term). The labelling pass keeps the target's hidden states (float16,
  // hidden_size x 2 bytes per token).
  bool features = false;
  // The target computes with 8-bit activations (LoadOptions::int8_activations) wherever make-draft
  // runs it: writing, answering, labelling, eval_prompts. The draft then learns the target as it
  // serves under --int8-activations, and the data is made faster (quantized targets only).
  bool int8_activations = false;
  // Training text: plain-text files (off-policy), and prompts (one per line) that the target
  // answers itself (on-policy; rendered with its chat template when it has one).
  std::vector<std::string> data_files;
  std::string prompts_file;
  // Prompts the target writes itself (a chat model's user messages sampled from the start of a
  // user turn of its chat template, as in Magpie; a base model's text openings, sampled from BOS),
  // answered like `prompts_file`'s: diverse on-policy text with no prompt list.
  int64_t self_prompts = 0;
  // Reuse the sequences and target labels of an earlier make-draft output folder (same target and
  // seq_len) instead of making new ones; the head is still chosen for this run's vocab_subset.
  std::string data_from;
  // Prompts (one per line; keep them out of the training text) that the target answers greedily
  // after training; the draft is then measured on the answers' positions (MakeDraftResult::eval):
  // how often it agrees there is what generation on such prompts accepts of its first proposal.
  std::string eval_prompts;
  int64_t gen_tokens = 128;  // new tokens per prompt (training and eval_prompts answers)
  // Each prompt is answered once per temperature listed (0 = the greedy answer).
  std::vector<double> gen_temperatures = {0.7};
  int64_t steps = 200;    // optimizer steps in all (a resumed run goes on to this count);
                          // 0 writes the untrained draft
  int64_t seq_len = 128;  // tokens per training sequence
  int64_t batch = 8;      // sequences per step
  double lr = 3e-4;       // AdamW peak learning rate (linear warm-up, cosine decay to 10%)
  int threads = 0;        // 0 = default_num_threads() (OMP_NUM_THREADS, else one per core)
  uint64_t seed = 0;
  int64_t checkpoint_every = 50;  // steps between checkpoints (and one at the end)
  bool resume = false;            // continue the run saved in `out`
  void validate() const;
};

// What make_draft reports as it goes (phase "self-prompts": user messages written by the target;
// "generate": prompts answered; "label": sequences labelled by the target; "train": optimizer
// steps; "evaluate": eval_prompts answered).
struct MakeDraftProgress {
  std::string phase;
  int64_t done = 0, total = 0;
  double loss = 0;  // train: the last step's distillation loss (cross-entropy to the target)
  double tokens_per_s = 0;  // tokens through the draft (train) or the target (data) per second
  double eta_s = 0;
};

// How close a draft is to its target on some text, position by position (averaged):
// kl = KL(p' || q) with p the target's distribution restricted to the draft's support and
// renormalised (p itself for a full head); acceptance = sum_x min(p(x), q(x)), the chance that
// rejection sampling accepts a drafted token; greedy_agreement = how often the argmaxes agree.
struct DraftQuality {
  double kl = 0, acceptance = 0, greedy_agreement = 0;
  int64_t positions = 0;
};

struct MakeDraftResult {
  int64_t steps_done = 0;
  bool interrupted = false;    // stopped by `stop`; `out` holds the last checkpoint
  DraftQuality before, after;  // on the held-out 5% of the training chunks (prompts included)
  DraftQuality eval;           // on the answers to options.eval_prompts (positions 0 when none)
};

// Builds (or, with options.resume, continues) a draft of options.target in options.out: the chosen
// layers, final norm and a (reduced) head taken from the target, then distilled towards the
// target's next-token distributions (its top 32 probabilities per position). The output folder is
// an ordinary checkpoint (config.json, generation_config.json, model.safetensors, the target's
// tokenizer files) plus `training/` (what --resume needs). It is replaced atomically at every
// checkpoint; a run stopped before the first checkpoint leaves no folder. `stop` (may be null) is
// polled between steps: when it turns true, a checkpoint is written and the result says
// interrupted. Throws specdec::Error for bad options or input.
MakeDraftResult make_draft(const MakeDraftOptions& options,
                           const std::function<void(const MakeDraftProgress&)>& on_progress = {},
                           const std::atomic<bool>* stop = nullptr);

// Measures `draft` against `target` on `sequences` (token-id lists), through the models' own
// forward passes: the predictions of tokens first[i].. of sequence i (default: of every token but
// the first), e.g. first[i] = the prompt's length to score an answer only.
DraftQuality evaluate_draft(const Model& target, const Model& draft,
                            const std::vector<std::vector<int64_t>>& sequences,
                            const std::vector<int64_t>& first = {});

}  // namespace specdec
