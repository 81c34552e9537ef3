// Training stops when the loss becomes non-finite (NaN or infinity), unless the user asks to train
// on (--allow-nonfinite): a NaN in the data or an overflowing update otherwise trains silently on
// and saves a checkpoint of NaN parameters. The stop names the step, the rank whose loss went
// non-finite, and where on that rank the non-finite values first appear in the forward pass.
#pragma once
#include <cstdint>
#include <string>

#include "engine/core/model.h"

namespace dtlab {

// Where a rank's last forward pass first holds a non-finite value, in forward order. Encoded in one
// float (code()) so every rank of a world can learn every rank's finding in one all-reduce.
struct NonFiniteSite {
  enum Kind : int { None = 0, Input = 1, LayerOutput = 2, Loss = 3 };
  int kind = None;
  int layer = -1;  // LayerOutput: the layer's index in the model (a Sequential index for the names)
  float code() const { return static_cast<float>(kind * 65536 + layer + 1); }
  static NonFiniteSite decode(float code);
};

// Any NaN or infinity among n host floats.
bool has_nonfinite(const float* p, int64_t n);

// Looks through `model`'s last forward on its device: the input batch, then each layer's output.
// A finite forward (the loss itself overflowed, or an earlier micro-batch of an accumulated step
// went bad) is Loss.
NonFiniteSite find_nonfinite(const Model& model);

// "training stopped at step 7 on rank 1: its input batch holds non-finite values ...", or "training
// stopped at step 7: the loss became nan on rank 1, where layer 2 (Linear 64->64) is the first layer
// whose output is non-finite ...". One sentence with a way out (the data, or --lr).
std::string nonfinite_stop_message(int64_t step, double loss, int rank, const NonFiniteSite& site, const Model& model);

}  // namespace dtlab
