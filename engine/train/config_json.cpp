#include "engine/train/config_json.h"

#include <limits>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "engine/core/check.h"
#include "engine/parallel/memory_plan.h"

namespace dtlab {

using nlohmann::json;

namespace {

const char* backward_prefetch_flag(BackwardPrefetch p) {
  return p == BackwardPrefetch::None ? "none" : p == BackwardPrefetch::Pre ? "pre" : "post";
}

const char* fault_kind_flag(FaultKind k) { return k == FaultKind::Skip ? "skip" : "delay"; }

// Reads `key` of `j` into `out` when present; a value of the wrong type names the key.
template <class T>
void get(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end()) return;
  // A whole-number field takes a JSON integer in T's range: nlohmann's get<int>() of 1e300 or of
  // 2^40 is an out-of-range conversion (undefined behaviour), not an error.
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (it->is_number()) {
    const bool fits = it->is_number_unsigned()  ? it->template get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                      : it->is_number_integer() ? it->template get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                                      (std::is_unsigned_v<T> || it->template get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max()))
                                                : false;
      if (!fits)
        throw Error(std::string("the run configuration's field '") + key + "' is not a whole number in range (" + it->dump().substr(0, 40) + ")");
    }
  }
  try {
    out = it->get<T>();
  } catch (const json::exception&) {
    throw Error(std::string("the run configuration's field '") + key + "' has the wrong type (" + it->dump() + ")");
  }
}

std::string get_text(const json& j, const char* key, const std::string& fallback) {
  std::string s = fallback;
  get(j, key, s);
  return s;
}

// An algorithm by name; a missing key keeps `out` (the communicator's default).
void get_algorithm(const json& j, const char* key, Algorithm& out) {
  out = parse_algorithm(get_text(j, key, algorithm_name(out)));
}

}  // namespace

std::string train_config_to_json(const TrainConfig& c) {
  json j;
  j["strategy"] = c.strategy;
  j["world_size"] = c.world_size;
  j["model"] = c.model.str();
  j["data"] = c.data;
  j["batch"] = c.batch;
  j["steps"] = c.steps;
  j["epochs"] = c.epochs;
  const OptimizerConfig& o = c.optimizer;
  j["optimizer"] = {{"kind", optimizer_name(o.kind)}, {"lr", o.lr},       {"weight_decay", o.weight_decay},
                    {"momentum", o.momentum},         {"dampening", o.dampening}, {"beta1", o.beta1},
                    {"beta2", o.beta2},               {"eps", o.eps}};
  j["seed"] = c.seed;
  j["shuffle"] = c.shuffle;
  j["drop_last"] = c.drop_last;
  j["init_path"] = c.init_path;
  j["save_path"] = c.save_path;
  j["save_sharded_path"] = c.save_sharded_path;
  j["threads"] = c.threads;
  j["trace_path"] = c.trace_path;
  j["trace_modeled"] = c.trace_modeled;
  j["profile"] = c.profile;
  j["accum"] = c.accum;
  j["skip_layer"] = c.skip_layer;
  j["skip_every"] = c.skip_every;
  j["skip_ranks"] = c.skip_ranks;
  j["allow_nonfinite"] = c.allow_nonfinite;
  const DdpOptions& d = c.ddp;
  j["ddp"] = {{"bucket_cap_bytes", d.bucket_cap_bytes},
              {"first_bucket_bytes", d.first_bucket_bytes},
              {"find_unused_parameters", d.find_unused_parameters},
              {"gradient_as_bucket_view", d.gradient_as_bucket_view},
              {"rebuild_buckets", d.rebuild_buckets},
              {"sized_first_iteration", d.sized_first_iteration}};
  const FsdpOptions& f = c.fsdp;
  j["fsdp"] = {{"sharding", sharding_flag(f.sharding)},
               {"wrap_layers", f.wrap_layers},
               {"backward_prefetch", backward_prefetch_flag(f.backward_prefetch)},
               {"forward_prefetch", f.forward_prefetch},
               {"node_size", f.node_size}};
  const PipelineOptions& p = c.pipeline;
  j["pipeline"] = {{"stages", p.stages},   {"microbatches", p.microbatches},
                   {"schedule", schedule_kind_flag(p.schedule)},
                   {"chunks", p.chunks},   {"split", p.split}, {"dp", p.dp}};
  if (p.fixed_costs)
    j["pipeline"]["fixed_costs"] = {{"forward", p.fixed_costs->forward},
                                    {"backward", p.fixed_costs->backward},
                                    {"backward_input", p.fixed_costs->backward_input},
                                    {"backward_weight", p.fixed_costs->backward_weight},
                                    {"hop_latency", p.fixed_costs->hop_latency}};
  j["timeout_s"] = c.timeout_s;
  j["start_paused"] = c.start_paused;
  j["faults"] = json::array();
  for (const Fault& fl : c.faults)
    j["faults"].push_back({{"kind", fault_kind_flag(fl.kind)}, {"rank", fl.rank}, {"seq", fl.seq}, {"delay_s", fl.delay_s}});
  j["device"] = c.device;
  j["launched"] = c.launched;
  j["backend"] = c.backend;
  const SocketOptions& s = c.socket;
  j["socket"] = {{"rank", s.rank},
                 {"world_size", s.world_size},
                 {"local_rank", s.local_rank},
                 {"master_addr", s.master_addr},
                 {"master_port", s.master_port},
                 {"timeout_s", s.timeout_s},
                 {"allreduce", algorithm_name(s.algorithms.allreduce)},
                 {"broadcast", algorithm_name(s.algorithms.broadcast)},
                 {"reduce", algorithm_name(s.algorithms.reduce)}};
  j["monitor_port"] = c.monitor_port;
  j["monitor_wait_s"] = c.monitor_wait_s;
  return j.dump();
}

