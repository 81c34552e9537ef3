// The device mesh of a 3-D parallel run (DP x PP x TP) and the tensor-parallel sharding rules, as pure
// functions every layer (engine, CLI, planner, lab) shares.
//
// Layout: torch's init_device_mesh(device, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp")) lays the
// world's ranks out row-major over the shape, tp fastest: rank = (dp_index * pp + pp_index) * tp +
// tp_index. A TP group is therefore `tp` neighbouring ranks, i.e. GPUs of one node on the multi-node
// profiles, which is where Megatron keeps tensor parallelism (its all-reduces are on the critical
// path of every layer and want NVLink). Sources: docs/course_sources.md §6c.
//
// Megatron's MLP split (Shoeybi et al. 2019, §3): Linear layers pair up, the first of a pair
// column-parallel (weight (out, in) split by output features: each rank holds rows
// [r*out/t, (r+1)*out/t) and that slice of the bias), the second row-parallel (split by input
// features: columns [r*in/t, (r+1)*in/t) of the weight, the bias whole and added once after the
// partial outputs are summed). Conjugate operators: f before the column layer (identity forward,
// all-reduce backward) and g after the row layer (all-reduce forward, identity backward). A Linear
// left over at the end of a stage (an odd count) stays replicated in the TP group. Sequence
// parallelism (Korthikanti et al. 2022) turns g into a reduce-scatter and f into an all-gather along
// the batch (token) dimension, so activations outside the pairs are split across the TP group.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dtlab {

enum class MeshDim : uint8_t { DP, PP, TP };
inline constexpr int kNumMeshDims = 3;
const char* mesh_dim_name(MeshDim d);  // "dp", "pp", "tp"

struct MeshShape {
  int dp = 1, pp = 1, tp = 1;
  int world() const { return dp * pp * tp; }
  int size(MeshDim d) const { return d == MeshDim::DP ? dp : d == MeshDim::PP ? pp : tp; }
  bool operator==(const MeshShape&) const = default;
};

struct MeshCoord {
  int dp = 0, pp = 0, tp = 0;
  int get(MeshDim d) const { return d == MeshDim::DP ? dp : d == MeshDim::PP ? pp : tp; }
  bool operator==(const MeshCoord&) const = default;
};

// dp = world / (tp x stages); dtlab::Error (one sentence naming the flags) unless that divides.
MeshShape resolve_mesh(int world, int tp, int stages);
MeshCoord mesh_coord(const MeshShape& m, int rank);
int mesh_rank(const MeshShape& m, const MeshCoord& c);
// The ranks that share every coordinate but `d` with `rank`, in order of their `d` coordinate (a
// group's rank i is the member with coordinate i): torch's mesh["tp"].get_group() ranks.
std::vector<int> mesh_group(const MeshShape& m, MeshDim d, int rank);
// Every group along `d`, numbered by the lowest rank's position: group g = mesh_groups(m, d)[g].
std::vector<std::vector<int>> mesh_groups(const MeshShape& m, MeshDim d);
int mesh_group_index(const MeshShape& m, MeshDim d, int rank);  // which of mesh_groups(m, d) holds rank
// Every rank whose `d` coordinate is `index`, ascending: mesh_ranks_at(m, DP, 1) is data-parallel
// replica 1 (every stage and TP rank that reads its batches), mesh_ranks_at(m, PP, s) the ranks that
// hold pipeline rank s's stages in every replica.
std::vector<int> mesh_ranks_at(const MeshShape& m, MeshDim d, int index);
// "tp1": the dimension's name and the group's index.
std::string mesh_group_name(const MeshShape& m, MeshDim d, int rank);
// "dp 2 x pp 2 x tp 2 = 8 ranks"
std::string describe_mesh(const MeshShape& m);

enum class TpRole : uint8_t { Replicated, Column, Row };
const char* tp_role_name(TpRole r);  // "replicated", "column-parallel", "row-parallel"

// The roles of Linear layers [first, end) of one stage (the whole model without a pipeline): pairs
// from `first` (Column, Row), an odd last one Replicated; every layer Replicated when degree is 1.
std::vector<TpRole> tp_roles(int first, int end, int degree);

// The part of a Linear's weight (out, in) and bias (out) one TP rank holds: rows [row_begin, row_end)
// and columns [col_begin, col_end) of the weight; the bias' [bias_begin, bias_end).
struct TpSlice {
  int64_t row_begin = 0, row_end = 0, col_begin = 0, col_end = 0;
  int64_t bias_begin = 0, bias_end = 0;
  int64_t weight_numel() const { return (row_end - row_begin) * (col_end - col_begin); }
  int64_t bias_numel() const { return bias_end - bias_begin; }
};
TpSlice tp_slice(TpRole role, int64_t out, int64_t in, int degree, int tp_rank);

// dtlab::Error (one sentence) unless every width a pair splits (the column layer's outputs, which are
// the row layer's inputs) divides by `degree`, for Linear layers [first, end) of `dims` (D0..Dk).
void check_tp_widths(const std::vector<int64_t>& dims, int first, int end, int degree);

}  // namespace dtlab
