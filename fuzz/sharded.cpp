// Feeds the bytes as index.json of a sharded checkpoint directory (engine/io/sharded_checkpoint.h)
// to read_sharded_checkpoint_info and load_sharded_checkpoint into an mlp:2,3,2. The directory also
// holds two valid rank files, written once at startup, whose pieces the seed indexes list. Finding:
// anything but dtlab::Error, a refused load that changed the model, or an accepted one that the
// info reader refuses or reads differently.
#include <cstring>
#include <vector>

#include "engine/io/safetensors.h"
#include "engine/io/sharded_checkpoint.h"
#include "fuzz/fuzz_util.h"

using namespace dtlab;

namespace {

// The pieces the seeds' index.json files name: every element of mlp:2,3,2 once, over two ranks.
struct Piece {
  int rank;
  const char* param;
  int64_t offset, length;
};
constexpr Piece kPieces[] = {{0, "0.weight", 0, 4}, {0, "2.weight", 0, 6}, {0, "2.bias", 0, 2},
                             {1, "0.weight", 4, 2}, {1, "0.bias", 0, 3}};

void write_rank_files() {
  std::vector<float> values(64);
  for (size_t i = 0; i < values.size(); i++) values[i] = 0.25f * static_cast<float>(i) - 1.0f;
  for (int rank = 0; rank < 2; rank++) {
    std::vector<TensorView> views;
    size_t at = 0;
    for (const Piece& p : kPieces) {
      if (p.rank != rank) continue;
      views.push_back({std::string(p.param) + "@" + std::to_string(p.offset), DType::F32, {p.length}, values.data() + at});
      at += static_cast<size_t>(p.length);
    }
    save_safetensors(fuzz::temp_dir() + "/" + shard_file_name(rank, 2), views,
                     {{"format", "dtlab-sharded"}, {"rank", std::to_string(rank)}, {"world", "2"}});
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Model model(ModelSpec::parse("mlp:2,3,2"), nullptr, 0);
  static const bool ready = (write_rank_files(), true);
  (void)ready;
  fuzz::write_temp("index.json", data, size);
  const std::string& dir = fuzz::temp_dir();
  CheckpointInfo info, loaded;
  const bool info_ok = fuzz::accepts([&] { info = read_sharded_checkpoint_info(dir); });
  const std::vector<float> before = model.host_params();
  if (!fuzz::accepts([&] { loaded = load_sharded_checkpoint(dir, model); })) {
    const std::vector<float> after = model.host_params();  // bit for bit: a loaded NaN stays NaN
    fuzz::require(std::memcmp(after.data(), before.data(), before.size() * sizeof(float)) == 0, "a refused load changed the model");
    return 0;
  }
  fuzz::require(info_ok, "load_sharded_checkpoint accepted an index that read_sharded_checkpoint_info refused");
  fuzz::require(loaded.step == info.step && loaded.model_spec == info.model_spec && loaded.metadata == info.metadata,
                "the two readers disagree on the index");
  return 0;
}
