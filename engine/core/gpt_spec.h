// The shape of nanoGPT's GPT (docs/course_sources.md §6g): `gpt:layers=L,heads=H,embd=C,ctx=T[,vocab=V]`
// or a preset name. vocab 0 means "the data's vocabulary" (a text file's distinct characters), filled
// in by the trainer once the data is read.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace dtlab {

struct GptSpec {
  int64_t layers = 0;  // n_layer
  int64_t heads = 0;   // n_head
  int64_t embd = 0;    // n_embd (C)
  int64_t ctx = 0;     // block_size (T): tokens per sample
  int64_t vocab = 0;   // vocab_size (V); 0: taken from the data

  bool empty() const { return layers == 0; }
  int64_t head_size() const { return heads ? embd / heads : 0; }
  // nanoGPT's parameter count with the tied lm_head counted once (what named_parameters() lists):
  // wte V*C, wpe T*C, per block 12C^2 + 13C, ln_f 2C.
  int64_t num_params() const;
  std::string str() const;  // "gpt:layers=4,heads=4,embd=128,ctx=64,vocab=65" (vocab left out when 0)

  // Parses the text after "gpt:" (or a whole preset name: "gpt-tiny", "gpt2-124m"); dtlab::Error with
  // one sentence naming the wrong part and how to write it.
  static GptSpec parse(std::string_view text);
  // "gpt:", "gpt-tiny" or "gpt2-124m": is this a GPT spec at all?
  static bool names_gpt(std::string_view text);
};

// A pipeline stage of the GPT: layers [first, end) in the numbering observers see (0 the embeddings,
// 1..L the blocks, L + 1 ln_f and the head); [0, L + 2) is the whole model. A stage holds at least
// one block.
struct GptRange {
  int first = 0, end = 0;
  bool whole(const GptSpec& s) const { return first == 0 && end == s.layers + 2; }
  bool embeds() const { return first == 0; }
  bool heads(const GptSpec& s) const { return end == s.layers + 2; }
  int first_block() const { return first == 0 ? 0 : first - 1; }        // blocks [first_block, end_block)
  int end_block(const GptSpec& s) const { return heads(s) ? static_cast<int>(s.layers) : end - 1; }
  static GptRange all(const GptSpec& s) { return {0, static_cast<int>(s.layers) + 2}; }
};

}  // namespace dtlab
