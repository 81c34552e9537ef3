// Megatron tensor parallelism inside the model (engine/core/model.cpp, engine/parallel/tensor_parallel):
// a TP group of 2 or 4 ranks trains exactly like one unsplit model (SGD with momentum, AdamW), sequence
// parallelism exactly like plain TP (batches that do not divide by the degree included), every TP
// collective moves its formula's bytes, the layer-by-layer path a pipeline runs (the zero-bubble halves
// too) equals the unsplit layers, and the shards hold the full model's slices.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/comm/group.h"
#include "engine/comm/threads_backend.h"
#include "engine/core/check.h"
#include "engine/core/device.h"
#include "engine/core/model.h"
#include "engine/core/optim.h"
#include "engine/parallel/tensor_parallel.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

struct TpBatch {
  std::vector<float> x;
  std::vector<int64_t> y;
  int64_t rows = 0;
};

// Deterministic batches; `rows` cycles through the given sizes (a short last batch reuses buffers).
std::vector<TpBatch> make_batches(const ModelSpec& spec, const std::vector<int64_t>& rows, int steps) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<TpBatch> out;
  for (int s = 0; s < steps; s++) {
    TpBatch b;
    b.rows = rows[static_cast<size_t>(s) % rows.size()];
    for (int64_t i = 0; i < b.rows * spec.in_features(); i++) b.x.push_back(u(gen));
    for (int64_t i = 0; i < b.rows; i++) b.y.push_back(static_cast<int64_t>(gen() % static_cast<uint32_t>(spec.out_features())));
    out.push_back(std::move(b));
  }
  return out;
}

// OptimizerKind::SGD runs with momentum 0.9; PlainSGD (an alias below) without, so a 16-bit rounding
// difference moves a parameter by lr x that difference once, not amplified over the steps.
constexpr OptimizerKind PlainSGD = static_cast<OptimizerKind>(255);  // not a real kind: optimizer() maps it
OptimizerConfig optimizer(OptimizerKind kind) {
  if (kind == PlainSGD) return default_optimizer_config(OptimizerKind::SGD);
  OptimizerConfig c = default_optimizer_config(kind);
  if (kind == OptimizerKind::SGD) c.momentum = 0.9;
  return c;
}

// One training step as the Trainer runs it: forward, mean cross-entropy, backward, optimizer step.
void train_step(Model& m, Optimizer& opt, const TpBatch& b) {
  Device& dev = m.device();
  const int64_t C = m.spec().out_features();
  m.zero_grad();
  const float* logits = m.forward(b.x.data(), b.rows);
  std::vector<float> probs(static_cast<size_t>(b.rows * C)), dlogits(probs.size());
  double stats[kLossStatsDoubles] = {0, 0};
  dev.cross_entropy_forward(probs.data(), stats, logits, b.y.data(), b.rows, C);
  dev.cross_entropy_backward(dlogits.data(), probs.data(), b.y.data(), b.rows, C, 1.0f / static_cast<float>(b.rows));
  m.backward(dlogits.data());
  if (m.mixed()) opt.step_mixed(m.params16(), m.grads16(), 1.0f);
  else opt.step(m.params(), m.grads());
}

// torch's model.to(dtype) after construction, and the optimizer's fp32 master copy of it.
void to_precision(Model& m, Optimizer& opt, Precision p) {
  if (!is_mixed(p)) return;
  m.set_precision(p);
  opt.init_master(m.params16(), m.half_format());
}

std::vector<float> train_single(const ModelSpec& spec, OptimizerKind kind, const std::vector<TpBatch>& batches,
                                Precision p = Precision::FP32) {
  Model m(spec, nullptr, 5);
  Optimizer opt(optimizer(kind), m.num_params(), nullptr);
  to_precision(m, opt, p);
  for (const TpBatch& b : batches) train_step(m, opt, b);
  return m.host_params();
}

struct TpRun {
  std::vector<std::vector<float>> full;    // per TP rank: gather_tensor_parallel_params after training
  std::vector<std::vector<Event>> events;  // per rank: its Collective events of the training steps
};

