#include "engine/train/config_json.h"

#include <limits>
#include <optional>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "engine/core/check.h"
#include "engine/parallel/memory_plan.h"
#include "engine/trace/tuning.h"

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

FaultKind parse_fault_kind(const std::string& kind) {
  if (kind != "skip" && kind != "delay") throw Error("the run configuration's fault kind '" + kind + "' is not skip or delay");
  return kind == "skip" ? FaultKind::Skip : FaultKind::Delay;
}

// The two directions of one field list (config_fields below). Writer fills a JSON object; Reader
// reads what the object holds, in list order, so the first bad field is the first one reported.
struct Writer {
  json& j;
  template <class T>
  void field(const char* key, const T& v) { j[key] = v; }
  // A field written as text: to_text(v); read back with from_text.
  template <class T, class To, class From>
  void text(const char* key, const T& v, To to_text, From) { j[key] = to_text(v); }
  void rank_list(const char* key, const std::vector<int>& v) { j[key] = v; }
  template <class T, class Fn>
  void section(const char* key, T& v, Fn fields) {
    json sub = json::object();
    Writer w{sub};
    fields(w, v);
    j[key] = std::move(sub);
  }
  // A section written only when set.
  template <class T, class Fn>
  void optional_section(const char* key, const std::optional<T>& v, Fn fields) {
    if (v) section(key, *v, fields);
  }
  template <class T, class Fn>
  void list(const char* key, const std::vector<T>& v, Fn fields) {
    j[key] = json::array();
    for (const T& e : v) {
      json sub = json::object();
      Writer w{sub};
      fields(w, e);
      j[key].push_back(std::move(sub));
    }
  }
};

struct Reader {
  const json& j;
  template <class T>
  void field(const char* key, T& v) { get(j, key, v); }
  // A missing key keeps v.
  template <class T, class To, class From>
  void text(const char* key, T& v, To to_text, From from_text) { v = from_text(get_text(j, key, to_text(v))); }
  void rank_list(const char* key, std::vector<int>& v) {
    if (!j.contains(key)) return;
    const json& r = *j.find(key);
    if (!r.is_array()) throw Error("the run configuration's \"skip_ranks\" must be a list of ranks");
    v.clear();
    for (const json& e : r) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > (1 << 20))
        throw Error("the run configuration's \"skip_ranks\" must hold whole numbers from 0 up");
      v.push_back(static_cast<int>(e.get<int64_t>()));
    }
  }
  template <class T, class Fn>
  void section(const char* key, T& v, Fn fields) {
    if (!j.contains(key)) return;
    Reader r{*j.find(key)};
    fields(r, v);
  }
  template <class T, class Fn>
  void optional_section(const char* key, std::optional<T>& v, Fn fields) {
    if (!j.contains(key)) return;
    T fresh;
    section(key, fresh, fields);
    v = fresh;
  }
  template <class T, class Fn>
  void list(const char* key, std::vector<T>& v, Fn fields) {
    if (!j.contains(key)) return;
    for (const json& e : *j.find(key)) {
      T x;
      Reader r{e};
      fields(r, x);
      v.push_back(x);
    }
  }
};

