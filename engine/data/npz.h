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
Dataset load_npz(const std::string& path);

}  // namespace dtlab
