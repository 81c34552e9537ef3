#include "engine/data/npz.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <vector>

#include "engine/core/check.h"
#include "engine/io/atomic_file.h"

namespace dtlab {
namespace {

static_assert(std::endian::native == std::endian::little, "npz loading assumes a little-endian host");

constexpr uint32_t kSigLocal = 0x04034b50, kSigCentral = 0x02014b50, kSigEocd = 0x06054b50;
constexpr uint32_t kSigZip64Eocd = 0x06064b50, kSigZip64Locator = 0x07064b50;
constexpr uint32_t kMax32 = 0xFFFFFFFFu;

// Everything that goes wrong is reported as "<path>: <what>." so the user knows which file.
struct Npz {
  std::string path;
  std::string bytes;  // the whole file

  [[noreturn]] void fail(const std::string& what) const { throw Error(path + ": " + what + "."); }
  // For sentences whose subject is the file itself: "data.npz is truncated (...)."
  [[noreturn]] void fail_file(const std::string& what) const { throw Error(path + " " + what + "."); }

  uint64_t le(uint64_t off, int nbytes) const {
    if (off > bytes.size() || static_cast<uint64_t>(nbytes) > bytes.size() - off)
      fail_file("is truncated (a zip record runs past the end of the file)");
    uint64_t v = 0;
    for (int i = nbytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[off + i]);
    return v;
  }
};

struct ZipEntry {
  std::string name;
  uint16_t flags = 0, method = 0;
  uint32_t crc = 0;
  uint64_t comp_size = 0, size = 0, local_offset = 0;
};

// The End Of Central Directory record sits at the end, possibly followed by a comment, so it is
// found by scanning backwards; ZIP64 archives add a locator right before it.
std::vector<ZipEntry> read_central_directory(const Npz& z) {
  const std::string& b = z.bytes;
  int64_t eocd = -1;
  if (b.size() >= 22) {
    const int64_t last = static_cast<int64_t>(b.size()) - 22;
    for (int64_t pos = last; pos >= 0 && pos >= last - 65535; --pos)
      if (z.le(static_cast<uint64_t>(pos), 4) == kSigEocd) {
        eocd = pos;
        break;
      }
  }
  if (eocd < 0) {
    if (b.compare(0, 4, "PK\x03\x04") == 0)
      z.fail_file("is truncated (a zip archive whose directory at the end is missing)");
    if (b.compare(0, 6, "\x93NUMPY") == 0)
      z.fail_file("is a single .npy array, not a .npz; save x and y with np.savez(path, x=x, y=y)");
    z.fail_file("is not a .npz file (no zip directory found); write it with np.savez(path, x=x, y=y)");
  }
  const uint64_t e = static_cast<uint64_t>(eocd);
  uint64_t count = z.le(e + 10, 2), cd_size = z.le(e + 12, 4), cd_offset = z.le(e + 16, 4);
  if (e >= 20 && z.le(e - 20, 4) == kSigZip64Locator) {
    const uint64_t z64 = z.le(e - 20 + 8, 8);
    if (z.le(z64, 4) != kSigZip64Eocd) z.fail_file("is corrupt (bad ZIP64 directory record)");
    count = z.le(z64 + 32, 8);
    cd_size = z.le(z64 + 40, 8);
    cd_offset = z.le(z64 + 48, 8);
  }
  if (cd_offset > b.size() || cd_size > b.size() - cd_offset)
    z.fail_file("is truncated (its zip directory points past the end of the file)");

  std::vector<ZipEntry> entries;
  uint64_t p = cd_offset;
  for (uint64_t i = 0; i < count; ++i) {
    if (z.le(p, 4) != kSigCentral) z.fail_file("is corrupt (bad zip directory entry)");
    ZipEntry en;
    en.flags = static_cast<uint16_t>(z.le(p + 8, 2));
    en.method = static_cast<uint16_t>(z.le(p + 10, 2));
    en.crc = static_cast<uint32_t>(z.le(p + 16, 4));
    en.comp_size = z.le(p + 20, 4);
    en.size = z.le(p + 24, 4);
    const uint64_t name_len = z.le(p + 28, 2), extra_len = z.le(p + 30, 2), comment_len = z.le(p + 32, 2);
    en.local_offset = z.le(p + 42, 4);
    z.le(p + 46 + name_len + extra_len + comment_len - 1, 1);  // bounds check the variable part
    en.name = b.substr(p + 46, name_len);
    // ZIP64 extra field (id 1): 8-byte values for exactly the fields saturated at 0xFFFFFFFF, in order.
    for (uint64_t x = p + 46 + name_len, end = x + extra_len; x + 4 <= end;) {
      const uint64_t id = z.le(x, 2), len = z.le(x + 2, 2);
      if (id == 1) {
        uint64_t f = x + 4;
        if (en.size == kMax32) {
          en.size = z.le(f, 8);
          f += 8;
        }
        if (en.comp_size == kMax32) {
          en.comp_size = z.le(f, 8);
          f += 8;
        }
        if (en.local_offset == kMax32) en.local_offset = z.le(f, 8);
      }
      x += 4 + len;
    }
    entries.push_back(std::move(en));
    p += 46 + name_len + extra_len + comment_len;
  }
  return entries;
}

std::string extract(const Npz& z, const ZipEntry& en) {
  // Sizes come from the central directory: with force_zip64 the local header holds 0xFFFFFFFF.
  const uint64_t lo = en.local_offset;
  if (z.le(lo, 4) != kSigLocal) z.fail_file("is corrupt (bad zip header for " + en.name + ")");
  const uint64_t data = lo + 30 + z.le(lo + 26, 2) + z.le(lo + 28, 2);
  if (data > z.bytes.size() || en.comp_size > z.bytes.size() - data)
    z.fail_file("is truncated (" + en.name + " runs past the end of the file)");
  if (en.flags & 1) z.fail(en.name + " is encrypted; save the arrays with np.savez instead");
  const char* in = z.bytes.data() + data;
  std::string out;
  if (en.method == 0) {
    if (en.comp_size != en.size) z.fail_file("is corrupt (stored entry " + en.name + " has two sizes)");
    out.assign(in, en.size);
  } else if (en.method == 8) {
    if (en.size > en.comp_size * 1100 + 1024)  // deflate cannot expand more than ~1032x
      z.fail_file("is corrupt (impossible size for " + en.name + ")");
    out.resize(en.size);
    z_stream s{};
    if (inflateInit2(&s, -MAX_WBITS) != Z_OK) z.fail("could not start zlib to inflate " + en.name);
    uint64_t in_left = en.comp_size, out_left = en.size;
    s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in));
    s.next_out = reinterpret_cast<Bytef*>(out.data());
    int ret = Z_OK;
    while (ret == Z_OK) {
      // zlib counts in uInt, so feed buffers over 4 GiB in slices.
      if (s.avail_in == 0 && in_left > 0) {
        s.avail_in = static_cast<uInt>(std::min<uint64_t>(in_left, UINT_MAX));
        in_left -= s.avail_in;
      }
      if (s.avail_out == 0 && out_left > 0) {
        s.avail_out = static_cast<uInt>(std::min<uint64_t>(out_left, UINT_MAX));
        out_left -= s.avail_out;
      }
      ret = inflate(&s, Z_NO_FLUSH);
    }
    const bool complete = ret == Z_STREAM_END && s.avail_out == 0 && out_left == 0;
    inflateEnd(&s);
    if (!complete) z.fail_file("is corrupt or truncated (" + en.name + " does not inflate to its recorded size)");
  } else {
    z.fail(en.name + " uses zip compression method " + std::to_string(en.method) +
           ", but only stored (0) and deflate (8) are supported, as np.savez and np.savez_compressed write");
  }
  if (crc32_z(0, reinterpret_cast<const Bytef*>(out.data()), out.size()) != en.crc)
    z.fail_file("is corrupt (checksum mismatch in " + en.name + ")");
  return out;
}

