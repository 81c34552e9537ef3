// A training run: data -> sampler -> loader -> model -> loss -> backward -> optimizer, one rank
// ("single" strategy). Front ends (CLI, app) configure it with TrainConfig, call run() and receive a
// StepReport per step; later strategies (ddp, fsdp, pipeline) plug in beside run_single().
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/core/memory.h"
#include "engine/core/model.h"
#include "engine/core/optim.h"
#include "engine/data/dataset.h"
#include "engine/trace/context.h"

namespace dtlab {

struct TrainConfig {
  std::string strategy = "single";
  int world_size = 1;
  ModelSpec model = ModelSpec::parse("mlp:2,64,64,3");
  std::string data = "spiral";
  int64_t batch = 64;       // per rank
  int64_t steps = 0;        // exactly one of steps / epochs is > 0
  int64_t epochs = 0;
  OptimizerConfig optimizer = default_optimizer_config(OptimizerKind::AdamW);
  uint64_t seed = 0;        // model init (torch.manual_seed) and the sampler's seed
  bool shuffle = true;
  bool drop_last = false;
  std::string init_path;    // safetensors to start from
  std::string save_path;    // safetensors written at the end (atomically)
  int threads = 0;          // BLAS threads; 0 = library default
  std::string trace_path;   // Chrome trace JSON written at the end (atomically)
  bool trace_modeled = false;  // trace timeline on the modeled clock instead of wall time
  std::string profile = "nvlink8";  // hardware profile of the modeled clock
};

struct StepReport {
  int64_t step = 0;         // 1-based
  int64_t total_steps = 0;
  int64_t epoch = 0;        // the sampler's epoch (set_epoch value)
  int64_t batch_size = 0;   // this step's batch (the last one of an epoch may be partial)
  float loss = 0;           // mean cross-entropy of this batch
  double accuracy = 0;      // fraction of this batch classified correctly (before the update)
  double step_seconds = 0;  // wall time of forward + backward + step
  double samples_per_sec = 0;
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t epochs_started = 0;
  double seconds = 0;             // wall time of the training loop
  double samples_per_sec = 0;
  float eval_loss = 0;            // over the whole training set after the last step
  double eval_accuracy = 0;
  int64_t eval_correct = 0, eval_samples = 0;
  MemoryStats memory;             // rank 0
  int64_t start_step = 0;         // from --init's metadata
};

// dtlab::Error unless the data's features equal the model's input width and its classes fit the
// output width.
void check_data_fits_model(const Dataset& data, const ModelSpec& spec);

struct EvalResult {
  float loss = 0;       // mean cross-entropy over the data set
  double accuracy = 0;
  int64_t correct = 0, samples = 0;
};

// Forward over the whole data set in chunks of `batch` rows (activations sized once). When
// `logits` is given it receives (n, classes) outputs.
EvalResult evaluate(Model& model, const Dataset& data, int64_t batch, float* logits = nullptr);

// Checks the configuration and prepares everything (data, model, optimizer); throws dtlab::Error
// with one sentence for any bad input before a single step runs.
class Trainer {
 public:
  explicit Trainer(const TrainConfig& config);
  ~Trainer();

  const TrainConfig& config() const { return config_; }
  const Dataset& dataset() const { return *dataset_; }
  Model& model() { return *model_; }
  int64_t total_steps() const { return total_steps_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  MemoryTracker& memory() { return memory_; }
  TraceRecorder& recorder() { return *recorder_; }
  RankContext& context() { return *ctx_; }

  TrainSummary run(const std::function<void(const StepReport&)>& on_step = {});

 private:
  TrainConfig config_;
  MemoryTracker memory_;
  std::unique_ptr<TraceRecorder> recorder_;
  std::unique_ptr<CostModel> cost_;
  std::unique_ptr<RankContext> ctx_;
  std::unique_ptr<Dataset> dataset_;
  std::unique_ptr<Model> model_;
  int64_t total_steps_ = 0;
  int64_t batches_per_epoch_ = 0;
  int64_t start_step_ = 0;
};

}  // namespace dtlab