// Every field of a run configuration, once, for both directions: Io is Writer (C a const
// TrainConfig) or Reader (C a TrainConfig).
template <class Io, class C>
void config_fields(Io& io, C& c) {
  io.text("strategy", c.strategy, strategy_name, parse_strategy);
  io.field("world_size", c.world_size);
  io.text("model", c.model, [](const ModelSpec& m) { return m.str(); }, ModelSpec::parse);
  io.field("data", c.data);
  io.field("batch", c.batch);
  io.field("steps", c.steps);
  io.field("epochs", c.epochs);
  io.section("optimizer", c.optimizer, [](auto& o, auto& v) {
    o.text("kind", v.kind, optimizer_name, parse_optimizer_kind);
    o.field("lr", v.lr);
    o.field("weight_decay", v.weight_decay);
    o.field("momentum", v.momentum);
    o.field("dampening", v.dampening);
    o.field("beta1", v.beta1);
    o.field("beta2", v.beta2);
    o.field("eps", v.eps);
  });
  io.field("seed", c.seed);
  io.field("shuffle", c.shuffle);
  io.field("drop_last", c.drop_last);
  io.field("init_path", c.init_path);
  io.field("save_path", c.save_path);
  io.field("save_sharded_path", c.save_sharded_path);
  io.field("threads", c.threads);
  io.field("trace_path", c.trace_path);
  io.field("trace_modeled", c.trace_modeled);
  io.field("profile", c.profile);
  io.text("algo", c.algo, algorithm_choice_name, parse_algorithm_choice);
  io.text("proto", c.proto, protocol_choice_name, parse_protocol_choice);
  io.field("accum", c.accum);
  io.field("skip_layer", c.skip_layer);
  io.field("skip_every", c.skip_every);
  io.rank_list("skip_ranks", c.skip_ranks);
  io.field("allow_nonfinite", c.allow_nonfinite);
  io.section("ddp", c.ddp, [](auto& d, auto& v) {
    d.field("bucket_cap_bytes", v.bucket_cap_bytes);
    d.field("first_bucket_bytes", v.first_bucket_bytes);
    d.field("find_unused_parameters", v.find_unused_parameters);
    d.field("gradient_as_bucket_view", v.gradient_as_bucket_view);
    d.field("rebuild_buckets", v.rebuild_buckets);
    d.field("sized_first_iteration", v.sized_first_iteration);
  });
  io.section("fsdp", c.fsdp, [](auto& f, auto& v) {
    f.text("sharding", v.sharding, sharding_flag, parse_sharding);
    f.field("wrap_layers", v.wrap_layers);
    f.text("backward_prefetch", v.backward_prefetch, backward_prefetch_flag, parse_backward_prefetch);
    f.field("forward_prefetch", v.forward_prefetch);
    f.field("node_size", v.node_size);
  });
  io.section("pipeline", c.pipeline, [](auto& p, auto& v) {
    p.field("stages", v.stages);
    p.field("microbatches", v.microbatches);
    p.text("schedule", v.schedule, schedule_kind_flag, parse_schedule_kind);
    p.field("chunks", v.chunks);
    p.field("split", v.split);
    p.field("dp", v.dp);
    p.optional_section("fixed_costs", v.fixed_costs, [](auto& fc, auto& a) {
      fc.field("forward", a.forward);
      fc.field("backward", a.backward);
      fc.field("backward_input", a.backward_input);
      fc.field("backward_weight", a.backward_weight);
      fc.field("hop_latency", a.hop_latency);
    });
  });
  io.field("timeout_s", c.timeout_s);
  io.field("start_paused", c.start_paused);
  io.list("faults", c.faults, [](auto& fl, auto& f) {
    fl.text("kind", f.kind, fault_kind_flag, parse_fault_kind);
    fl.field("rank", f.rank);
    fl.field("seq", f.seq);
    fl.field("delay_s", f.delay_s);
  });
  io.field("device", c.device);
  io.field("launched", c.launched);
  io.field("backend", c.backend);
  io.section("socket", c.socket, [](auto& s, auto& v) {
    s.field("rank", v.rank);
    s.field("world_size", v.world_size);
    s.field("local_rank", v.local_rank);
    s.field("master_addr", v.master_addr);
    s.field("master_port", v.master_port);
    s.field("timeout_s", v.timeout_s);
    s.text("allreduce", v.algorithms.allreduce, algorithm_name, parse_algorithm);
    s.text("broadcast", v.algorithms.broadcast, algorithm_name, parse_algorithm);
    s.text("reduce", v.algorithms.reduce, algorithm_name, parse_algorithm);
  });
  io.field("monitor_port", c.monitor_port);
  io.field("monitor_wait_s", c.monitor_wait_s);
}

}  // namespace

std::string train_config_to_json(const TrainConfig& c) {
  json j;
  Writer w{j};
  config_fields(w, c);
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
  Reader r{j};
  config_fields(r, c);
  return c;
}

}  // namespace dtlab
