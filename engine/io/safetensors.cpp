#include "engine/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "engine/core/check.h"
#include "engine/io/atomic_file.h"

// Tensor bytes go to and from disk as they sit in memory, and the format is little-endian.
static_assert(std::endian::native == std::endian::little, "dtlab's safetensors I/O assumes a little-endian host");

namespace dtlab {
namespace {

using json = nlohmann::json;

// The reference implementation's cap: a bigger header means a corrupt length or another format.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

// Returns 0, errno, or -1 at an early end of file.
int read_all(int fd, void* buf, size_t n) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return -1;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return 0;
}

// ---- header parsing ----

bool get_int(const json& v, int64_t& out) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    return false;
  out = v.get<int64_t>();
  return true;
}

DType parse_dtype(const std::string& path, const std::string& name, const std::string& text) {
  if (text == "F32") return DType::F32;
  if (text == "I64") return DType::I64;
  static const char* const kOtherDtypes[] = {"F64",     "F16",     "BF16",    "I32",     "I16",
                                             "I8",      "U64",     "U32",     "U16",     "U8",
                                             "BOOL",    "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3",
                                             "F6_E3M2", "F4",      "C64"};
  for (const char* other : kOtherDtypes)
    if (text == other)
      fail_at(path, "tensor " + in_quotes(name) + " has dtype " + text +
                     ", which dtlab can't read; dtlab supports F32 and I64, so convert it first (e.g. "
                     "tensor.float() for weights)");
  fail_at(path, "tensor " + in_quotes(name) + " has unknown dtype " + in_quotes(text) +
                 "; supported dtypes are F32 and I64");
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& v,
                             int64_t data_size) {
  if (!v.is_object())
    fail_at(path, "entry " + in_quotes(name) + " is not an object; each tensor needs \"dtype\", \"shape\" and \"data_offsets\"");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key))
      fail_at(path, "tensor " + in_quotes(name) + " lacks \"" + key +
                     "\"; each tensor needs \"dtype\", \"shape\" and \"data_offsets\"");
  SafetensorsEntry e;
  e.name = name;

  const json& dt = v["dtype"];
  if (!dt.is_string()) fail_at(path, "tensor " + in_quotes(name) + " has a \"dtype\" that is not a string");

  const json& sh = v["shape"];
  bool shape_ok = sh.is_array();
  for (size_t i = 0; shape_ok && i < sh.size(); i++) {
    int64_t d = 0;
    shape_ok = get_int(sh[i], d);
    e.shape.push_back(d);
  }
  if (!shape_ok) fail_at(path, "tensor " + in_quotes(name) + " has a \"shape\" that is not a list of integers");

  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !get_int(off[0], e.begin) || !get_int(off[1], e.end) ||
      e.begin < 0 || e.end < 0)
    fail_at(path, "tensor " + in_quotes(name) + " has \"data_offsets\" that are not two non-negative integers [begin, end]");

  e.dtype = parse_dtype(path, name, dt.get<std::string>());
  int64_t nbytes = dtype_size(e.dtype);
  for (int64_t d : e.shape) {
    if (d < 0)
      fail_at(path, "tensor " + in_quotes(name) + " has a negative dimension in shape " + sh.dump() +
                     "; the header is corrupt");
    if (__builtin_mul_overflow(nbytes, d, &nbytes))
      fail_at(path, "tensor " + in_quotes(name) + " has shape " + sh.dump() + ", too large to address; the header is corrupt");
  }
  if (e.begin > e.end)
    fail_at(path, "tensor " + in_quotes(name) + " has data_offsets [" + std::to_string(e.begin) + ", " +
                   std::to_string(e.end) + "] with begin after end; they must be [begin, end] with begin <= end");
  if (e.end > data_size)
    fail_at(path, "tensor " + in_quotes(name) + " has offsets out of range: it ends at byte " + std::to_string(e.end) +
                   " but the data section holds " + std::to_string(data_size) + " bytes; file truncated?");
  if (e.end - e.begin != nbytes)
    fail_at(path, "tensor " + in_quotes(name) + " spans " + std::to_string(e.end - e.begin) + " bytes but shape " +
                   shape_str(e.shape) + " of " + dtype_name(e.dtype) + " needs " + std::to_string(nbytes) +
                   " bytes; the header is corrupt");
  return e;
}

void parse_metadata(const std::string& path, const json& v, std::map<std::string, std::string>& out) {
  if (!v.is_object()) fail_at(path, "\"__metadata__\" is not an object; it must map strings to strings");
  for (const auto& [key, val] : v.items()) {
    if (!val.is_string()) {
      const char* article = val.is_array() || val.is_object() ? "an " : "a ";
      fail_at(path, "\"__metadata__\" value for " + in_quotes(key) + " is " + article + val.type_name() +
                     ", not a string; safetensors metadata maps strings to strings");
    }
    out[key] = val.get<std::string>();
  }
}