TpRun train_tp(const ModelSpec& spec, int t, bool sp, OptimizerKind kind, const std::vector<TpBatch>& batches,
               bool recompute = false, Precision p = Precision::FP32) {
  ThreadsWorld world(t);
  TpRun run;
  run.full.resize(static_cast<size_t>(t));
  world.run([&](int rank, Communicator& comm, RankContext&) {
    Model m(spec, nullptr, 5, 0, static_cast<int>(spec.dims.size()) - 1, cpu_device(), TensorParallelSpec{t, rank, sp});
    GroupTensorParallelComm tp(comm);
    m.set_tensor_parallel_comm(&tp);
    m.set_activation_checkpointing(recompute);
    Optimizer opt(optimizer(kind), m.num_params(), nullptr);
    to_precision(m, opt, p);
    for (const TpBatch& b : batches) train_step(m, opt, b);
    run.full[static_cast<size_t>(rank)] = gather_tensor_parallel_params(m, comm);
  });
  for (int r = 0; r < t; r++) {
    std::vector<Event> coll;
    for (const Event& e : world.recorder().events(r))
      if (e.kind == EventKind::Collective) coll.push_back(e);
    coll.pop_back();  // the final gather of the parameters
    run.events.push_back(coll);
  }
  return run;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (size_t i = 0; i < a.size(); i++) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

struct ParityCase {
  const char* model;
  int degree;
};
const ParityCase kParityCases[] = {
    {"mlp:2,64,64,3", 2},          // a pair, then an odd last Linear replicated
    {"mlp:2,64,64,3", 4},
    {"mlp:4,32,32,32,32,5", 2},    // two pairs
    {"mlp:4,32,32,32,32,5", 4},
    {"mlp:6,16,4", 2},             // one pair: the row layer produces the logits
    {"mlp:6,16,4", 4},
};

}  // namespace

