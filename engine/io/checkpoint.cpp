#include "engine/io/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <vector>

#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/io/atomic_file.h"
#include "engine/io/safetensors.h"
#include "engine/io/sharded_checkpoint.h"

namespace dtlab {

CheckpointInfo checkpoint_info_from(const std::string& path, const std::map<std::string, std::string>& metadata,
                                    const Model* model) {
  CheckpointInfo info;
  info.metadata = metadata;
  if (auto it = metadata.find("step"); it != metadata.end()) {
    const std::string& s = it->second;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), info.step);
    if (ec != std::errc() || end != s.data() + s.size() || info.step < 0)
      fail_at(path, "metadata \"step\" is '" + s + "', not a non-negative integer; the file is corrupt");
  }
  if (auto it = metadata.find("model"); it != metadata.end()) {
    try {
      info.model_spec = ModelSpec::parse(it->second).str();
    } catch (const Error&) {
      fail_at(path, "metadata \"model\" is '" + it->second + "', not a model spec like mlp:2,64,3; the file is corrupt");
    }
  }
  if (auto it = metadata.find("moe"); it != metadata.end()) {
    try {
      info.moe = MoeSpec::parse(it->second).str();
    } catch (const Error&) {
      fail_at(path, "metadata \"moe\" is '" + it->second + "', not --moe's experts=E,top_k=K; the file is corrupt");
    }
  }
  if (model && !info.model_spec.empty() && info.model_spec != model->spec().str())
    fail_at(path, "holds a checkpoint of " + info.model_spec + " but the model is " + model->spec().str() +
                   "; rerun with --model " + info.model_spec + " to load it");
  if (model && model->spec().is_gpt()) check_experts_match(path, info.moe, {}, model->spec().gpt.moe);
  return info;
}

void check_experts_match(const std::string& path, const std::string& file_moe, const std::vector<std::string>& names,
                         const MoeSpec& model_moe) {
  // What the file holds: its "moe" metadata, and its tensor names where known (an expert's
  // "transformer.h.L.mlp.experts.E.c_fc.weight").
  const MoeSpec said = file_moe.empty() ? MoeSpec{} : MoeSpec::parse(file_moe);
  int64_t experts = said.experts;
  for (const std::string& n : names)
    if (const size_t at = n.find(".mlp.experts."); at != std::string::npos)
      experts = std::max<int64_t>(experts, std::atoll(n.c_str() + at + 13) + 1);
  const std::string theirs = file_moe.empty() ? "experts=" + std::to_string(experts) + ",top_k=K" : file_moe;
  if (experts > 0 && !model_moe.on())
    fail_at(path, "holds a mixture of experts (" + (file_moe.empty() ? std::to_string(experts) + " experts a block" : "--moe " + file_moe) +
                      ") but the model has none; add --moe " + theirs + " to load it");
  if (experts == 0 && model_moe.on() && !names.empty())
    fail_at(path, "holds a model without experts, but --moe " + model_moe.str() + " asks for them; drop --moe to load it");
  if (experts > 0 && model_moe.on() && (experts != model_moe.experts || (said.on() && said.every != model_moe.every)))
    fail_at(path, "holds " + std::to_string(experts) + " experts a block" + (said.on() ? " (--moe " + file_moe + ")" : "") + ", but --moe " +
                      model_moe.str() + " asks for " + std::to_string(model_moe.experts) + "; use --moe " + theirs + " to load it");
}

namespace {

std::map<std::string, std::string> checkpoint_metadata(const Model& model, int64_t step,
                                                       const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> metadata = extra;
  for (const char* key : {"format", "step", "model", "moe"})
    DTLAB_CHECK(!extra.contains(key), std::string("checkpoint metadata key '") + key + "' is reserved; pick another name");
  metadata["format"] = "dtlab";
  metadata["step"] = std::to_string(step);
  metadata["model"] = model.spec().str();
  if (model.spec().is_gpt() && model.spec().gpt.moe.on()) metadata["moe"] = model.spec().gpt.moe.str();  // --moe, which "model" leaves out
  return metadata;
}

}  // namespace

std::map<std::string, std::string> lora_metadata(const LoraSpec& lora) {
  char alpha[32];
  std::snprintf(alpha, sizeof alpha, "%g", static_cast<double>(lora.alpha));
  return {{"lora_rank", std::to_string(lora.rank)}, {"lora_alpha", alpha}};
}

CheckpointInfo load_model_checkpoint(const std::string& path, Model& model) {
  return is_checkpoint_dir(path) ? load_sharded_checkpoint(path, model) : load_checkpoint(path, model);
}

