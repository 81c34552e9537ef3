// dtlab-cli generate: text from a trained GPT checkpoint (nanoGPT's sample.py), so a class sees the
// model learn: `train --model gpt-tiny --save m.safetensors`, then `generate --init m.safetensors`.
#include <cstdio>

#include "cli/commands.h"
#include "engine/core/check.h"
#include "engine/core/gpt.h"
#include "engine/core/ops.h"
#include "engine/data/dataset.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"

namespace dtlab::cli {

namespace {

struct GenerateArgs {
  std::string init, prompt = "\n", data;
  int64_t tokens = 200, top_k = 200;
  float temperature = 0.8f;
  uint64_t seed = 1337;
  int threads = 0;
};

int run_generate(const GenerateArgs& a, Streams& io) {
  set_compute_threads(a.threads);
  const CheckpointInfo info = read_checkpoint_info(a.init);
  if (info.model_spec.empty() || !GptSpec::names_gpt(info.model_spec))
    throw Error(a.init + " holds " + (info.model_spec.empty() ? std::string("no model name") : info.model_spec) +
                ", not a GPT; train one with dtlab-cli train --model gpt-tiny --save PATH.safetensors");
  ModelSpec spec = ModelSpec::parse(info.model_spec);
  if (!info.moe.empty()) spec.gpt.moe = MoeSpec::parse(info.moe);  // a mixture of experts: the checkpoint's
  if (spec.gpt.vocab == 0) throw Error(a.init + " does not give its GPT's vocabulary size; it was not written by dtlab-cli train");
  // The characters behind the token ids: the checkpoint's own, else the text it was trained on.
  std::u32string chars;
  if (!a.data.empty()) chars = make_text_dataset(a.data, 1).chars;
  else if (auto it = info.metadata.find("vocab"); it != info.metadata.end())
    chars = utf8_to_code_points(it->second, a.init + "'s vocabulary");
  else
    throw Error(a.init + " does not store its vocabulary (it was not trained on text); pass --data text:PATH, the text it was trained on");
  if (static_cast<int64_t>(chars.size()) > spec.gpt.vocab)
    throw Error("the text has " + std::to_string(chars.size()) + " distinct characters but the model's vocabulary is " +
                std::to_string(spec.gpt.vocab) + "; pass the text it was trained on");
  const std::u32string prompt = utf8_to_code_points(a.prompt, "--prompt");
  std::vector<int32_t> ids;
  for (char32_t c : prompt) {
    const size_t at = chars.find(c);
    if (at == std::u32string::npos) {
      const int32_t one = 0;
      std::u32string just(1, c);
      throw Error("--prompt holds '" + decode_tokens(just, &one, 1) + "', which is not in the model's vocabulary; use characters of the text it was trained on");
    }
    ids.push_back(static_cast<int32_t>(at));
  }
  check_checkpoint_size(a.init, spec);
  Model model(spec, nullptr, 0);
  load_model_checkpoint(a.init, model);
  const std::vector<int32_t> out = gpt_generate(model, ids, a.tokens, a.temperature, a.top_k, a.seed);
  io.out << a.prompt << decode_tokens(chars, out.data(), static_cast<int64_t>(out.size())) << "\n";
  return 0;
}

}  // namespace

Runner add_generate_command(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  app.add_option("--init", a->init, "A GPT checkpoint written by dtlab-cli train --model gpt... --save")->required()->check(existing_path());
  app.add_option("--prompt", a->prompt, "Text to continue (default: a newline, as nanoGPT's sample.py)");
  app.add_option("--tokens", a->tokens, "Characters to generate")->check(whole_number(1, 100000))->capture_default_str();
  app.add_option("--temperature", a->temperature, "Divide the logits by this before sampling (lower: surer)")->check(real_number(1e-3, 100.0))->capture_default_str();
  app.add_option("--top-k", a->top_k, "Sample among the k likeliest tokens only (0: all)")->check(whole_number(0, 1 << 24))->capture_default_str();
  app.add_option("--seed", a->seed, "Seed of the sampling")->capture_default_str();
  app.add_option("--data", a->data, "text:PATH: the text the model was trained on (default: the vocabulary stored in the checkpoint)");
  app.add_option("--threads", a->threads, "BLAS threads (default: OpenBLAS's choice)")->check(whole_number(0, 256));
  return [a](Streams& io) { return run_generate(*a, io); };
}

}  // namespace dtlab::cli
