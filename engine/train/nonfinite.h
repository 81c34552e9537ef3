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

// Looks through `model`'s last forward on its device: the input batch, then each layer's output.
// A finite forward (the loss itself overflowed, or an earlier micro-batch of an accumulated step
// went bad) is Loss.
NonFiniteSite find_nonfinite(const Model& model);

// "training stopped at step 7: the loss became nan on rank 1, whose input batch holds non-finite
// values; ..." One sentence with a way out (the site says which: the data, or --lr).
std::string nonfinite_stop_message(int64_t step, double loss, int rank, const NonFiniteSite& site, const Model& model);

}  // namespace dtlab
