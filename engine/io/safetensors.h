// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON header ({"name": {"dtype", "shape", "data_offsets"}, "__metadata__"}),
// then the data section. Checkpoints (engine/io/checkpoint.h) sit on top; PyTorch reads the files
// with safetensors.torch.load_file. Loading validates like the reference library and every problem
// becomes one dtlab::Error sentence that starts with the path.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/tensor.h"

namespace dtlab {

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;  // shape_numel(shape) * dtype_size(dtype) bytes
};

// Header in the given tensor order, then "__metadata__" (left out when empty), padded with spaces
// so the data section starts on an 8-byte boundary; data laid out contiguously in the same order.
// Atomic: writes PATH.tmp.<pid>.<n>, fsyncs it, renames it over PATH and fsyncs the directory, so
// PATH is either the old file or the complete new one. Throws dtlab::Error (path and OS reason).
void save_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                      const std::map<std::string, std::string>& metadata);

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  int64_t begin = 0, end = 0;  // byte offsets in the data section
};

class SafetensorsFile {
 public:
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsEntry> entries;  // in offset order
  std::vector<uint8_t> data;              // the data section (empty after load_safetensors_header)

  const SafetensorsEntry* find(std::string_view name) const;  // null if absent
  // Not necessarily aligned for the dtype (the layout follows the writer's order): memcpy out.
  const void* bytes(const SafetensorsEntry& e) const { return data.data() + e.begin; }
};

// Reads and validates the whole file. Throws dtlab::Error naming the problem and the fix.
SafetensorsFile load_safetensors(const std::string& path);
// Same validation (offsets against the file size) but leaves `data` empty: cheap for big files.
SafetensorsFile load_safetensors_header(const std::string& path);

}  // namespace dtlab
