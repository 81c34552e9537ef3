#include "engine/core/mesh.h"

#include "engine/core/check.h"

namespace dtlab {

const char* mesh_dim_name(MeshDim d) {
  switch (d) {
    case MeshDim::DP: return "dp";
    case MeshDim::PP: return "pp";
    case MeshDim::TP: return "tp";
  }
  return "?";
}

MeshShape resolve_mesh(int world, int tp, int stages) {
  if (tp < 1 || tp > 64) throw Error("--tp " + std::to_string(tp) + " is out of range; use 1 to 64 ranks per tensor-parallel group");
  if (stages < 1) throw Error("--stages " + std::to_string(stages) + " is out of range; use 1 or more pipeline stages");
  if (world % (tp * stages) != 0)
    throw Error("--world " + std::to_string(world) + " is not a multiple of --tp " + std::to_string(tp) + " x --stages " +
                std::to_string(stages) + " = " + std::to_string(tp * stages) +
                "; the data-parallel degree is world / (tp x stages), so pick a world that divides");
  return MeshShape{world / (tp * stages), stages, tp};
}

MeshCoord mesh_coord(const MeshShape& m, int rank) {
  DTLAB_CHECK(rank >= 0 && rank < m.world(), "rank outside the mesh");
  return MeshCoord{rank / (m.pp * m.tp), (rank / m.tp) % m.pp, rank % m.tp};
}

int mesh_rank(const MeshShape& m, const MeshCoord& c) { return (c.dp * m.pp + c.pp) * m.tp + c.tp; }

std::vector<int> mesh_group(const MeshShape& m, MeshDim d, int rank) {
  MeshCoord c = mesh_coord(m, rank);
  std::vector<int> ranks;
  for (int i = 0; i < m.size(d); i++) {
    MeshCoord k = c;
    (d == MeshDim::DP ? k.dp : d == MeshDim::PP ? k.pp : k.tp) = i;
    ranks.push_back(mesh_rank(m, k));
  }
  return ranks;
}

std::vector<std::vector<int>> mesh_groups(const MeshShape& m, MeshDim d) {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < m.world(); r++)
    if (mesh_coord(m, r).get(d) == 0) groups.push_back(mesh_group(m, d, r));
  return groups;
}

int mesh_group_index(const MeshShape& m, MeshDim d, int rank) {
  const int first = mesh_group(m, d, rank).front();
  int index = 0;
  for (int r = 0; r < first; r++) index += mesh_coord(m, r).get(d) == 0;
  return index;
}

std::vector<int> mesh_ranks_at(const MeshShape& m, MeshDim d, int index) {
  std::vector<int> ranks;
  for (int r = 0; r < m.world(); r++)
    if (mesh_coord(m, r).get(d) == index) ranks.push_back(r);
  return ranks;
}

std::string mesh_group_name(const MeshShape& m, MeshDim d, int rank) {
  return mesh_dim_name(d) + std::to_string(mesh_group_index(m, d, rank));
}

std::string describe_mesh(const MeshShape& m) {
  return "dp " + std::to_string(m.dp) + " x pp " + std::to_string(m.pp) + " x tp " + std::to_string(m.tp) + " = " +
         std::to_string(m.world()) + (m.world() == 1 ? " rank" : " ranks");
}

const char* tp_role_name(TpRole r) {
  switch (r) {
    case TpRole::Replicated: return "replicated";
    case TpRole::Column: return "column-parallel";
    case TpRole::Row: return "row-parallel";
  }
  return "?";
}

std::vector<TpRole> tp_roles(int first, int end, int degree) {
  std::vector<TpRole> roles;
  for (int l = first; l < end; l++) {
    const int k = l - first;
    if (degree <= 1 || (k % 2 == 0 && l + 1 == end)) roles.push_back(TpRole::Replicated);
    else roles.push_back(k % 2 == 0 ? TpRole::Column : TpRole::Row);
  }
  return roles;
}

TpSlice tp_slice(TpRole role, int64_t out, int64_t in, int degree, int tp_rank) {
  TpSlice s{0, out, 0, in, 0, out};
  if (role == TpRole::Column) {
    s.row_begin = s.bias_begin = out / degree * tp_rank;
    s.row_end = s.bias_end = out / degree * (tp_rank + 1);
  } else if (role == TpRole::Row) {
    s.col_begin = in / degree * tp_rank;
    s.col_end = in / degree * (tp_rank + 1);
  }
  return s;
}

void check_tp_widths(const std::vector<int64_t>& dims, int first, int end, int degree) {
  const std::vector<TpRole> roles = tp_roles(first, end, degree);
  for (int l = first; l < end; l++) {
    if (roles[static_cast<size_t>(l - first)] != TpRole::Column) continue;
    if (dims[static_cast<size_t>(l + 1)] % degree != 0)
      throw Error("--tp " + std::to_string(degree) + " splits the output features of Linear " + std::to_string(2 * l) +
                  " (width " + std::to_string(dims[static_cast<size_t>(l + 1)]) + ") across the tensor-parallel group, but " +
                  std::to_string(dims[static_cast<size_t>(l + 1)]) + " is not divisible by " + std::to_string(degree) +
                  "; use hidden widths that are multiples of --tp");
  }
}

}  // namespace dtlab
