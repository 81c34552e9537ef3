// --tp: the device mesh of a run (engine/core/mesh.h), its process groups and the full model gathered
// from the tensor-parallel shards. Each rank builds its TP shard of the model (the full model's values
// for its replica's seed, cut by tp_slice), hands the model its TP group's collectives (f and g), and
// runs DDP or FSDP over its DP group: the groups torch's init_device_mesh gives, tp fastest.
#include "engine/core/format.h"
#include "engine/core/gpt.h"
#include "engine/io/checkpoint.h"
#include "engine/train/mesh_rank.h"

namespace dtlab {

namespace {

// Group tags: distinct from the pipeline's (engine/parallel/pipeline.cpp) and from any rank's sends.
constexpr int kMeshTag = 1 << 21;

std::string ranks_str(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (int r : ranks) parts.push_back(std::to_string(r));
  return "[" + join(parts, ", ") + "]";
}

// A GPT stage's layers in words: "wte, wpe, blocks 0-1", "block 2, ln_f and the head".
std::string describe_gpt_layers(const GptSpec& g, GptRange r) {
  std::vector<std::string> parts;
  if (r.embeds()) parts.push_back("wte, wpe");
  const int b0 = r.first_block(), b1 = r.end_block(g);
  parts.push_back((b1 - b0 == 1 ? "block " : "blocks ") + index_span(b0, b1));
  if (r.heads(g)) parts.push_back("ln_f and the head");
  return join(parts, ", ");
}

}  // namespace

std::unique_ptr<Trainer::MeshRank> Trainer::join_mesh(int rank, Communicator& world, Model& model) {
  auto mr = std::make_unique<MeshRank>();
  Device& dev = model.device();
  if (mesh_.tp == world.world_size()) {
    mr->tp = &world;  // one TP group: its collectives are the world's, which the lab steps and animates
  } else {
    mr->executor = std::make_shared<GroupExecutor>();
    mr->tp_group = new_group(world, mesh_group(mesh_, MeshDim::TP, rank), kMeshTag, mr->executor, dev,
                             mesh_group_name(mesh_, MeshDim::TP, rank));
    mr->tp = mr->tp_group.get();
  }
  if (mesh_.dp > 1) {
    if (!mr->executor) mr->executor = std::make_shared<GroupExecutor>();
    mr->dp_group = new_group(world, mesh_group(mesh_, MeshDim::DP, rank), kMeshTag + 1, mr->executor, dev,
                             mesh_group_name(mesh_, MeshDim::DP, rank));
  }
  mr->tp_comm = std::make_unique<GroupTensorParallelComm>(*mr->tp);
  mr->model = &model;
  model.set_tensor_parallel_comm(mr->tp_comm.get());
  return mr;
}

Communicator* Trainer::mesh_dp_group(MeshRank& mr) { return mr.dp_group.get(); }

void Trainer::build_tp_models(int first_rank, int end_rank, bool in_world) {
  const ModelSpec& spec = config_.model;
  // The stage constructor's range: the MLP's Linears, or the GPT's layers (embeddings, blocks, head).
  const int n_linear = spec.is_gpt() ? static_cast<int>(spec.gpt.layers) + 2 : static_cast<int>(spec.dims.size()) - 1;
  // The unsplit model: its start values are replica 0's (and --init's), and at the end it receives
  // the shards gathered back for evaluation and --save.
  full_model_ = std::make_unique<Model>(spec, nullptr, config_.seed);
  // --init: a full file, or a sharded checkpoint reassembled whole (of any world, FSDP or TP layout),
  // which the loop below cuts into this run's TP pieces like any full values.
  if (!config_.init_path.empty()) start_step_ = load_model_checkpoint(config_.init_path, *full_model_).step;
  const std::vector<float> start = full_model_->host_params();
  // LoRA: every replica's frozen base is that same model (as without --tp); the full model becomes the
  // one-rank LoRA model that receives the gathered adapters.
  const bool lora = config_.lora.rank > 0;
  if (lora) full_model_->enable_lora(config_.lora, config_.seed);
  // It receives the 16-bit shards and evaluates as the one-rank 16-bit model does.
  if (is_mixed(config_.precision)) full_model_->set_precision(config_.precision);
  full_model_->set_amp(config_.amp);  // and evaluates under autocast, as the one-rank --amp model does
  for (int r = first_rank; r < end_rank; r++) {
    const MeshCoord at = mesh_coord(mesh_, r);
    MemoryTracker* mem = in_world ? &world_->threads().memory(r) : memory_.get();
    Device& dev = device(r);
    dev.bind_thread();
    // A replica's TP ranks cut one model (seed + its dp index), so their shards fit together; the
    // replicas differ until DDP broadcasts replica 0's, as they do without --tp.
    // --ep: rank r holds the experts of EP rank r % ep (the EP groups are runs of --ep ranks, TP ranks
    // first: Megatron's MoE parallel folding with expert TP 1), every rank from the same seed, so the
    // ranks holding the same experts start equal (DDP leaves the experts alone).
    const TensorParallelSpec tp{config_.tp, at.tp, config_.sequence_parallel};
    ModelSpec mine = spec;
    if (config_.ep > 1) {
      mine.gpt.moe.ep = config_.ep;
      mine.gpt.moe.ep_rank = r % config_.ep;
    }
    const uint64_t seed = config_.seed + (config_.ep > 1 ? 0 : static_cast<uint64_t>(at.dp));
    models_.push_back(std::make_unique<Model>(mine, mem, seed, 0, n_linear, dev, tp));
    if (config_.ep > 1 && (!config_.init_path.empty() || lora)) {
      upload_gpt_whole_values(*models_.back(), start.data());  // this rank's experts, then its TP shard of them
    } else if (!config_.init_path.empty() || lora) {
      std::vector<float> local(static_cast<size_t>(models_.back()->num_params()));
      shard_full_params(*models_.back(), start.data(), local.data());
      models_.back()->upload_params(local.data());
    }
    // The adapters split across the TP group (Model::enable_lora), from seed + the replica's index.
    if (lora) models_.back()->enable_lora(config_.lora, config_.seed + static_cast<uint64_t>(at.dp));
    // torch's model.to(torch.bfloat16): each shard's 16-bit copy is cut from the same float32 values
    // the one-rank model rounds, so the shards fit together as its 16-bit parameters do.
    if (is_mixed(config_.precision)) models_.back()->set_precision(config_.precision);
    models_.back()->set_amp(config_.amp);
    models_.back()->set_activation_checkpointing(config_.activation_checkpointing);  // replays f and g (model.h)
    models_.back()->set_observer(in_world ? &world_->threads().context(r) : ctx_.get());
  }
}

void Trainer::gather_full_model(int rank, MeshRank& mr, Model& shard) {
  const std::vector<float> full = gather_tensor_parallel_params(shard, *mr.tp);
  if (rank == 0) full_model_->upload_params(full.data());
}

std::vector<std::string> Trainer::describe_mesh_lines() const {
  // A run is a mesh when its ranks are not all plain replicas: --tp, or a pipeline's replicas.
  if (mesh_.tp < 2 && !(pipeline_ && mesh_.dp > 1)) return {};
  std::vector<std::string> lines;
  lines.push_back("mesh: " + describe_mesh(mesh_) + ", laid out as torch's init_device_mesh (\"dp\", \"pp\", \"tp\"): "
                  "rank = (dp x " + std::to_string(mesh_.pp) + " + pp) x " + std::to_string(mesh_.tp) + " + tp");
  for (MeshDim d : {MeshDim::TP, MeshDim::PP, MeshDim::DP}) {
    if (mesh_.size(d) < 2) continue;
    std::string line = std::string("  ") + mesh_dim_name(d) + " groups:";
    const auto groups = mesh_groups(mesh_, d);
    for (size_t g = 0; g < groups.size(); g++) line += " " + std::string(mesh_dim_name(d)) + std::to_string(g) + " " + ranks_str(groups[g]);
    lines.push_back(line);
  }
  if (config_.model.is_gpt()) {
    if (mesh_.tp > 1) {
      const GptSpec& g = config_.model.gpt;
      const int t = mesh_.tp;
      auto per_rank = [&](int64_t n) {  // "tp0 0-1, tp1 2-3"
        std::vector<std::string> parts;
        for (int r = 0; r < t; r++) parts.push_back("tp" + std::to_string(r) + " " + index_span(r * n / t, (r + 1) * n / t));
        return join(parts, ", ");
      };
      lines.push_back("  attention, every block: c_attn column-parallel and c_proj row-parallel by heads, c_proj's partial outputs summed by " +
                      std::string(config_.sequence_parallel ? "a reduce-scatter" : "an all-reduce") + ": heads " + per_rank(g.heads) + " (" +
                      std::to_string(g.heads / t) + " of " + std::to_string(g.heads) + " heads: " + std::to_string(g.embd / t) + " of the " +
                      std::to_string(g.embd) + " rows of each of q, k and v)");
      lines.push_back("  MLP, every block: c_fc column-parallel and c_proj row-parallel: columns " + per_rank(4 * g.embd) + " (" +
                      std::to_string(4 * g.embd / t) + " of " + std::to_string(4 * g.embd) + ")");
      lines.push_back("  whole on every rank of a tp group: wte, wpe, ln_1, ln_2, ln_f and the c_proj biases (added once, after the sum)");
      if (config_.sequence_parallel)
        lines.push_back("  sequence parallel: the residual stream, LayerNorms and embeddings hold positions " + per_rank(g.ctx) +
                        " of every sample; c_attn and c_fc read all of them, all-gathered");
    }
    for (int r = 0; r < mesh_.world(); r++) lines.push_back("  " + describe_mesh_rank(r));
    return lines;
  }
  const auto& dims = config_.model.dims;
  std::vector<StageRange> stages;
  if (pipeline_) stages = pipeline_->stages;
  else stages.push_back({0, static_cast<int>(dims.size()) - 1});
  if (mesh_.tp > 1) {
    for (const StageRange& st : stages) {
      const std::vector<TpRole> roles = tp_roles(st.first, st.end, mesh_.tp);
      for (int l = st.first; l < st.end; l++) {
        const TpRole role = roles[static_cast<size_t>(l - st.first)];
        const int64_t in = dims[static_cast<size_t>(l)], out = dims[static_cast<size_t>(l + 1)];
        std::string what = role == TpRole::Column ? std::to_string(out / mesh_.tp) + " of " + std::to_string(out) + " output features per rank"
                           : role == TpRole::Row  ? std::to_string(in / mesh_.tp) + " of " + std::to_string(in) +
                                                       " input features per rank, outputs summed by " +
                                                       (config_.sequence_parallel ? "a reduce-scatter" : "an all-reduce")
                                                  : std::string("every rank holds all of it");
        lines.push_back("  Linear " + std::to_string(2 * l) + " (" + std::to_string(in) + " -> " + std::to_string(out) + "): " +
                        tp_role_name(role) + ", " + what);
      }
    }
    if (config_.sequence_parallel)
      lines.push_back("  sequence parallel: activations outside the pairs are split by rows across each tp group");
  }
  for (int r = 0; r < mesh_.world(); r++) lines.push_back("  " + describe_mesh_rank(r));
  return lines;
}

std::string Trainer::describe_mesh_rank(int rank) const {
  const MeshCoord c = mesh_coord(mesh_, rank);
  // Its data-parallel index: a replica, or under --cp a replica's CP rank (cp fastest).
  const int cp = std::max(config_.cp, 1);
  auto replica_text = [&](int dp) {
    return "replica " + std::to_string(dp / cp) + " of " + std::to_string(mesh_.dp / cp) +
           (cp > 1 ? ", CP rank " + std::to_string(dp % cp) + " of " + std::to_string(cp) : std::string());
  };
  if (config_.model.is_gpt()) {
    const GptSpec& g = config_.model.gpt;
    std::vector<std::string> holds;
    if (pipeline_) {
      std::vector<std::string> parts;
      for (int s : pipeline_->stages_of_rank(c.pp)) {
        const StageRange r = pipeline_->stages[static_cast<size_t>(s)];
        parts.push_back(std::to_string(s) + " (" + describe_gpt_layers(g, {r.first, r.end}) + ")");
      }
      holds.push_back((parts.size() == 1 ? "stage " : "stages ") + join(parts, ", "));
    } else {
      holds.push_back("every layer");
    }
    const int t = mesh_.tp;
    if (t > 1)
      holds.push_back("TP shard " + std::to_string(c.tp) + " of " + std::to_string(t) + ": heads " +
                      index_span(c.tp * g.heads / t, (c.tp + 1) * g.heads / t) + ", MLP columns " +
                      index_span(c.tp * 4 * g.embd / t, (c.tp + 1) * 4 * g.embd / t));
    if (mesh_.dp > 1) holds.push_back(replica_text(c.dp));
    return "rank " + std::to_string(rank) + ": dp " + std::to_string(c.dp) + ", pp " + std::to_string(c.pp) + ", tp " +
           std::to_string(c.tp) + " -- " + join(holds, ", ");
  }
  // Linear layers by their Sequential index, as the split lines above name them: "Linear 0, 2".
  auto linears = [](const StageRange& s) {
    std::vector<std::string> ids;
    for (int l = s.first; l < s.end; l++) ids.push_back(std::to_string(2 * l));
    return "Linear " + join(ids, ", ");
  };
  std::vector<std::string> holds;
  std::vector<StageRange> own;
  if (pipeline_) {
    std::vector<std::string> parts;
    for (int s : pipeline_->stages_of_rank(c.pp)) {
      own.push_back(pipeline_->stages[static_cast<size_t>(s)]);
      parts.push_back(std::to_string(s) + " (" + linears(own.back()) + ")");
    }
    holds.push_back((own.size() == 1 ? "stage " : "stages ") + join(parts, ", "));
  } else {
    own.push_back({0, static_cast<int>(config_.model.dims.size()) - 1});
    holds.push_back("every layer");
  }
  // A stage of one Linear (or none paired) is whole on every rank of its TP group.
  bool split = false;
  for (const StageRange& s : own)
    for (TpRole role : tp_roles(s.first, s.end, mesh_.tp)) split |= role != TpRole::Replicated;
  if (mesh_.tp > 1)
    holds.push_back(split ? "TP shard " + std::to_string(c.tp) + " of " + std::to_string(mesh_.tp) : std::string("replicated in its TP group"));
  if (mesh_.dp > 1) holds.push_back(replica_text(c.dp));
  return "rank " + std::to_string(rank) + ": dp " + std::to_string(c.dp) + ", pp " + std::to_string(c.pp) + ", tp " +
         std::to_string(c.tp) + " -- " + join(holds, ", ");
}

}  // namespace dtlab
