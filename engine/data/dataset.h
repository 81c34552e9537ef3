// Datasets for the training engine: an in-memory (n, d) float matrix with int64 labels, built from a
// data spec ("spiral", "blobs:dim=8,classes=4", "path/to/file.npz"), or a token stream for the GPT
// ("text:PATH", or a .npz holding `tokens`). Synthetic sets are generated from our own RNG
// conversions so a seed gives the same bytes on every platform.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dtlab {

struct Dataset {
  std::string name;  // canonical spec ("spiral:classes=3,points=1000,noise=0.1,seed=0") or the path
  int64_t n = 0, d = 0, num_classes = 0;
  std::vector<float> x;    // (n, d) row-major
  std::vector<int64_t> y;  // (n,) in [0, num_classes)
  // Token data (the GPT's): x and y stay empty; d = ctx, num_classes = the vocabulary. Sample i is
  // tokens[i*T, i*T+T) with the next tokens, tokens[i*T+1, i*T+T+1), as targets: n = (len - 1) / T
  // non-overlapping windows (docs/course_sources.md §6g).
  std::vector<int32_t> tokens;
  int64_t ctx = 0;
  std::u32string chars;  // text: the vocabulary, the sorted distinct code points (token i is chars[i])
  bool is_tokens() const { return ctx > 0; }
};

// "text:PATH" (UTF-8; the vocabulary is the sorted distinct characters, as nanoGPT's shakespeare_char
// prepares it) cut into windows of `ctx` tokens. "text" alone reads the shipped text,
// data/shakespeare_sonnets.txt (found from the working directory or beside the binary). Error with one
// sentence for a missing or unreadable file, bad UTF-8 (with its byte offset), or too little text.
Dataset make_text_dataset(const std::string& spec, int64_t ctx);
// The characters of `tokens` under a text vocabulary, as UTF-8 (a token outside it: U+FFFD).
std::string decode_tokens(const std::u32string& chars, const int32_t* tokens, int64_t n);
// UTF-8 text to code points; Error naming the first bad byte's offset.
std::u32string utf8_to_code_points(const std::string& text, const std::string& what);

// Spec grammar: "text[:PATH]" (token data; default_dim is the window length T), "spiral[:classes=K,points=P,noise=S,seed=Z]", "blobs[:dim=D,classes=K,points=P,
// spread=S,seed=Z]" or a path ending in ".npz". default_dim / default_classes (the model's input
// and output widths) fill in what the spec leaves out; values <= 0 mean 2 and 3. Spiral is always
// 2-D; checking d against the model is the caller's job. Bad spec -> Error naming the wrong part.
Dataset make_dataset(const std::string& spec, int64_t default_dim, int64_t default_classes);

// CS231n spiral, class by class: for class j and i in [0, P), r = i/(P-1),
// t = 4j + 4i/(P-1) + noise*N(0,1), point (r sin t, r cos t), label j.
Dataset make_spiral(int64_t classes, int64_t points_per_class, float noise, uint64_t seed);

// Gaussian blobs, class by class: centers uniform in [-4, 4]^dim, points center + spread*N(0,1).
Dataset make_blobs(int64_t dim, int64_t classes, int64_t points_per_class, float spread, uint64_t seed);

}  // namespace dtlab