void save_lora_checkpoint(const std::string& path, const Model& model, int64_t step,
                          const std::map<std::string, std::string>& extra, bool merged) {
  DTLAB_CHECK(model.lora(), "save_lora_checkpoint() on a model without LoRA; use save_checkpoint()");
  std::map<std::string, std::string> metadata = checkpoint_metadata(model, step, extra);
  std::vector<TensorView> views;
  const std::vector<float> host = merged ? model.merged_params() : model.host_params();
  if (merged) {
    for (const Parameter& p : model.base_parameters()) views.push_back({p.name, DType::F32, p.shape, host.data() + p.offset});
  } else {
    for (const auto& [key, value] : lora_metadata(model.lora_spec())) metadata[key] = value;
    // peft's saved adapter keys: the PeftModel's state_dict names without the adapter name.
    for (const Parameter& p : model.parameters())
      views.push_back({"base_model.model." + p.name, DType::F32, p.shape, host.data() + p.offset});
  }
  save_safetensors(path, views, metadata);
}

void save_checkpoint(const std::string& path, const Model& model, int64_t step,
                     const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> metadata = checkpoint_metadata(model, step, extra);

  // Device parameters are written from a host copy, and so are 16-bit ones (--precision bf16/fp16: the
  // file holds their float32 values, which torch.nn.Sequential loads as they are).
  const bool direct = model.device().is_host() && !model.mixed();
  const std::vector<float> host = direct ? std::vector<float>{} : model.host_params();
  std::vector<TensorView> views;
  for (const Parameter& p : model.parameters())
    views.push_back({p.name, DType::F32, p.shape, host.empty() ? p.data : host.data() + p.offset});
  save_safetensors(path, views, metadata);
}

CheckpointInfo load_checkpoint(const std::string& path, Model& model) {
  // The file in memory is the temporary: every check below runs before any parameter is written.
  SafetensorsFile file = load_safetensors(path);
  CheckpointInfo info = checkpoint_info_from(path, file.metadata, &model);
  const std::string spec = model.spec().str();
  if (model.spec().is_gpt()) {
    std::vector<std::string> names;
    for (const SafetensorsEntry& e : file.entries) names.push_back(e.name);
    check_experts_match(path, info.moe, names, model.spec().gpt.moe);
  }

  std::vector<const SafetensorsEntry*> sources;
  for (const Parameter& p : model.parameters()) {
    const SafetensorsEntry* e = file.find(p.name);
    if (!e) fail_at(path, "has no tensor '" + p.name + "', which " + spec + " needs; was it saved from a different model?");
    if (e->dtype != DType::F32)
      fail_at(path, "'" + p.name + "' has dtype " + dtype_name(e->dtype) + " but dtlab parameters are F32; save it as float32");
    if (e->shape != p.shape)
      fail_at(path, "'" + p.name + "' has shape " + shape_str(e->shape) + " but " + spec + " needs " + shape_str(p.shape));
    sources.push_back(e);
  }
  std::vector<std::string> extras;
  for (const SafetensorsEntry& e : file.entries)
    if (model.find_parameter(e.name) < 0) extras.push_back("'" + e.name + "'");
  if (!extras.empty()) {
    std::string list;
    for (size_t i = 0; i < extras.size() && i < 3; i++) list += (i ? ", " : "") + extras[i];
    if (extras.size() > 3) list += " and " + std::to_string(extras.size() - 3) + " more";
    fail_at(path, "holds tensors that " + spec + " does not have (" + list + "); was it saved from a different model?");
  }

  std::vector<Parameter>& params = model.parameters();
  std::vector<float> staged(static_cast<size_t>(model.num_params()));
  for (size_t i = 0; i < params.size(); i++)
    std::memcpy(staged.data() + params[i].offset, file.bytes(*sources[i]), static_cast<size_t>(params[i].numel) * sizeof(float));
  model.upload_params(staged.data());
  return info;
}

void check_checkpoint_size(const std::string& path, const ModelSpec& spec) {
  if (is_checkpoint_dir(path)) return;
  const SafetensorsFile header = load_safetensors_header(path);
  // A file naming another model gets that sentence (it says which --model loads it)...
  const CheckpointInfo info = checkpoint_info_from(path, header.metadata);
  if (!info.model_spec.empty() && info.model_spec != spec.str())
    fail_at(path, "holds a checkpoint of " + info.model_spec + " but the model is " + spec.str() +
                   "; rerun with --model " + info.model_spec + " to load it");
  // ... a mixture of experts into a model without (or the reverse) names the --moe that loads it ...
  if (spec.is_gpt()) {
    std::vector<std::string> names;
    for (const SafetensorsEntry& e : header.entries) names.push_back(e.name);
    check_experts_match(path, info.moe, names, spec.gpt.moe);
  }
  // ... and one too small for the model it is to fill is refused before that model is allocated.
  int64_t values = 0;
  for (const SafetensorsEntry& e : header.entries) {
    int64_t n = 1;  // the header's shapes are checked against its byte ranges already: no overflow
    for (int64_t d : e.shape) n *= d;
    values += n;
  }
  if (values < spec.num_params())
    throw Error(path + ": holds " + with_commas(values) + " values, but " + spec.str() + " has " + with_commas(spec.num_params()) +
                " parameters; it is a checkpoint of a smaller model (pass --model with its spec)");
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  if (is_checkpoint_dir(path)) return read_sharded_checkpoint_info(path);
  return checkpoint_info_from(path, load_safetensors_header(path).metadata);
}

}  // namespace dtlab
