// Feeds the bytes, as a checkpoint file, to read_checkpoint_info and load_checkpoint
// (engine/io/checkpoint.h): into a small mlp:2,3,2, and into the model the file's own metadata names
// when that one is small, so an accepted checkpoint reaches the copy into the model. Finding:
// anything but dtlab::Error, a refused load that changed the model, or an accepted one whose
// "step" and "model" differ from what read_checkpoint_info read.
#include <cstring>
#include <vector>

#include "engine/io/checkpoint.h"
#include "fuzz/fuzz_util.h"

using namespace dtlab;

namespace {

constexpr int64_t kMaxFuzzModelParams = 1 << 16;

// Loads `path` into `model`, checking that a refused load leaves it as it was.
void load_into(const std::string& path, Model& model, const CheckpointInfo* info) {
  const std::vector<float> before = model.host_params();
  CheckpointInfo loaded;
  if (!fuzz::accepts([&] { loaded = load_checkpoint(path, model); })) {
    const std::vector<float> after = model.host_params();  // compared bit for bit: a loaded NaN stays NaN
    fuzz::require(std::memcmp(after.data(), before.data(), before.size() * sizeof(float)) == 0, "a refused load changed the model");
    return;
  }
  fuzz::require(info != nullptr, "load_checkpoint accepted a file that read_checkpoint_info refused");
  fuzz::require(loaded.step == info->step && loaded.model_spec == info->model_spec, "the two readers disagree on step or model");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Model small(ModelSpec::parse("mlp:2,3,2"), nullptr, 0);
  const std::string path = fuzz::write_temp("c.safetensors", data, size);
  CheckpointInfo info;
  const bool info_ok = fuzz::accepts([&] { info = read_checkpoint_info(path); });
  load_into(path, small, info_ok ? &info : nullptr);
  if (!info_ok || info.model_spec.empty() || info.model_spec == small.spec().str()) return 0;
  const ModelSpec spec = ModelSpec::parse(info.model_spec);  // read_checkpoint_info validated it
  if (spec.num_params() > kMaxFuzzModelParams) return 0;
  Model named(spec, nullptr, 0);
  load_into(path, named, &info);
  return 0;
}
