// Feeds the bytes, as a .safetensors file, to load_safetensors_header and load_safetensors
// (engine/io/safetensors.h). Finding: anything but dtlab::Error, or an accepted file whose entries
// do not tile its data section, or whose header-only and full loads disagree.
#include "engine/io/safetensors.h"
#include "fuzz/fuzz_util.h"

using namespace dtlab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_temp("t.safetensors", data, size);
  SafetensorsFile header, full;
  const bool header_ok = fuzz::accepts([&] { header = load_safetensors_header(path); });
  const bool full_ok = fuzz::accepts([&] { full = load_safetensors(path); });
  fuzz::require(header_ok == full_ok, "the header-only and the full load disagree on the same file");
  if (!full_ok) return 0;
  fuzz::require(header.entries.size() == full.entries.size() && header.metadata == full.metadata && header.data.empty(),
                "the header-only load read a different header");
  int64_t pos = 0;
  for (const SafetensorsEntry& e : full.entries) {
    fuzz::require(e.begin == pos && e.begin <= e.end, "entries do not tile the data section in offset order");
    fuzz::require(full.find(e.name) != nullptr, "find() misses an entry");
    fuzz::require(e.end - e.begin == shape_numel(e.shape) * dtype_size(e.dtype), "an entry's bytes do not match its shape");
    pos = e.end;
  }
  fuzz::require(pos == static_cast<int64_t>(full.data.size()), "entries do not cover the data section");
  return 0;
}
