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

}  // namespace dtlab