struct Npy {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  std::string body;  // the raw data after the header
};

// The .npy header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }
class HeaderParser {
 public:
  HeaderParser(const Npz& z, const std::string& name, std::string_view text) : z_(z), name_(name), t_(text) {}

  Npy parse() {
    Npy npy;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (peek() != '}') {
      const std::string key = read_string();
      expect(':');
      if (key == "descr") {
        npy.descr = peek() == '[' ? read_bracketed() : read_string();  // '[' is a structured dtype
        have_descr = true;
      } else if (key == "fortran_order") {
        npy.fortran_order = read_bool();
        have_order = true;
      } else if (key == "shape") {
        npy.shape = read_shape();
        have_shape = true;
      } else {
        bad();
      }
      if (peek() == ',') ++i_;
    }
    if (!have_descr || !have_order || !have_shape) bad();
    return npy;
  }

 private:
  [[noreturn]] void bad() const { z_.fail(name_ + " has a .npy header dtlab cannot read"); }
  char peek() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n')) ++i_;
    if (i_ >= t_.size()) bad();
    return t_[i_];
  }
  void expect(char c) {
    if (peek() != c) bad();
    ++i_;
  }
  std::string read_string() {
    const char q = peek();
    if (q != '\'' && q != '"') bad();
    const size_t end = t_.find(q, i_ + 1);
    if (end == std::string_view::npos) bad();
    std::string s(t_.substr(i_ + 1, end - i_ - 1));
    i_ = end + 1;
    return s;
  }
  std::string read_bracketed() {
    const size_t start = i_;
    for (int depth = 0; i_ < t_.size(); ++i_) {
      depth += t_[i_] == '[' ? 1 : t_[i_] == ']' ? -1 : 0;
      if (depth == 0) return std::string(t_.substr(start, ++i_ - start));
    }
    bad();
  }
  bool read_bool() {
    peek();
    for (bool v : {true, false}) {
      const std::string_view word = v ? "True" : "False";
      if (t_.substr(i_, word.size()) == word) {
        i_ += word.size();
        return v;
      }
    }
    bad();
  }
  std::vector<int64_t> read_shape() {
    std::vector<int64_t> shape;
    expect('(');
    while (peek() != ')') {
      if (t_[i_] < '0' || t_[i_] > '9') bad();
      int64_t v = 0;
      for (; i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9'; ++i_) {
        if (v > (INT64_MAX - 9) / 10) bad();
        v = v * 10 + (t_[i_] - '0');
      }
      if (i_ < t_.size() && t_[i_] == 'L') ++i_;  // Python 2 long suffix in old files
      shape.push_back(v);
      if (peek() == ',') ++i_;
    }
    ++i_;
    return shape;
  }

  const Npz& z_;
  const std::string& name_;
  std::string_view t_;
  size_t i_ = 0;
};

