#include "engine/train/nonfinite.h"

#include <cmath>
#include <vector>

#include "engine/core/device.h"

namespace dtlab {

namespace {

// Any non-finite among `n` floats of the model's device memory.
bool any_nonfinite(Device& dev, const float* p, int64_t n) {
  if (!p || n <= 0) return false;
  std::vector<float> host(static_cast<size_t>(n));
  dev.download(host.data(), p, n * static_cast<int64_t>(sizeof(float)));
  return has_nonfinite(host.data(), n);
}

std::string layer_name(const Model& model, int i) {
  const Layer& L = model.layer(i);
  if (L.kind == LayerKind::ReLU) return "layer " + std::to_string(L.seq_index) + " (ReLU)";
  return "layer " + std::to_string(L.seq_index) + " (Linear " + std::to_string(L.in_features) + "->" +
         std::to_string(L.out_features) + ")";
}

}  // namespace

bool has_nonfinite(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!std::isfinite(p[i])) return true;
  return false;
}

NonFiniteSite NonFiniteSite::decode(float code) {
  NonFiniteSite s;
  const int c = static_cast<int>(code);
  if (c <= 0) return s;
  s.kind = c / 65536;
  s.layer = c % 65536 - 1;
  return s;
}

NonFiniteSite find_nonfinite(const Model& model) {
  NonFiniteSite s;
  const int64_t B = model.batch();
  if (!model.last_input() || B <= 0) return s;
  Device& dev = model.device();
  dev.bind_thread();
  if (any_nonfinite(dev, model.last_input(), B * model.spec().in_features())) {
    s.kind = NonFiniteSite::Input;
    return s;
  }
  for (int i = 0; i < model.num_layers(); i++) {
    if (any_nonfinite(dev, model.layer_output(i), model.layer_output_rows(i) * model.layer(i).out_features)) {
      s.kind = NonFiniteSite::LayerOutput;
      s.layer = i;
      return s;
    }
  }
  s.kind = NonFiniteSite::Loss;
  return s;
}

std::string nonfinite_stop_message(int64_t step, double loss, int rank, const NonFiniteSite& site, const Model& model) {
  // Bad input stops the step whatever the loss came out as (a ReLU can zero an infinity whose
  // gradient is still NaN), so that sentence does not talk about the loss.
  if (site.kind == NonFiniteSite::Input)
    return "training stopped at step " + std::to_string(step) + (rank >= 0 ? " on rank " + std::to_string(rank) : std::string()) +
           ": its input batch holds non-finite values (NaN or infinity in the data); clean the data, or pass "
           "--allow-nonfinite to train on regardless";
  std::string msg = "training stopped at step " + std::to_string(step) + ": the loss became " +
                    (std::isnan(loss) ? std::string("nan") : loss > 0 ? std::string("inf") : std::string("-inf"));
  if (rank >= 0) msg += " on rank " + std::to_string(rank);
  const char* out = "; pass --allow-nonfinite to train on regardless";
  switch (site.kind) {
    case NonFiniteSite::LayerOutput:
      if (site.layer >= 0 && site.layer < model.num_layers())
        return msg + ", where " + layer_name(model, site.layer) +
               " is the first layer whose output is non-finite (its input was finite, so its parameters are non-finite or too large); "
               "lower --lr" + out;
      break;
    case NonFiniteSite::Loss:
      return msg + ", whose forward pass was finite (the loss overflowed, or an earlier micro-batch of the step went "
                   "non-finite); check the data and lower --lr" + out;
    default:
      break;
  }
  return msg + "; check the data and lower --lr" + out;
}

}  // namespace dtlab
