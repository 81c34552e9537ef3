// Sharded checkpoints: each rank saves only what it owns, as torch's SHARDED_STATE_DICT does.
// Layout of DIR:
//   rank-00002-of-00004.safetensors   the rank's pieces: tensor "<param>@<offset>" is `length`
//                                     elements of that parameter's flattened (row-major) values,
//                                     or of its piece's box when the piece has one
//   index.json                        {"format": "dtlab-sharded", "version": 2, "step", "model",
//                                      "world", "strategy", "params": {name: {"shape", "pieces":
//                                      [{"file", "tensor", "offset", "length", "box"?}]}}}
// A piece's "box" {"offsets", "sizes"} is its place in the FULL tensor, as DCP's chunk metadata
// places a DTensor's Shard pieces (docs/course_sources.md): a tensor-parallel run's column-parallel
// weight is a block of rows, a row-parallel one a block of columns, and FSDP's flat range (offset,
// length) counts within that box. No box: the whole tensor (all a version 1 index, which had no
// "version", holds; it still loads). A LoRA run's index names the adapters as its --save file does
// (peft's "base_model.model.N.lora_A.weight") and carries "lora_rank" and "lora_alpha".
// A save writes everything into .DIR.saving beside DIR, index.json last, and then exchanges the two
// directories atomically: DIR is always the last complete checkpoint, whenever the save is
// interrupted. A directory without index.json (not a complete save) is refused, never half-loaded.
// Loading reassembles every parameter from the pieces, whatever strategy, wrap policy, world size
// or tensor-parallel degree wrote them, so a sharded checkpoint loads into any run; the full
// safetensors checkpoint (checkpoint.h, or consolidate_sharded_checkpoint) is the one to hand to PyTorch.
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
// empty), then rank 0 writes the index. `strategy` is recorded for people ("FULL_SHARD"). `model`
// may be a tensor-parallel shard (its slices are then placed in the full tensors by tp_pieces, and a
// piece several TP ranks hold whole, like a row-parallel bias, is written once, by the lowest) and
// may hold LoRA adapters (saved under peft's names, as save_lora_checkpoint names them).
void save_sharded_checkpoint(const std::string& dir, const Model& model, const std::vector<ParamSlice>& slices,
                             const SaveGroup& group, int64_t step, const std::string& strategy);
// The same for a rank that holds several models: a pipeline rank's stages (each a part of the full
// model under the full model's names). The index lists every parameter some rank writes, with the
// full shape that rank's file records.
struct SavedPart {
  const Model* model = nullptr;
  std::vector<ParamSlice> slices;
};
void save_sharded_checkpoint(const std::string& dir, const std::vector<SavedPart>& parts, const SaveGroup& group, int64_t step,
                             const std::string& strategy);

// Which replica writes each parameter of a model every replica holds whole (DDP, one rank): torch's
// distributed checkpoint writes a replicated tensor once, and dedup_save_plans gives each one, in
// order, to the plan with the fewest bytes planned so far, the lowest rank on a tie
// (docs/course_sources.md §13). `bytes[k]`: what parameter k's pieces on this rank hold.
std::vector<int> dedup_replicated_params(const std::vector<int64_t>& bytes, int replicas);
// The same when some parameters are on fewer ranks (--ep: an expert, `expert[k]`, lives on the ranks of
// its expert-data-parallel group, the rest on every replica): each kind deduped apart over its own
// holders, this rank being `replica` of `replicas` and `expert_replica` of `expert_replicas`.
// Whether this rank writes each parameter.
std::vector<bool> params_this_rank_writes(const std::vector<int64_t>& bytes, const std::vector<bool>& expert, int replicas, int replica,
                                          int expert_replicas, int expert_replica);

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

// One tensor of a sharded checkpoint, reassembled whole.
struct FullTensor {
  std::string name;  // as the index names it
  Shape shape;
  std::vector<float> values;  // row-major
};
// Every tensor the index lists, reassembled (with the checks load_sharded_checkpoint makes), without
// a model to load into: what a LoRA run's adapters need, and what consolidation writes.
std::vector<FullTensor> read_sharded_tensors(const std::string& dir, CheckpointInfo* info = nullptr);
// Writes DIR as one safetensors file at `path` (atomically): the tensors under the index's names and
// the metadata the full save writes ("format": "dtlab", "step", "model", and a LoRA run's
// "lora_rank" and "lora_alpha"), so load_checkpoint, dtlab-cli eval and PyTorch read it.
void consolidate_sharded_checkpoint(const std::string& dir, const std::string& path);

// The file name rank `rank` of `world` writes: "rank-00002-of-00004.safetensors".
std::string shard_file_name(int rank, int world);

}  // namespace dtlab