Npy parse_npy(const Npz& z, const std::string& name, std::string bytes) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    z.fail(name + " is not a .npy array");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) z.fail(name + " is truncated");
    for (int i = 3; i >= 0; --i) header_len = header_len << 8 | static_cast<unsigned char>(bytes[8 + i]);
    start = 12;
  } else {
    z.fail(name + " uses .npy format version " + std::to_string(major) + ", but only 1.0 to 3.0 are known");
  }
  if (header_len > bytes.size() - start) z.fail(name + " is truncated (inside its header)");
  Npy npy = HeaderParser(z, name, std::string_view(bytes).substr(start, header_len)).parse();
  npy.body = bytes.substr(start + header_len);
  return npy;
}

// "<f8" -> "float64 (<f8)", ">f4" -> "big-endian float32 (>f4)"
std::string describe_dtype(const std::string& descr) {
  if (descr.size() < 2 || descr[0] == '[') return descr;
  const char kind = descr[1];
  const std::string size = descr.substr(2);
  std::string name;
  if (kind == 'f' || kind == 'i' || kind == 'u' || kind == 'c') {
    // An item size numpy never writes ('<f999999999') is shown as written, not multiplied into an overflow.
    int bytes = 0;
    const auto [end, ec] = std::from_chars(size.data(), size.data() + size.size(), bytes);
    if (ec != std::errc() || end != size.data() + size.size() || bytes < 1 || bytes > 64) return descr;
    name = (kind == 'f' ? "float" : kind == 'i' ? "int" : kind == 'u' ? "uint" : "complex") + std::to_string(bytes * 8);
  } else if (kind == 'b') {
    name = "bool";
  } else if (kind == 'O') {
    name = "object";
  } else if (kind == 'U' || kind == 'S') {
    name = "string";
  } else {
    return descr;
  }
  if (descr[0] == '>') name = "big-endian " + name;
  return name + " (" + descr + ")";
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// Checks dtype, memory order and that the body holds every value the shape promises.
void check_array(const Npz& z, const char* var, const Npy& a, const char* descr, const char* np_type) {
  if (a.descr != descr)
    z.fail(std::string(var) + " has dtype " + describe_dtype(a.descr) + "; save it with " + var +
           ".astype(np." + np_type + ")");
  if (a.fortran_order)
    z.fail(std::string(var) + " is stored in Fortran order; save np.ascontiguousarray(" + var + ") instead");
  uint64_t count = 1;
  for (int64_t d : a.shape) {
    if (d != 0 && count > (uint64_t{1} << 60) / static_cast<uint64_t>(d)) z.fail(std::string(var) + " is too large");
    count *= static_cast<uint64_t>(d);
  }
  const uint64_t need = count * (std::string(descr) == "<f4" ? 4 : 8);
  if (a.body.size() < need)
    z.fail(std::string(var) + " is truncated: its shape " + shape_text(a.shape) + " needs " +
           std::to_string(need) + " bytes but only " + std::to_string(a.body.size()) + " are stored");
}

// Token data: a 1-D integer array, windows of ctx tokens.
Dataset load_tokens(const Npz& z, const Npy& t, int64_t ctx) {
  const std::string d = t.descr;
  const int width = d == "<i8" ? 8 : d == "<i4" ? 4 : d == "<u2" ? 2 : 0;
  if (width == 0) z.fail("tokens has dtype " + describe_dtype(t.descr) + "; save it with tokens.astype(np.int64) (or int32, uint16)");
  if (t.fortran_order || t.shape.size() != 1)
    z.fail("tokens has shape " + shape_text(t.shape) + " but must be 1-D; save tokens.reshape(-1)");
  const uint64_t count = static_cast<uint64_t>(t.shape[0]);
  if (count > (uint64_t{1} << 31)) z.fail("tokens holds more than 2^31 tokens; dtlab reads up to 2^31");
  if (t.body.size() < count * static_cast<uint64_t>(width))
    z.fail("tokens is truncated: its shape " + shape_text(t.shape) + " needs " + std::to_string(count * static_cast<uint64_t>(width)) +
           " bytes but only " + std::to_string(t.body.size()) + " are stored");
  if (ctx <= 0) z.fail("holds tokens, which only a --model gpt reads; pass --model gpt:... or a .npz with x and y");
  if (static_cast<int64_t>(count) < ctx + 1)
    z.fail("tokens holds " + std::to_string(count) + " tokens, fewer than one window of ctx=" + std::to_string(ctx) + " plus its next token");
  Dataset ds;
  ds.name = z.path;
  ds.tokens.resize(count);
  int64_t max_token = 0;
  for (size_t i = 0; i < count; i++) {
    int64_t v = 0;
    if (width == 8) std::memcpy(&v, t.body.data() + i * 8, 8);
    else if (width == 4) { int32_t w; std::memcpy(&w, t.body.data() + i * 4, 4); v = w; }
    else { uint16_t w; std::memcpy(&w, t.body.data() + i * 2, 2); v = w; }
    if (v < 0 || v > (int64_t{1} << 24))
      z.fail("tokens[" + std::to_string(i) + "] is " + std::to_string(v) + "; token ids must lie in 0..16777216");
    ds.tokens[i] = static_cast<int32_t>(v);
    max_token = std::max(max_token, v);
  }
  ds.ctx = ctx;
  ds.d = ctx;
  ds.n = (static_cast<int64_t>(count) - 1) / ctx;
  ds.num_classes = max_token + 1;
  return ds;
}

}  // namespace

