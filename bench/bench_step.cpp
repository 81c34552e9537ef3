// Training-step benchmark: forward + loss + backward + AdamW step of mlp:256,1024,1024,10 at batch
// 256 on one rank, timed beside the same step in PyTorch (bench/torch_step.py, same init, data and
// thread count) when /usr/bin/python3 has torch. Prints the ratio dtlab/torch (goal <= 1.0). With
// --model gpt-tiny (or any gpt:...), nanoGPT's GPT on synthetic tokens against tests/nanogpt_torch.py
// (the tiny-GPT issue's goal: <= 0.8).
// Usage: dtlab-bench-step [--model SPEC] [--batch B] [--steps N] [--threads T]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/model.h"
#include "engine/core/ops.h"
#include "engine/core/optim.h"
#include "engine/trace/context.h"

using namespace dtlab;

int main(int argc, char** argv) {
  std::string spec_text = "mlp:256,1024,1024,10";
  int64_t B = 256, steps = 50, warmup = 5;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") spec_text = v;
    else if (k == "--batch") B = std::stoll(v);
    else if (k == "--steps") steps = std::stoll(v);
    else if (k == "--threads") threads = std::stoi(v);
    else {
      std::fprintf(stderr, "dtlab-bench-step: unknown flag %s; flags are --model --batch --steps --threads\n", k.c_str());
      return 2;
    }
  }
  ModelSpec spec = ModelSpec::parse(spec_text);
  if (spec.is_gpt() && spec.gpt.vocab == 0) spec.gpt.vocab = 65;  // shakespeare_char's
  set_compute_threads(threads);
  // A GPT's rows are its positions: tokens (b*T + t) * 7 % V, each position's target the next one.
  const int64_t R = B * spec.rows_per_sample();
  const int64_t D = spec.in_features(), K = spec.out_features();
  std::vector<float> x(spec.is_gpt() ? 0 : B * D);
  std::vector<int64_t> y(R), tok(spec.is_gpt() ? R : 0);
  for (int64_t b = 0; b < B; b++) {
    if (spec.is_gpt()) {
      for (int64_t t = 0; t < D; t++) {
        tok[b * D + t] = (b * D + t) * 7 % K;
        y[b * D + t] = (b * D + t + 1) * 7 % K;
      }
      continue;
    }
    for (int64_t j = 0; j < D; j++) x[b * D + j] = static_cast<float>(std::sin(0.01 * (b * D + j)));
    y[b] = b % K;
  }
  MemoryTracker mem;
  Model model(spec, &mem, 0);
  OptimizerConfig oc;
  oc.kind = OptimizerKind::AdamW;
  oc.lr = 1e-3;
  oc.weight_decay = 0.01;
  Optimizer opt(oc, model.num_params(), &mem);
  std::vector<float> probs(R * K), dlogits(R * K);
  // Instrumentation as training uses it: per-layer compute events, memory events, modeled clock.
  TraceRecorder recorder(1);
  CostModel cost(find_profile("nvlink8"), 1);
  RankContext ctx(0, &recorder, &cost, nullptr, &mem);
  auto step = [&](bool record) {
    model.set_observer(record ? &ctx : nullptr);
    auto t0 = std::chrono::steady_clock::now();
    model.zero_grad();
    const float* logits = spec.is_gpt() ? model.forward_tokens(tok.data(), B) : model.forward(x.data(), B);
    float loss = cross_entropy_forward(probs.data(), logits, y.data(), R, K);
    cross_entropy_backward(dlogits.data(), probs.data(), y.data(), R, K, 1.0f / static_cast<float>(R));
    model.backward(dlogits.data());
    opt.step(model.params(), model.grads());
    return std::make_pair(loss, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  std::vector<double> times, times_rec;
  float first_loss = 0;
  for (int64_t i = 0; i < warmup; i++) {
    float l = step(false).first;
    if (i == 0) first_loss = l;
  }
  // Recording off and on in alternating blocks of the same run, so drift hits both alike.
  for (int64_t i = 0; i < steps; i++) {
    times.push_back(step(false).second);
    times_rec.push_back(step(true).second);
  }
  model.set_observer(nullptr);
  std::sort(times_rec.begin(), times_rec.end());
  std::sort(times.begin(), times.end());
  double med = 1e3 * times[times.size() / 2];
  std::printf("train step of %s, batch %lld, adamw, %d threads, median of %lld steps\n",
              spec.str().c_str(), static_cast<long long>(B), threads, static_cast<long long>(steps));
  std::printf("  dtlab   %8.3f ms/step  (min %.3f)  %10.0f samples/s  first loss %.6f\n", med,
              1e3 * times[0], B / (med / 1e3), first_loss);
  double med_rec = 1e3 * times_rec[times_rec.size() / 2];
  std::printf("  dtlab with trace recording %8.3f ms/step: overhead %+.2f%% (goal <= 3%%; %llu events recorded)\n",
              med_rec, 100.0 * (med_rec - med) / med, static_cast<unsigned long long>(recorder.all_events().size() + recorder.dropped(0)));

  // PyTorch's intra-op threads (torch.set_num_threads) do not bound OpenBLAS's own pool, so a
  // "1-thread" torch can still run its GEMMs on every core, and with both pools at T the two
  // oversubscribe the cores. Measure torch in each split with at most T threads per pool and
  // compare against its best, so the ratio never flatters dtlab.
  std::vector<std::pair<int, int>> splits;  // (torch threads, OpenBLAS threads)
  for (int t : {1, threads})
    for (int b : {1, threads})
      if (std::find(splits.begin(), splits.end(), std::make_pair(t, b)) == splits.end())
        splits.push_back({t, b});
  nlohmann::json best;
  for (auto [t, b] : splits) {
    std::string cmd = "OMP_NUM_THREADS=" + std::to_string(t) + " OPENBLAS_NUM_THREADS=" +
                      std::to_string(b) + " /usr/bin/python3 " DTLAB_SOURCE_DIR "/bench/torch_step.py " +
                      spec.str() + " " + std::to_string(B) + " " + std::to_string(steps) + " " +
                      std::to_string(warmup) + " " + std::to_string(t) + " 2>/dev/null";
    FILE* f = popen(cmd.c_str(), "r");
    std::string out;
    if (f) {
      char buf[512];
      while (std::fgets(buf, sizeof buf, f)) out += buf;
      pclose(f);
    }
    auto j = nlohmann::json::parse(out, nullptr, false);
    if (j.is_discarded() || j.contains("error") || !j.contains("median_ms")) {
      std::printf("  pytorch  not measured: /usr/bin/python3 with torch is not available (apt-get install python3-torch)\n");
      return 0;
    }
    std::printf("  pytorch %8.3f ms/step  (min %.3f)  %10.0f samples/s  first loss %.6f  (torch %s, %d intra-op + %d OpenBLAS threads)\n",
                j["median_ms"].get<double>(), j["min_ms"].get<double>(),
                B / (j["median_ms"].get<double>() / 1e3), j["first_loss"].get<double>(),
                j["torch"].get<std::string>().c_str(), t, b);
    if (best.is_null() || j["median_ms"].get<double>() < best["median_ms"].get<double>()) best = j;
  }
  double tmed = best["median_ms"].get<double>();
  std::printf("  ratio dtlab/torch: %.3f against torch's fastest split (goal <= 1.0; same init, data and at most %d threads; first-loss diff %.2e)\n",
              med / tmed, threads, std::fabs(first_loss - best["first_loss"].get<double>()));
  return 0;
}
