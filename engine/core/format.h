// Small text helpers shared by diagnoses, CLI output and views, so a size reads the same everywhere.
#pragma once
#include <cstdint>
#include <string>

namespace dtlab {

// "780 B", "16.0 KiB", "4.0 MiB", "1.25 GiB" (binary units, as torch and nvidia-smi print them).
std::string human_bytes(int64_t bytes);

}  // namespace dtlab
