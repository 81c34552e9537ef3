// dtlab-cli eval: a checkpoint's loss and accuracy on a data set, and optionally its logits as .npy
// (for comparing with PyTorch, which loads the same checkpoint).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "engine/core/check.h"
#include "engine/core/ops.h"
#include "engine/io/atomic_file.h"
#include "engine/io/checkpoint.h"
#include "engine/io/npy.h"
#include "engine/train/train.h"

namespace dtlab::cli {

namespace {

struct EvalArgs {
  std::string init, model, data, logits;
  int64_t batch = 256;
  int threads = 0;
  bool json = false;
};

int run_eval(const EvalArgs& a, Streams& io) {
  if (!a.logits.empty()) check_output_path("--logits", a.logits);
  set_compute_threads(a.threads);
  CheckpointInfo info = read_checkpoint_info(a.init);
  if (info.metadata.contains("lora_rank"))
    throw Error(a.init + " holds LoRA adapters without their base model; train with --lora-rank R --merge-lora --save PATH "
                "to write a whole model that eval reads");
  std::string spec_text = !a.model.empty() ? a.model : info.model_spec;
  if (spec_text.empty())
    throw Error(a.init + " does not say which model it holds; give --model mlp:D0,...,Dk or gpt:layers=L,heads=H,embd=C,ctx=T");
  ModelSpec spec = ModelSpec::parse(spec_text);
  if (spec.is_gpt() && a.model.empty() && !info.moe.empty()) spec.gpt.moe = MoeSpec::parse(info.moe);  // the checkpoint's experts
  // Without --data: spiral, or for a GPT the shipped text; its vocabulary is the data's unless given.
  const std::string data = !a.data.empty() ? a.data : spec.is_gpt() ? "text" : "spiral";
  Dataset ds = make_dataset(data, spec.in_features(), spec.out_features());
  if (spec.is_gpt() && spec.gpt.vocab == 0) spec.gpt.vocab = std::max<int64_t>(ds.num_classes, 2);
  check_data_fits_model(ds, spec);
  check_checkpoint_size(a.init, spec);  // before allocating a model the file cannot fill
  Model model(spec, nullptr, 0);
  load_model_checkpoint(a.init, model);  // a sharded directory is reassembled whole, whoever wrote it
  const int64_t rows = ds.n * spec.rows_per_sample();  // the GPT's: one per position
  std::vector<float> logits(a.logits.empty() ? 0 : static_cast<size_t>(rows * spec.out_features()));
  EvalResult r = evaluate(model, ds, a.batch, a.logits.empty() ? nullptr : logits.data());
  if (!a.logits.empty()) save_npy(a.logits, logits.data(), {rows, spec.out_features()});
  if (a.json) {
    nlohmann::json j = {{"model", spec.str()}, {"step", info.step},       {"data", ds.name},
                        {"loss", r.loss},      {"accuracy", r.accuracy}, {"correct", r.correct},
                        {"samples", r.samples}};
    if (!a.logits.empty()) j["logits"] = a.logits;
    io.out << j.dump() << "\n";
    return 0;
  }
  char line[256];
  std::snprintf(line, sizeof line, "loss %.6f, accuracy %.2f%% (%lld/%lld)", r.loss,
                100.0 * r.accuracy, static_cast<long long>(r.correct),
                static_cast<long long>(r.samples));
  io.out << "eval: " << spec.str() << " from " << a.init << " (step " << info.step << ") on "
         << ds.name << ": " << line << "\n";
  if (!a.logits.empty())
    io.out << "wrote logits (" << rows << ", " << spec.out_features() << ") to " << a.logits << "\n";
  return 0;
}

}  // namespace

Runner add_eval_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  app.add_option("--init", a->init, "Checkpoint to evaluate: safetensors, or a sharded checkpoint's directory")
      ->required()
      ->check(existing_path());
  app.add_option("--model", a->model, "Model spec (default: the one stored in the checkpoint)");
  app.add_option("--data", a->data, "spiral | blobs | text[:PATH] | PATH.npz, as for train (default: spiral, or text for a GPT)");
  app.add_option("--batch", a->batch, "Rows per forward pass")->check(whole_number(1, int64_t{1} << 24))->capture_default_str();
  app.add_option("--logits", a->logits, "Write the logits (N, classes) as float32 .npy (atomic)")->check(output_path());
  app.add_option("--threads", a->threads, "BLAS threads (default: OpenBLAS's choice)")->check(whole_number(0, 256));
  app.add_flag("--json", a->json, "Print one JSON object");
  return [a](Streams& io) { return run_eval(*a, io); };
}

}  // namespace dtlab::cli
