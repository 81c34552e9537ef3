// Writing .npy files (NumPy format 1.0), e.g. logits for comparison with PyTorch. Atomic.
#pragma once
#include <string>

#include "engine/core/tensor.h"

namespace dtlab {

void save_npy(const std::string& path, const float* data, const Shape& shape);

}  // namespace dtlab