SafetensorsFile parse_header(const std::string& path, const std::string& text, int64_t data_size) {
  // The reference library insists on '{' first; it also tells JSON apart from other binary files.
  if (text.empty() || text[0] != '{')
    fail_at(path, "header does not start with '{'; this is not a safetensors file");
  // json objects keep the last of duplicate keys; catch duplicates so no tensor silently vanishes.
  std::set<std::string> seen;
  std::string duplicate;
  json header;
  try {
    header = json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second)
        duplicate = parsed.get<std::string>();
      return true;
    });
  } catch (const json::exception& ex) {
    std::string why = ex.what();
    if (auto close = why.find("] "); why.starts_with("[json.exception") && close != std::string::npos)
      why = why.substr(close + 2);  // drop the library's "[json.exception.parse_error.101] " tag
    fail_at(path, "header is not valid JSON (" + why + "); the file is corrupt or not a safetensors file");
  }
  if (!header.is_object()) fail_at(path, "header JSON is not an object; this is not a safetensors file");
  if (!duplicate.empty())
    fail_at(path, "tensor name " + in_quotes(duplicate) + " appears twice in the header; the header is corrupt");

  SafetensorsFile file;
  for (const auto& [key, val] : header.items()) {
    if (key == "__metadata__")
      parse_metadata(path, val, file.metadata);
    else
      file.entries.push_back(parse_entry(path, key, val, data_size));
  }

  // Like the reference library: the entries must tile the data section exactly, in offset order.
  std::sort(file.entries.begin(), file.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  int64_t pos = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : file.entries) {
    if (e.begin < pos)
      fail_at(path, "tensors " + in_quotes(prev->name) + " and " + in_quotes(e.name) + " overlap in the data section (bytes " +
                     std::to_string(e.begin) + ".." + std::to_string(pos) + "); the header is corrupt");
    if (e.begin > pos)
      fail_at(path, "gap of " + std::to_string(e.begin - pos) + " bytes in the data section before tensor " +
                     in_quotes(e.name) + " (bytes " + std::to_string(pos) + ".." + std::to_string(e.begin) +
                     " belong to no tensor); the header is corrupt");
    pos = e.end;
    prev = &e;
  }
  if (pos != data_size)
    fail_at(path, "the tensors cover " + std::to_string(pos) + " of the " + std::to_string(data_size) +
                   " bytes in the data section; the file has trailing bytes or a corrupt header");
  return file;
}

SafetensorsFile read_file(const std::string& path, bool with_data) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once (and is refused below) instead of
  // waiting forever; a regular file reads the same either way.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.fd < 0) fail_at(path, "cannot open (" + os_reason(errno) + "); check the path and its permissions");
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) fail_at(path, "cannot stat (" + os_reason(errno) + ")");
  if (!S_ISREG(st.st_mode)) fail_at(path, "is not a regular file; pass the path of a .safetensors file");
  const int64_t size = st.st_size;
  if (size < 8)
    fail_at(path, "file is only " + std::to_string(size) +
                   " bytes, too short for a safetensors file (it starts with an 8-byte header length)");

  auto read_or_fail = [&](void* buf, size_t n) {
    int err = read_all(fd.fd, buf, n);
    if (err == -1) fail_at(path, "file ended early while reading; was it being written?");
    if (err != 0) fail_at(path, "read failed (" + os_reason(err) + ")");
  };
  uint8_t len_bytes[8];
  read_or_fail(len_bytes, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | len_bytes[i];
  if (n > kMaxHeaderBytes)
    fail_at(path, "header length " + std::to_string(n) +
                   " exceeds the 100 MB limit; the file is truncated or not a safetensors file");
  if (n > uint64_t(size - 8))
    fail_at(path, "header length " + std::to_string(n) + " is larger than the file (" + std::to_string(size) +
                   " bytes); the file is truncated or not a safetensors file");

  std::string text(n, '\0');
  read_or_fail(text.data(), n);
  const int64_t data_size = size - 8 - static_cast<int64_t>(n);
  SafetensorsFile file = parse_header(path, text, data_size);
  if (with_data) {
    file.data.resize(static_cast<size_t>(data_size));
    read_or_fail(file.data.data(), file.data.size());
  }
  return file;
}

}  // namespace

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  for (const SafetensorsEntry& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

SafetensorsFile load_safetensors(const std::string& path) { return read_file(path, true); }

SafetensorsFile load_safetensors_header(const std::string& path) { return read_file(path, false); }

void save_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the tensors in the caller's order (plain json would sort the keys).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::set<std::string> names;
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  for (const TensorView& t : tensors) {
    if (t.name == "__metadata__")
      fail_at(path, "cannot save a tensor named '__metadata__'; that key holds the file's metadata");
    if (!names.insert(t.name).second) fail_at(path, "cannot save two tensors named " + in_quotes(t.name));
    for (int64_t d : t.shape)
      if (d < 0) fail_at(path, "cannot save tensor " + in_quotes(t.name) + " with negative dimension in shape " + shape_str(t.shape));
    int64_t nbytes = shape_numel(t.shape) * dtype_size(t.dtype);
    DTLAB_CHECK(nbytes == 0 || t.data != nullptr, "TensorView '" + t.name + "' has no data pointer");
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = dtype_name(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + nbytes};
    header[t.name] = std::move(entry);
    sizes.push_back(nbytes);
    offset += nbytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception&) {
    fail_at(path, "cannot save: tensor names and metadata must be valid UTF-8");
  }
  // Spaces are JSON whitespace; padding puts the data section on an 8-byte boundary.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; i++) len_bytes[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));

  AtomicFile tmp(path);
  tmp.write(len_bytes, 8);
  tmp.write(text.data(), text.size());
  for (size_t i = 0; i < tensors.size(); i++)
    if (sizes[i] > 0) tmp.write(tensors[i].data, static_cast<size_t>(sizes[i]));
  tmp.commit();
}

}  // namespace dtlab
