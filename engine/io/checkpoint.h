// Model checkpoints: a safetensors file holding every parameter under its torch state_dict name
// (so `model.load_state_dict(safetensors.torch.load_file(path))` works in PyTorch), plus metadata
// "format": "dtlab", "step" and "model" (the spec, e.g. "mlp:2,64,3").
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/core/model.h"

namespace dtlab {

struct CheckpointInfo {
  int64_t step = 0;        // 0 when the file has no "step" (e.g. saved by PyTorch)
  std::string model_spec;  // empty when the file has no "model"
  std::string moe;         // a GPT's --moe (MoeSpec::str(), which model_spec leaves out); empty: none, or not said
  std::map<std::string, std::string> metadata;  // everything in "__metadata__", the above included
};

// Atomic (see save_safetensors). `extra` adds metadata; it may not reuse "format", "step", "model".
void save_checkpoint(const std::string& path, const Model& model, int64_t step,
                     const std::map<std::string, std::string>& extra = {});

// A LoRA model (model.h's enable_lora): the adapters under peft's keys ("base_model.model.0.lora_A.weight",
// metadata lora_rank, lora_alpha), or with `merged` the plain model's "N.weight" = W + scaling * B A and
// "N.bias", which load_checkpoint reads into a model without LoRA.
void save_lora_checkpoint(const std::string& path, const Model& model, int64_t step,
                          const std::map<std::string, std::string>& extra, bool merged);

// Validates the whole file against the model before writing a single value, so a failed load
// (dtlab::Error, one sentence naming the path) leaves the model untouched.
CheckpointInfo load_checkpoint(const std::string& path, Model& model);

// A safetensors file or a sharded checkpoint's directory (sharded_checkpoint.h), whichever `path` is:
// what --init reads.
CheckpointInfo load_model_checkpoint(const std::string& path, Model& model);

// The metadata a LoRA run's adapters carry, full or sharded: "lora_rank" and "lora_alpha" (peft's r
// and lora_alpha, printed as %g).
std::map<std::string, std::string> lora_metadata(const LoraSpec& lora);

// Metadata only, without reading the tensor data (e.g. to learn the spec before building a model).
// A directory is read as a sharded checkpoint (sharded_checkpoint.h).
CheckpointInfo read_checkpoint_info(const std::string& path);

// Before building a model of `spec` to load `path` into (a safetensors file; directories are not
// checked here): dtlab::Error when the file holds fewer values than the model has parameters, so a
// small file whose metadata names a huge model is refused at once, not after allocating the model.
void check_checkpoint_size(const std::string& path, const ModelSpec& spec);

// A GPT's experts against a checkpoint's (its "moe" metadata, and `names`, its tensors, where known): a
// mixture of experts loaded without --moe, a plain model with it, or other experts, get the sentence
// naming the --moe that loads it (dtlab::Error).
void check_experts_match(const std::string& path, const std::string& file_moe, const std::vector<std::string>& names,
                         const MoeSpec& model_moe);

// "step" and "model" from a checkpoint's metadata, validated (errors name `path`); the spec comes
// back normalized (ModelSpec::str()). With `model`, a checkpoint of another model is refused.
CheckpointInfo checkpoint_info_from(const std::string& path, const std::map<std::string, std::string>& metadata,
                                    const Model* model = nullptr);

}  // namespace dtlab