TrainConfig train_config_from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(std::string("the run configuration is not JSON (") + e.what() + ")");
  }
  if (!j.is_object()) throw Error("the run configuration is not a JSON object");
  TrainConfig c;
  get(j, "strategy", c.strategy);
  get(j, "world_size", c.world_size);
  c.model = ModelSpec::parse(get_text(j, "model", c.model.str()));
  get(j, "data", c.data);
  get(j, "batch", c.batch);
  get(j, "steps", c.steps);
  get(j, "epochs", c.epochs);
  if (j.contains("optimizer")) {
    const json& o = j["optimizer"];
    c.optimizer.kind = parse_optimizer_kind(get_text(o, "kind", "adamw"));
    get(o, "lr", c.optimizer.lr);
    get(o, "weight_decay", c.optimizer.weight_decay);
    get(o, "momentum", c.optimizer.momentum);
    get(o, "dampening", c.optimizer.dampening);
    get(o, "beta1", c.optimizer.beta1);
    get(o, "beta2", c.optimizer.beta2);
    get(o, "eps", c.optimizer.eps);
  }
  get(j, "seed", c.seed);
  get(j, "shuffle", c.shuffle);
  get(j, "drop_last", c.drop_last);
  get(j, "init_path", c.init_path);
  get(j, "save_path", c.save_path);
  get(j, "save_sharded_path", c.save_sharded_path);
  get(j, "threads", c.threads);
  get(j, "trace_path", c.trace_path);
  get(j, "trace_modeled", c.trace_modeled);
  get(j, "profile", c.profile);
  get(j, "accum", c.accum);
  get(j, "skip_layer", c.skip_layer);
  get(j, "skip_every", c.skip_every);
  if (j.contains("skip_ranks")) {
    const json& r = j["skip_ranks"];
    if (!r.is_array()) throw Error("the run configuration's \"skip_ranks\" must be a list of ranks");
    c.skip_ranks.clear();
    for (const json& v : r) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 20))
        throw Error("the run configuration's \"skip_ranks\" must hold whole numbers from 0 up");
      c.skip_ranks.push_back(static_cast<int>(v.get<int64_t>()));
    }
  }
  get(j, "allow_nonfinite", c.allow_nonfinite);
  if (j.contains("ddp")) {
    const json& d = j["ddp"];
    get(d, "bucket_cap_bytes", c.ddp.bucket_cap_bytes);
    get(d, "first_bucket_bytes", c.ddp.first_bucket_bytes);
    get(d, "find_unused_parameters", c.ddp.find_unused_parameters);
    get(d, "gradient_as_bucket_view", c.ddp.gradient_as_bucket_view);
    get(d, "rebuild_buckets", c.ddp.rebuild_buckets);
    get(d, "sized_first_iteration", c.ddp.sized_first_iteration);
  }
  if (j.contains("fsdp")) {
    const json& f = j["fsdp"];
    c.fsdp.sharding = parse_sharding(get_text(f, "sharding", sharding_flag(c.fsdp.sharding)));
    get(f, "wrap_layers", c.fsdp.wrap_layers);
    c.fsdp.backward_prefetch = parse_backward_prefetch(get_text(f, "backward_prefetch", "pre"));
    get(f, "forward_prefetch", c.fsdp.forward_prefetch);
    get(f, "node_size", c.fsdp.node_size);
  }
  if (j.contains("pipeline")) {
    const json& p = j["pipeline"];
    get(p, "stages", c.pipeline.stages);
    get(p, "microbatches", c.pipeline.microbatches);
    c.pipeline.schedule = parse_schedule_kind(get_text(p, "schedule", schedule_kind_flag(c.pipeline.schedule)));
    get(p, "chunks", c.pipeline.chunks);
    get(p, "split", c.pipeline.split);
    get(p, "dp", c.pipeline.dp);
    if (p.contains("fixed_costs")) {
      const json& fc = p["fixed_costs"];
      ActionCosts a;
      get(fc, "forward", a.forward);
      get(fc, "backward", a.backward);
      get(fc, "backward_input", a.backward_input);
      get(fc, "backward_weight", a.backward_weight);
      get(fc, "hop_latency", a.hop_latency);
      c.pipeline.fixed_costs = a;
    }
  }
  get(j, "timeout_s", c.timeout_s);
  get(j, "start_paused", c.start_paused);
  if (j.contains("faults")) {
    for (const json& fl : j["faults"]) {
      Fault f;
      const std::string kind = get_text(fl, "kind", "skip");
      if (kind != "skip" && kind != "delay") throw Error("the run configuration's fault kind '" + kind + "' is not skip or delay");
      f.kind = kind == "skip" ? FaultKind::Skip : FaultKind::Delay;
      get(fl, "rank", f.rank);
      get(fl, "seq", f.seq);
      get(fl, "delay_s", f.delay_s);
      c.faults.push_back(f);
    }
  }
  get(j, "device", c.device);
  get(j, "launched", c.launched);
  get(j, "backend", c.backend);
  if (j.contains("socket")) {
    const json& s = j["socket"];
    get(s, "rank", c.socket.rank);
    get(s, "world_size", c.socket.world_size);
    get(s, "local_rank", c.socket.local_rank);
    get(s, "master_addr", c.socket.master_addr);
    get(s, "master_port", c.socket.master_port);
    get(s, "timeout_s", c.socket.timeout_s);
    get_algorithm(s, "allreduce", c.socket.algorithms.allreduce);
    get_algorithm(s, "broadcast", c.socket.algorithms.broadcast);
    get_algorithm(s, "reduce", c.socket.algorithms.reduce);
  }
  get(j, "monitor_port", c.monitor_port);
  get(j, "monitor_wait_s", c.monitor_wait_s);
  return c;
}

}  // namespace dtlab
