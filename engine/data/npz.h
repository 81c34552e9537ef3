// Loading datasets saved from Python: a .npz written by numpy.savez or numpy.savez_compressed with
// arrays x (float32, (N, D)) and y (int64, (N,)). The zip and .npy formats are parsed here (zlib
// only inflates), so errors can say exactly what is wrong and give the numpy line that fixes it.
#pragma once
#include <string>

#include "engine/data/dataset.h"

namespace dtlab {

// Error (one sentence starting with the path) for: a missing file, not a zip, missing x or y, a
// wrong dtype, rank or memory order, x/y length mismatch, negative labels, truncated or corrupt data,
// unsupported compression. num_classes = max(y) + 1; name = path.
// A .npz holding a 1-D integer array `tokens` (int64, int32 or uint16, as nanoGPT's prepare scripts
// write uint16) instead is token data for the GPT, cut into windows of `ctx` tokens (dataset.h);
// num_classes = max(token) + 1.
Dataset load_npz(const std::string& path, int64_t ctx = 0);

}  // namespace dtlab