TEST_SUITE("tensor_parallel") {
  TEST_CASE("TP t in {2, 4} trains exactly like one unsplit model for 20 steps (SGD momentum, AdamW)") {
    for (const ParityCase& k : kParityCases) {
      for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW}) {
        const ModelSpec spec = ModelSpec::parse(k.model);
        const std::vector<TpBatch> batches = make_batches(spec, {16}, 20);
        const std::vector<float> single = train_single(spec, kind, batches);
        const TpRun tp = train_tp(spec, k.degree, false, kind, batches);
        const std::string model = k.model, optim = optimizer_name(kind);
        CAPTURE(model);
        CAPTURE(k.degree);
        CAPTURE(optim);
        for (int r = 0; r < k.degree; r++) CHECK(max_abs_diff(tp.full[static_cast<size_t>(r)], single) <= 1e-5f);
        // The run changed the parameters: the comparison is not between two initial states.
        CHECK(max_abs_diff(single, torch_init_values(spec, 5, 0, static_cast<int>(spec.dims.size()) - 1)) > 1e-3f);
      }
    }
  }

  TEST_CASE("sequence parallel trains exactly like TP, batches not divisible by the degree included") {
    for (const ParityCase& k : kParityCases) {
      const ModelSpec spec = ModelSpec::parse(k.model);
      // 13 and 6 rows: neither divides by 4, 13 not by 2; the shorter batch reuses the buffers.
      const std::vector<TpBatch> batches = make_batches(spec, {13, 6, 16}, 20);
      const TpRun tp = train_tp(spec, k.degree, false, OptimizerKind::AdamW, batches);
      const TpRun sp = train_tp(spec, k.degree, true, OptimizerKind::AdamW, batches);
      const std::vector<float> single = train_single(spec, OptimizerKind::AdamW, batches);
      const std::string model = k.model;
      CAPTURE(model);
      CAPTURE(k.degree);
      CHECK(max_abs_diff(sp.full[0], tp.full[0]) <= 1e-5f);
      CHECK(max_abs_diff(sp.full[0], single) <= 1e-5f);
    }
  }

  TEST_CASE("TP groups as process groups of a larger world, with gradient accumulation, equal one model") {
    // World 4 as a mesh dp 2 x tp 2: TP groups {0, 1} and {2, 3} (new_group), each training the same
    // batches in 2 micro-batches per step; sequence parallel sums its partial parameter gradients apart
    // from the gradient the first micro-batch left.
    const ModelSpec spec = ModelSpec::parse("mlp:4,32,32,32,32,5");
    const std::vector<TpBatch> batches = make_batches(spec, {7, 5}, 12);
    auto accumulate_step = [](Model& m, Optimizer& opt, const TpBatch& a, const TpBatch& b) {
      Device& dev = m.device();
      const int64_t C = m.spec().out_features();
      m.zero_grad();
      for (const TpBatch* mb : {&a, &b}) {
        const float* logits = m.forward(mb->x.data(), mb->rows);
        std::vector<float> probs(static_cast<size_t>(mb->rows * C)), dlogits(probs.size());
        double stats[kLossStatsDoubles] = {0, 0};
        dev.cross_entropy_forward(probs.data(), stats, logits, mb->y.data(), mb->rows, C);
        dev.cross_entropy_backward(dlogits.data(), probs.data(), mb->y.data(), mb->rows, C, 1.0f / 12.0f);
        m.backward(dlogits.data());
      }
      opt.step(m.params(), m.grads());
    };
    Model single(spec, nullptr, 5);
    Optimizer single_opt(optimizer(OptimizerKind::SGD), single.num_params(), nullptr);
    for (size_t s = 0; s + 1 < batches.size(); s += 2) accumulate_step(single, single_opt, batches[s], batches[s + 1]);
    const std::vector<float> want = single.host_params();
    for (bool sp : {false, true}) {
      const MeshShape mesh{2, 1, 2};
      ThreadsWorld world(4);
      std::vector<std::vector<float>> got(4);
      world.run([&](int rank, Communicator& comm, RankContext&) {
        auto executor = std::make_shared<GroupExecutor>();
        const std::vector<int> members = mesh_group(mesh, MeshDim::TP, rank);
        std::unique_ptr<Communicator> group =
            new_group(comm, members, 1000 + 16 * mesh_group_index(mesh, MeshDim::TP, rank), executor);
        const int tp_rank = mesh_coord(mesh, rank).tp;
        Model m(spec, nullptr, 5, 0, 5, cpu_device(), TensorParallelSpec{2, tp_rank, sp});
        GroupTensorParallelComm tp(*group);
        m.set_tensor_parallel_comm(&tp);
        Optimizer opt(optimizer(OptimizerKind::SGD), m.num_params(), nullptr);
        for (size_t s = 0; s + 1 < batches.size(); s += 2) accumulate_step(m, opt, batches[s], batches[s + 1]);
        got[static_cast<size_t>(rank)] = gather_tensor_parallel_params(m, *group);
      });
      CAPTURE(sp);
      for (int r = 0; r < 4; r++) CHECK(max_abs_diff(got[static_cast<size_t>(r)], want) <= 1e-5f);
    }
  }

  TEST_CASE("every TP collective moves exactly its formula's bytes, in the formula's order") {
    for (const ParityCase& k : kParityCases) {
      for (bool sp : {false, true}) {
        const ModelSpec spec = ModelSpec::parse(k.model);
        const int n_linear = static_cast<int>(spec.dims.size()) - 1;
        const std::vector<TpBatch> batches = make_batches(spec, {13}, 1);
        const TpRun run = train_tp(spec, k.degree, sp, OptimizerKind::SGD, batches);
        const std::vector<TpCollective> want =
            tp_collectives(spec, 0, n_linear, TensorParallelSpec{k.degree, 0, sp}, 13, false);
        const std::string model = k.model;
        CAPTURE(model);
        CAPTURE(k.degree);
        CAPTURE(sp);
        for (int r = 0; r < k.degree; r++) {
          const std::vector<Event>& got = run.events[static_cast<size_t>(r)];
          REQUIRE(got.size() == want.size());
          for (size_t i = 0; i < want.size(); i++) {
            CAPTURE(i);
            CHECK(got[i].coll.op == want[i].op);
            CHECK(got[i].coll.bytes == want[i].bytes);
            CHECK(got[i].coll.group_size == k.degree);
          }
        }
        // Megatron's count: per pair 1 all-reduce forward (g) and 1 backward (f), less the first
        // column layer's f, whose input (the data) needs no gradient; sequence parallelism replaces
        // each all-reduce by a reduce-scatter and an all-gather.
        const int pairs = n_linear / 2;
        int all_reduces = 0, gathers = 0, scatters = 0;
        for (const TpCollective& c : want) {
          all_reduces += c.op == CollectiveOp::AllReduce;
          gathers += c.op == CollectiveOp::AllGather;
          scatters += c.op == CollectiveOp::ReduceScatter;
        }
        if (!sp) {
          CHECK(all_reduces == 2 * pairs - 1);
          CHECK(gathers + scatters == 0);
        } else {
          CHECK(scatters == 2 * pairs - 1);                 // g forward, f backward
          CHECK(gathers == 2 * pairs + 1);                  // f forward, g backward, the logits
          CHECK(all_reduces == pairs + (n_linear % 2));     // row biases, the replicated Linear
        }
      }
    }
  }

  TEST_CASE("TP in bf16 and fp16 trains like one 16-bit model within 16-bit rounding, its collectives moving 2-byte elements") {
    // Megatron under bf16: the pairs' partial outputs and input gradients are 16-bit tensors, summed
    // as such, so TP rounds a partial sum the one-rank model never forms: equal within the dtype's
    // rounding at each tensor's scale (test::differs_at_tensor_scale), not bit for bit. Plain SGD, as
    // the combination test trains (momentum would amplify one step's rounding over the next ones).
    for (const ParityCase& k : kParityCases) {
      for (Precision p : {Precision::BF16, Precision::FP16}) {
        for (bool sp : {false, true}) {
          const ModelSpec spec = ModelSpec::parse(k.model);
          const int n_linear = static_cast<int>(spec.dims.size()) - 1;
          const std::vector<TpBatch> batches = make_batches(spec, {13}, 3);
          const std::vector<float> single = train_single(spec, PlainSGD, batches, p);
          const TpRun run = train_tp(spec, k.degree, sp, PlainSGD, batches, false, p);
          const std::string model = k.model, dtype = precision_name(p);
          CAPTURE(model);
          CAPTURE(k.degree);
          CAPTURE(dtype);
          CAPTURE(sp);
          const double rtol = p == Precision::BF16 ? 1.6e-2 : 1e-3;
          const std::vector<float> exact = train_single(spec, PlainSGD, batches);
          for (int r = 0; r < k.degree; r++) {
            const std::string why = test::differs_at_tensor_scale(spec, run.full[static_cast<size_t>(r)], single, exact, rtol);
            CHECK_MESSAGE(why.empty(), why);
          }
          CHECK(max_abs_diff(run.full[0], exact) > 1e-4f);  // it ran in 16 bits: float32's run ends elsewhere
          // The float32 run's collectives in its order, each moving 2 bytes per element.
          const std::vector<TpCollective> want =
              tp_collectives(spec, 0, n_linear, TensorParallelSpec{k.degree, 0, sp}, 13, false, false, LoraSpec{},
                             p == Precision::BF16 ? DType::BF16 : DType::F16);
          const std::vector<TpCollective> f32 = tp_collectives(spec, 0, n_linear, TensorParallelSpec{k.degree, 0, sp}, 13, false);
          for (int r = 0; r < k.degree; r++) {
            const std::vector<Event>& got = run.events[static_cast<size_t>(r)];
            REQUIRE(got.size() == 3 * want.size());
            for (size_t i = 0; i < got.size(); i++) {
              CAPTURE(i);
              CHECK(got[i].coll.op == want[i % want.size()].op);
              CHECK(got[i].coll.bytes == want[i % want.size()].bytes);
              CHECK(2 * got[i].coll.bytes == f32[i % want.size()].bytes);
            }
          }
        }
      }
    }
  }

  TEST_CASE("activation checkpointing on a TP shard replays the forward collectives and trains like one model") {
    for (const ParityCase& k : kParityCases) {
      for (bool sp : {false, true}) {
        const ModelSpec spec = ModelSpec::parse(k.model);
        const int n_linear = static_cast<int>(spec.dims.size()) - 1;
        const std::string model = k.model;
        CAPTURE(model);
        CAPTURE(k.degree);
        CAPTURE(sp);
        // 3 steps of 13 rows (not divisible by the degree): the recompute equals the plain TP run bit for
        // bit (the same kernels on the same inputs, the same sums) and one unsplit model within 1e-5.
        const std::vector<TpBatch> batches = make_batches(spec, {13}, 3);
        const TpRun plain = train_tp(spec, k.degree, sp, OptimizerKind::AdamW, batches);
        const TpRun recompute = train_tp(spec, k.degree, sp, OptimizerKind::AdamW, batches, true);
        const std::vector<float> single = train_single(spec, OptimizerKind::AdamW, batches);
        for (int r = 0; r < k.degree; r++) {
          CHECK(max_abs_diff(recompute.full[static_cast<size_t>(r)], plain.full[static_cast<size_t>(r)]) == 0.0f);
          CHECK(max_abs_diff(recompute.full[static_cast<size_t>(r)], single) <= 1e-5f);
        }
        // Each step issues what tp_collectives(..., recompute) lists, in its order: the plain step's
        // collectives plus every Linear's forward collectives once more, in backward.
        const TensorParallelSpec tp{k.degree, 0, sp};
        const std::vector<TpCollective> want = tp_collectives(spec, 0, n_linear, tp, 13, false, true);
        const std::vector<TpCollective> base = tp_collectives(spec, 0, n_linear, tp, 13, false);
        int64_t forward_bytes = 0, forward_count = 0;
        for (const TpCollective& c : base) {
          const bool logits = c.op == CollectiveOp::AllGather && c.layer == 2 * (n_linear - 1);  // outside the blocks
          if (!c.backward && !logits) forward_count++, forward_bytes += c.bytes;
        }
        CHECK(want.size() == base.size() + static_cast<size_t>(forward_count));
        CHECK(tp_collective_bytes(want) == tp_collective_bytes(base) + forward_bytes);
        for (int r = 0; r < k.degree; r++) {
          const std::vector<Event>& got = recompute.events[static_cast<size_t>(r)];
          REQUIRE(got.size() == 3 * want.size());
          for (size_t i = 0; i < got.size(); i++) {
            CAPTURE(i);
            CHECK(got[i].coll.op == want[i % want.size()].op);
            CHECK(got[i].coll.bytes == want[i % want.size()].bytes);
          }
        }
      }
    }
    // Worked for mlp:2,64,64,3 at tp 2 on 16 rows: the recompute of Linear 2 all-reduces its 16 x 64
    // partial outputs again (4096 bytes); sequence parallel gathers Linear 0's 16 x 2 input rows again
    // (128 bytes) and reduce-scatters Linear 2's 16 x 64 partial outputs again (4096 bytes).
    const ModelSpec spec = ModelSpec::parse("mlp:2,64,64,3");
    for (bool sp : {false, true}) {
      const TensorParallelSpec tp{2, 0, sp};
      const std::vector<TpCollective> with = tp_collectives(spec, 0, 3, tp, 16, false, true);
      const std::vector<TpCollective> without = tp_collectives(spec, 0, 3, tp, 16, false);
      CHECK(with.size() - without.size() == (sp ? 2u : 1u));
      CHECK(tp_collective_bytes(with) - tp_collective_bytes(without) == (sp ? 128 + 4096 : 4096));
    }
  }

  TEST_CASE("LoRA on a TP shard, sequence parallel or not: the one-rank adapters' slices, gathered back whole, trained like one LoRA model") {
    LoraSpec every;
    every.rank = 4;
    LoraSpec row_only = every;  // only a row-parallel Linear adapted (Linear 2 is row-parallel in every case)
    row_only.layers = {2};
    for (const ParityCase& k : kParityCases) {
      for (const LoraSpec& lora : {every, row_only}) {
       for (bool sp : {false, true}) {  // sequence parallel: the adapters see the base layer's rows
        const ModelSpec spec = ModelSpec::parse(k.model);
        const int n_linear = static_cast<int>(spec.dims.size()) - 1;
        const int t = k.degree;
        const std::string model = k.model;
        CAPTURE(model);
        CAPTURE(t);
        CAPTURE(sp);
        CAPTURE(lora.layers.size());
        const std::vector<TpBatch> batches = make_batches(spec, {13}, 3);
        Model one(spec, nullptr, 5);
        one.enable_lora(lora, 5);
        const std::vector<float> init = one.host_params();
        Optimizer one_opt(optimizer(OptimizerKind::AdamW), one.num_params(), nullptr);
        for (const TpBatch& b : batches) train_step(one, one_opt, b);
        const std::vector<float> want = one.host_params();

        ThreadsWorld world(t);
        std::vector<std::vector<float>> start(static_cast<size_t>(t)), got(start);
        world.run([&](int rank, Communicator& comm, RankContext&) {
          Model m(spec, nullptr, 5, 0, n_linear, cpu_device(), TensorParallelSpec{t, rank, sp});
          GroupTensorParallelComm tp(comm);
          m.set_tensor_parallel_comm(&tp);
          m.enable_lora(lora, 5);
          // peft's names in the one-rank order; each shape is the one-rank shape with the split side / t.
          REQUIRE(m.parameters().size() == one.parameters().size());
          for (size_t i = 0; i < m.parameters().size(); i++) {
            const Parameter& p = m.parameters()[i];
            const Parameter& q = one.parameters()[i];
            CHECK(p.name == q.name);
            CHECK(p.numel * (p.shape == q.shape ? 1 : t) == q.numel);
          }
          for (int i = 0; i < m.num_layers(); i++) {
            const Layer& L = m.layer(i);
            if (L.lora_a < 0) continue;
            const Shape a = m.parameters()[static_cast<size_t>(L.lora_a)].shape, b = m.parameters()[static_cast<size_t>(L.lora_b)].shape;
            const int64_t in = spec.dims[static_cast<size_t>(L.seq_index / 2)], out = spec.dims[static_cast<size_t>(L.seq_index / 2 + 1)];
            CHECK(a == Shape{4, L.tp == TpRole::Row ? in / t : in});
            CHECK(b == Shape{L.tp == TpRole::Column ? out / t : out, 4});
          }
          start[static_cast<size_t>(rank)] = gather_tensor_parallel_params(m, comm);
          Optimizer opt(optimizer(OptimizerKind::AdamW), m.num_params(), nullptr);
          for (const TpBatch& b : batches) train_step(m, opt, b);
          got[static_cast<size_t>(rank)] = gather_tensor_parallel_params(m, comm);
        });
        for (int r = 0; r < t; r++) {
          CHECK(max_abs_diff(start[static_cast<size_t>(r)], init) == 0.0f);  // the one-rank adapters, exactly
          CHECK(max_abs_diff(got[static_cast<size_t>(r)], want) <= 1e-5f);
        }
        CHECK(max_abs_diff(want, init) > 1e-3f);  // B moved off zero: the comparison is not of two starts
        // Each step's collectives are tp_collectives(..., lora)'s: the base layer's f and g, plus one
        // all-reduce of the whole adapter factor's gradient per adapted split Linear.
        const std::vector<TpCollective> plan = tp_collectives(spec, 0, n_linear, TensorParallelSpec{t, 0, sp}, 13, false, false, lora);
        for (int r = 0; r < t; r++) {
          std::vector<Event> coll;
          for (const Event& e : world.recorder().events(r))
            if (e.kind == EventKind::Collective) coll.push_back(e);
          REQUIRE(coll.size() == 3 * plan.size() + 2);  // the gathers before and after training
          for (size_t i = 0; i < 3 * plan.size(); i++) {
            CAPTURE(i);
            CHECK(coll[i + 1].coll.op == plan[i % plan.size()].op);
            CHECK(coll[i + 1].coll.bytes == plan[i % plan.size()].bytes);
          }
        }
       }
      }
    }
    // Worked for mlp:2,64,64,3 at tp 2, r 4, 16 rows: g of Linear 2 (16 x 64), then in backward lora_B
    // of Linear 2 (64 x 4) and lora_A of Linear 0 (4 x 2); Linear 0's f moves nothing (the data needs no
    // gradient) and the replicated Linear 4's adapters see the same rows on every rank.
    const ModelSpec spec = ModelSpec::parse("mlp:2,64,64,3");
    const std::vector<TpCollective> plan = tp_collectives(spec, 0, 3, TensorParallelSpec{2, 0, false}, 16, false, false, every);
    REQUIRE(plan.size() == 3);
    CHECK(plan[1].layer == 2);
    CHECK(plan[1].bytes == 64 * 4 * 4);
    CHECK(plan[2].layer == 0);
    CHECK(plan[2].bytes == 4 * 2 * 4);
    CHECK(tp_collective_bytes(plan) == (16 * 64 + 64 * 4 + 4 * 2) * 4);
  }

  TEST_CASE("the byte formulas, worked for mlp:2,64,64,3 at tp 2 on 16 rows") {
    const ModelSpec spec = ModelSpec::parse("mlp:2,64,64,3");
    const std::vector<TpCollective> tp = tp_collectives(spec, 0, 3, TensorParallelSpec{2, 0, false}, 16, false);
    REQUIRE(tp.size() == 1);  // g of Linear 2: 16 x 64 floats
    CHECK(tp[0].layer == 2);
    CHECK(tp[0].bytes == 16 * 64 * 4);
    // A pipeline stage after the first needs its input gradient: f of Linear 0 all-reduces 16 x 2.
    const std::vector<TpCollective> staged = tp_collectives(spec, 0, 3, TensorParallelSpec{2, 0, false}, 16, true);
    REQUIRE(staged.size() == 2);
    CHECK(staged[1].layer == 0);
    CHECK(staged[1].bytes == 16 * 2 * 4);
    CHECK(tp_collective_bytes(staged) == 16 * 66 * 4);
    // Sequence parallel: an all-reduce of S bytes becomes a reduce-scatter and an all-gather of S each.
    const std::vector<TpCollective> sp = tp_collectives(spec, 0, 3, TensorParallelSpec{2, 0, true}, 16, false);
    REQUIRE(sp.size() == 6);
    CHECK(sp[0].op == CollectiveOp::AllGather);      // f: 8 rows x 2 from each rank, 16 x 2 gathered
    CHECK(sp[0].bytes == 16 * 2 * 4);
    CHECK(sp[1].op == CollectiveOp::ReduceScatter);  // g: 16 x 64 partial sums in
    CHECK(sp[1].bytes == 16 * 64 * 4);
    CHECK(sp[2].bytes == 16 * 3 * 4);                // the logits
    CHECK(sp[3].bytes == (3 * 64 + 3) * 4);          // Linear 4's gradients
    CHECK(sp[4].op == CollectiveOp::AllGather);      // g backward: Linear 2's output gradient
    CHECK(sp[4].bytes == 16 * 64 * 4);
    CHECK(sp[5].bytes == 64 * 4);                    // Linear 2's bias gradient
    // Without the sums of partial parameter gradients, SP moves TP's bytes: each all-reduce of S is a
    // reduce-scatter and an all-gather of S (ring: (n-1)/n x S each, 2(n-1)/n x S together).
    CHECK(sp[1].bytes == tp[0].bytes);
    CHECK(tp_collectives(spec, 0, 3, TensorParallelSpec{1, 0, false}, 16, true).empty());
  }

  TEST_CASE("layer by layer, as a pipeline stage runs it (zero-bubble halves too), equals the unsplit layers") {
    const ModelSpec spec = ModelSpec::parse("mlp:4,32,32,32,32,5");
    const int first = 1, end = 4, t = 2;  // a middle stage: Linear 2 column, 4 row, 6 replicated
    const int64_t B = 6;
    const std::vector<float> x = [&] {
      std::vector<float> v(static_cast<size_t>(B * 32));
      std::mt19937 gen(3);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (float& f : v) f = u(gen);
      return v;
    }();
    // Runs the stage's layers forward, then backward with input gradients from a fixed dout, whole or
    // in I and W halves; returns the input gradient (the gradients accumulate in the model).
    auto run_stage = [&](Model& m, bool split) {
      const int n = m.num_layers();
      std::vector<std::vector<float>> acts(static_cast<size_t>(n));
      const float* in = x.data();
      for (int i = 0; i < n; i++) {
        acts[static_cast<size_t>(i)].resize(static_cast<size_t>(B * m.layer(i).out_features));
        m.layer_forward(i, acts[static_cast<size_t>(i)].data(), in, B);
        in = acts[static_cast<size_t>(i)].data();
      }
      std::vector<float> dout(static_cast<size_t>(B * m.layer(n - 1).out_features));
      for (size_t j = 0; j < dout.size(); j++) dout[j] = 0.01f * static_cast<float>(j % 7) - 0.02f;
      std::vector<std::vector<float>> douts(static_cast<size_t>(n));
      for (int i = n - 1; i >= 0; i--) {
        std::vector<float> dinp(static_cast<size_t>(B * m.layer(i).in_features));
        const float* lin = i > 0 ? acts[static_cast<size_t>(i - 1)].data() : x.data();
        if (split) m.layer_backward_input(i, dinp.data(), dout.data(), acts[static_cast<size_t>(i)].data(), B);
        else m.layer_backward(i, dinp.data(), dout.data(), lin, acts[static_cast<size_t>(i)].data(), B);
        douts[static_cast<size_t>(i)] = std::move(dout);
        dout = std::move(dinp);
      }
      for (int i = 0; split && i < n; i++)
        m.layer_backward_weight(i, douts[static_cast<size_t>(i)].data(), i > 0 ? acts[static_cast<size_t>(i - 1)].data() : x.data(), B);
      return dout;
    };
    Model single(spec, nullptr, 5, first, end);
    single.zero_grad();
    const std::vector<float> want_dx = run_stage(single, false);
    std::vector<float> want_grads(static_cast<size_t>(single.num_params()));
    single.device().download(want_grads.data(), single.grads(), single.num_params() * 4);
    for (bool split : {false, true}) {
      ThreadsWorld world(t);
      world.run([&](int rank, Communicator& comm, RankContext&) {
        Model m(spec, nullptr, 5, first, end, cpu_device(), TensorParallelSpec{t, rank, false});
        GroupTensorParallelComm tp(comm);
        m.set_tensor_parallel_comm(&tp);
        m.zero_grad();
        const std::vector<float> dx = run_stage(m, split);
        // The gradients sit where the parameters do: upload them as parameters and gather.
        std::vector<float> g(static_cast<size_t>(m.num_params()));
        m.device().download(g.data(), m.grads(), m.num_params() * 4);
        m.upload_params(g.data());
        const std::vector<float> grads = gather_tensor_parallel_params(m, comm);
        if (rank != 0) return;
        CAPTURE(split);
        CHECK(max_abs_diff(dx, want_dx) <= 1e-6f);
        CHECK(max_abs_diff(grads, want_grads) <= 1e-6f);
      });
    }
  }

  TEST_CASE("a split width that does not divide by the degree is one sentence") {
    try {
      Model m(ModelSpec::parse("mlp:4,30,32,5"), nullptr, 0, 0, 3, cpu_device(), TensorParallelSpec{4, 0, false});
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(std::string(e.what()) ==
            "--tp 4 splits the output features of Linear 0 (width 30) across the tensor-parallel group, but 30 is "
            "not divisible by 4; use hidden widths that are multiples of --tp");
    }
    // The row layer's outputs and the replicated last Linear's are not split: any width works.
    CHECK_NOTHROW(Model(ModelSpec::parse("mlp:4,32,31,5"), nullptr, 0, 0, 3, cpu_device(), TensorParallelSpec{4, 0, false}));
  }

  TEST_CASE("the shards have the local shapes and the full model's slices") {
    const ModelSpec spec = ModelSpec::parse("mlp:2,64,64,3");
    const std::vector<float> full = torch_init_values(spec, 5, 0, 3);
    for (int rank = 0; rank < 2; rank++) {
      Model m(spec, nullptr, 5, 0, 3, cpu_device(), TensorParallelSpec{2, rank, false});
      CAPTURE(rank);
      const auto& p = m.parameters();
      REQUIRE(p.size() == 6);
      CHECK(p[0].shape == Shape{32, 2});   // 0.weight: column-parallel, rows split
      CHECK(p[1].shape == Shape{32});
      CHECK(p[2].shape == Shape{64, 32});  // 2.weight: row-parallel, columns split
      CHECK(p[3].shape == Shape{64});      // its bias whole
      CHECK(p[4].shape == Shape{3, 64});   // 4: replicated
      CHECK(m.layer(0).tp == TpRole::Column);
      CHECK(m.layer(2).tp == TpRole::Row);
      CHECK(m.layer(4).tp == TpRole::Replicated);
      const std::vector<float> v = m.host_params();
      // 0.weight row 5 of this rank is row 32 * rank + 5 of the full one.
      CHECK(v[static_cast<size_t>(5 * 2 + 1)] == full[static_cast<size_t>((32 * rank + 5) * 2 + 1)]);
      // 2.weight (64, 32): row 7, column 3 is the full (64, 64)'s row 7, column 32 * rank + 3.
      const size_t w2 = static_cast<size_t>(p[2].offset), full_w2 = 64 * 2 + 64;
      CHECK(v[w2 + 7 * 32 + 3] == full[full_w2 + 7 * 64 + static_cast<size_t>(32 * rank) + 3]);
      std::vector<float> cut(static_cast<size_t>(m.num_params()));
      shard_full_params(m, full.data(), cut.data());
      CHECK(cut == v);
      // Compute follows the local widths: Linear 0 forward on 8 rows is 2 x 8 x 2 x 32 + 8 x 32.
      CHECK(m.layer_forward_flops(0, 8) == doctest::Approx(2.0 * 8 * 2 * 32 + 8 * 32));
    }
  }
}
