#include "app/mesh_figures.h"

#include <cstdlib>
#include <sstream>

#include "engine/core/check.h"
#include "engine/core/gpt.h"
#include "engine/core/mesh.h"
#include "engine/parallel/mesh_plan.h"
#include "engine/trace/cost_model.h"

namespace dtlab::app {

double mesh_holds(const Snapshot& s, double rank, const std::string& name) {
  const MeshView& mv = s.mesh;
  const MeshShape& m = mv.shape;
  if (rank != static_cast<int>(rank) || rank < 0 || rank >= m.world())
    throw Error("mesh.holds: rank " + std::to_string(rank) + " is not a rank of this " + std::to_string(m.world()) + "-rank run");
  if (!mv.gpt.empty()) {  // nanoGPT's names; a rank's stages hold its shard's local shapes (gpt_parameters)
    const MeshCoord c = mesh_coord(m, static_cast<int>(rank));
    bool known = false;
    for (const Parameter& p : gpt_parameters(mv.gpt)) known |= p.name == name;
    if (!known && name != "lm_head.weight")
      throw Error("mesh.holds: '" + name + "' is not a parameter of this GPT; name one as nanoGPT does, e.g. "
                  "\"transformer.h.0.attn.c_attn.weight\"");
    for (size_t k = 0; k < mv.stages.size(); k++) {
      if (static_cast<int>(k) % m.pp != c.pp) continue;
      for (const Parameter& p : gpt_stage_parameters(mv.gpt, {mv.stages[k].first, mv.stages[k].end}, m.tp))
        if (p.name == name) return static_cast<double>(p.numel);
    }
    return 0;
  }
  const size_t dot = name.find('.');
  const std::string kind = dot == std::string::npos ? "" : name.substr(dot + 1);
  const int seq = dot == std::string::npos ? -1 : std::atoi(name.substr(0, dot).c_str());
  if ((kind != "weight" && kind != "bias") || seq < 0 || seq % 2 != 0 || seq / 2 + 1 >= static_cast<int>(mv.dims.size()))
    throw Error("mesh.holds: '" + name + "' is not a parameter of this model; name a Linear's \"N.weight\" or \"N.bias\"");
  const int l = seq / 2;
  const MeshCoord c = mesh_coord(m, static_cast<int>(rank));
  for (size_t k = 0; k < mv.stages.size(); k++) {
    const StageRange& r = mv.stages[k];
    if (static_cast<int>(k) % m.pp != c.pp || l < r.first || l >= r.end) continue;
    const TpRole role = tp_roles(r.first, r.end, m.tp)[static_cast<size_t>(l - r.first)];
    const TpSlice sl = tp_slice(role, mv.dims[static_cast<size_t>(l + 1)], mv.dims[static_cast<size_t>(l)], m.tp, c.tp);
    return static_cast<double>(kind == "weight" ? sl.weight_numel() : sl.bias_numel());
  }
  return 0;
}

double collective_layer(const Snapshot& s) {
  if (!s.collective.valid) throw Error("no collective has run yet");
  if (s.events.empty()) return -1;
  const std::vector<Event>& ev = s.events[0];
  for (size_t i = ev.size(); i-- > 0;) {
    const Event& e = ev[i];
    if (e.kind != EventKind::CollectiveIssue || e.coll.seq != s.collective.seq || e.coll.group != s.collective.group) continue;
    for (size_t j = i; j-- > 0;) {
      if (ev[j].iteration != e.iteration) break;
      if (ev[j].kind == EventKind::Compute && ev[j].compute.layer >= 0) return ev[j].compute.layer;
    }
    return -1;
  }
  return -1;
}

double count_group_collectives(const Snapshot& s, double iter, const std::string& op, const std::string& group) {
  if (s.events.empty()) return 0;
  double n = 0;
  for (const Event& e : s.events[0]) {
    if (e.kind != EventKind::Collective || static_cast<double>(e.iteration) != iter || op != collective_name(e.coll.op)) continue;
    std::string name = "world";
    if (e.coll.group != 0) {
      const size_t id = static_cast<size_t>(e.coll.group - 1);
      name = id < s.labels.size() ? s.labels[id].substr(0, s.labels[id].find(':')) : "";
      while (!name.empty() && std::isdigit(static_cast<unsigned char>(name.back()))) name.pop_back();
    }
    n += name == group;
  }
  return n;
}

namespace {

MeshPlanInput parse_mesh_spec(const std::string& spec, std::string& profile) {
  MeshPlanInput in;
  in.memory.dtype = PlanDType::Fp32;
  in.memory.sharding = Sharding::NoShard;
  std::istringstream words(spec);
  std::string w;
  while (words >> w) {
    const size_t eq = w.find('=');
    if (eq == std::string::npos) throw Error("plan.mesh: '" + w + "' is not key=value; write e.g. \"params=7B world=64 tp=4\"");
    const std::string k = w.substr(0, eq), v = w.substr(eq + 1);
    const long n = std::atol(v.c_str());
    if (k == "params") in.memory.params = parse_param_count(v);
    else if (k == "world") in.memory.world = static_cast<int>(n);
    else if (k == "tp") in.tp = static_cast<int>(n);
    else if (k == "stages") in.stages = static_cast<int>(n);
    else if (k == "layers") in.shape.layers = static_cast<int>(n);
    else if (k == "hidden") in.shape.hidden = n;
    else if (k == "seq") in.shape.seq = n;
    else if (k == "micro_batch") in.shape.micro_batch = n;
    else if (k == "micro_batches") in.shape.micro_batches = static_cast<int>(n);
    else if (k == "dtype") in.memory.dtype = parse_plan_dtype(v);
    else if (k == "sharding") in.memory.sharding = parse_sharding(v);
    else if (k == "sp") in.sequence_parallel = n != 0;
    else if (k == "profile") profile = v;
    else throw Error("plan.mesh: '" + k + "' is not a planner setting; use params, world, tp, stages, layers, hidden, seq, "
                     "micro_batch, micro_batches, dtype, sharding, sp or profile");
  }
  return in;
}

}  // namespace

double plan_mesh_figure(const std::string& what, const std::string& spec) {
  std::string profile_name;
  const MeshPlanInput in = parse_mesh_spec(spec, profile_name);
  HardwareProfile profile;
  if (!profile_name.empty()) profile = find_profile(profile_name);
  const MeshPlan p = plan_mesh(in, profile_name.empty() ? nullptr : &profile);
  for (MeshDim d : {MeshDim::DP, MeshDim::PP, MeshDim::TP}) {
    const DimTraffic& t = p.traffic[static_cast<size_t>(d)];
    if (what == mesh_dim_name(d)) return t.bytes;
    if (what == std::string("spanning:") + mesh_dim_name(d)) return t.groups_spanning_nodes;
  }
  if (what == "slowest") return p.slowest_link_bytes;
  if (what == "rank_params") return p.rank_params;
  if (what == "memory") return p.memory.total;
  if (what == "nodes") return p.nodes;
  throw Error("plan.mesh: '" + what + "' is not a planner figure; use tp, pp, dp, spanning:tp, spanning:pp, spanning:dp, "
              "slowest, rank_params, memory or nodes");
}

}  // namespace dtlab::app
