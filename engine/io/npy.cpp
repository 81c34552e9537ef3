#include "engine/io/npy.h"

#include "engine/io/atomic_file.h"

namespace dtlab {

void save_npy(const std::string& path, const float* data, const Shape& shape) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); i++) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // magic (6) + version (2) + header length (2) + header, padded with spaces to 64 bytes, then '\n'.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string prefix = "\x93NUMPY";
  prefix += '\x01';
  prefix += '\x00';
  prefix += static_cast<char>(header.size() & 0xff);
  prefix += static_cast<char>(header.size() >> 8);
  AtomicFile f(path);
  f.write(prefix.data(), prefix.size());
  f.write(header.data(), header.size());
  f.write(data, static_cast<size_t>(shape_numel(shape)) * sizeof(float));
  f.commit();
}

}  // namespace dtlab