Dataset load_npz(const std::string& path, int64_t ctx) {
  Npz z{path, {}};
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    const bool relative = std::filesystem::path(path).is_relative();
    z.fail_file(std::string("does not exist") +
                (relative ? " (relative to " + std::filesystem::current_path(ec).string() + ")" : "") +
                "; check the path, or use the built-in data (--data text for a GPT, spiral or blobs for an MLP)");
  }
  if (std::filesystem::is_directory(path, ec)) z.fail_file("is a directory, not a .npz file");
  if (const std::string why = not_a_regular_file(path); !why.empty()) z.fail_file(why);
  std::ifstream f(path, std::ios::binary);
  if (!f) z.fail_file("cannot be opened for reading");
  z.bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());

  const std::vector<ZipEntry> entries = read_central_directory(z);
  const ZipEntry* ex = nullptr;
  const ZipEntry* ey = nullptr;
  const ZipEntry* et = nullptr;
  std::string names;
  for (const ZipEntry& en : entries) {
    for (auto [want, found] : {std::pair{"x.npy", &ex}, std::pair{"y.npy", &ey}, std::pair{"tokens.npy", &et}}) {
      if (en.name != want) continue;
      // Two members of one name: np.load would take the last, a zip tool the first; neither is safe.
      if (*found)
        z.fail_file(std::string("holds two arrays named ") + want[0] + "; save it once with np.savez(path, x=x, y=y)");
      *found = &en;
    }
    const bool npy = en.name.size() > 4 && en.name.ends_with(".npy");
    names += (names.empty() ? "" : ", ") + (npy ? en.name.substr(0, en.name.size() - 4) : en.name);
  }
  if (et && !ex) return load_tokens(z, parse_npy(z, "tokens.npy", extract(z, *et)), ctx);
  if (!ex || !ey)
    z.fail_file(std::string("has no array named ") + (!ex ? "x" : "y") + " (it holds: " +
           (names.empty() ? "nothing" : names) + "); save it with np.savez(path, x=x, y=y), or np.savez(path, tokens=ids) for a --model gpt");

  const Npy x = parse_npy(z, "x.npy", extract(z, *ex));
  const Npy y = parse_npy(z, "y.npy", extract(z, *ey));
  check_array(z, "x", x, "<f4", "float32");
  check_array(z, "y", y, "<i8", "int64");
  if (x.shape.size() != 2)
    z.fail("x has shape " + shape_text(x.shape) + " but must be 2-D (N, D); save x.reshape(len(x), -1)");
  if (y.shape.size() != 1)
    z.fail("y has shape " + shape_text(y.shape) + " but must be 1-D (N,); save y.reshape(-1)");
  if (x.shape[0] != y.shape[0])
    z.fail("x has " + std::to_string(x.shape[0]) + " rows but y has " + std::to_string(y.shape[0]) +
           " labels; they must match");
  if (x.shape[0] == 0 || x.shape[1] == 0) z.fail("x is empty (shape " + shape_text(x.shape) + ")");

  Dataset ds;
  ds.name = path;
  ds.n = x.shape[0];
  ds.d = x.shape[1];
  ds.x.resize(static_cast<size_t>(ds.n * ds.d));
  ds.y.resize(static_cast<size_t>(ds.n));
  std::memcpy(ds.x.data(), x.body.data(), ds.x.size() * sizeof(float));
  std::memcpy(ds.y.data(), y.body.data(), ds.y.size() * sizeof(int64_t));
  int64_t max_label = -1;
  for (size_t i = 0; i < ds.y.size(); ++i) {
    if (ds.y[i] < 0)
      z.fail("y[" + std::to_string(i) + "] is " + std::to_string(ds.y[i]) +
             "; labels must be class indices 0..K-1");
    max_label = std::max(max_label, ds.y[i]);
  }
  ds.num_classes = max_label + 1;
  return ds;
}

}  // namespace dtlab
