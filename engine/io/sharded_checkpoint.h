// Sharded checkpoints: each rank saves only what it owns, as torch's SHARDED_STATE_DICT does.
// Layout of DIR:
//   rank-00002-of-00004.safetensors   the rank's pieces: tensor "<param>@<offset>" is `length`
//                                     elements of that parameter's flattened (row-major) values
//   index.json                        {"format": "dtlab-sharded", "step", "model", "world",
//                                      "strategy", "params": {name: {"shape", "pieces":
//                                      [{"file", "tensor", "offset", "length"}]}}}
// A save writes everything into .DIR.saving beside DIR, index.json last, and then exchanges the two
// directories atomically: DIR is always the last complete checkpoint, whenever the save is
// interrupted. A directory without index.json (not a complete save) is refused, never half-loaded.
// Loading reassembles every parameter from the pieces, whatever strategy, wrap policy or world
// size wrote them, so a sharded checkpoint loads into any run; the full safetensors checkpoint
// (checkpoint.h) stays the one to hand to PyTorch.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/model.h"
#include "engine/io/checkpoint.h"

namespace dtlab {

// A piece of one model parameter owned by a rank.
struct ParamSlice {
  int param = 0;        // index into model.parameters()
  int64_t offset = 0;   // first element, in the parameter's flattened order
  int64_t length = 0;
  const float* data = nullptr;
};

// Where a collective save stands in its world: this rank, the world's size, and a barrier every
// rank calls at the same points (a communicator's barrier; io sits below comm, so it takes a function).
struct SaveGroup {
  int rank = 0;
  int world = 1;
  std::function<void()> barrier;
};

// Collective (every rank of the group calls it): writes this rank's file (none when `slices` is
// empty), then rank 0 writes the index. `strategy` is recorded for people ("FULL_SHARD").
void save_sharded_checkpoint(const std::string& dir, const Model& model, const std::vector<ParamSlice>& slices,
                             const SaveGroup& group, int64_t step, const std::string& strategy);

// Checks, before any work starts, that DIR can take a sharded save: a directory (or a new name)
// whose parent exists and is writable, holding nothing but a sharded checkpoint's files (the save
// replaces the whole directory). Throws dtlab::Error naming `flag`.
void check_sharded_output_dir(const std::string& flag, const std::string& dir);

// True when `path` is a directory (then it must be a sharded checkpoint).
bool is_checkpoint_dir(const std::string& path);

// Validates the index and every piece (names, shapes, coverage: each element exactly once) before
// writing a single value; errors are one dtlab::Error sentence naming the file.
CheckpointInfo load_sharded_checkpoint(const std::string& dir, Model& model);
CheckpointInfo read_sharded_checkpoint_info(const std::string& dir);

// The file name rank `rank` of `world` writes: "rank-00002-of-00004.safetensors".
std::string shard_file_name(int rank, int world);

}  // namespace dtlab
