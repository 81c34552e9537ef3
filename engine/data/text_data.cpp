// Token data for the GPT: a UTF-8 text file as nanoGPT's data/shakespeare_char/prepare.py reads it
// (the vocabulary is the sorted set of its characters, each character one token).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <unistd.h>

#include "engine/core/check.h"
#include "engine/data/dataset.h"
#include "engine/io/atomic_file.h"

namespace dtlab {

namespace {

// The text that ships with dtlab, relative to the source tree.
constexpr const char* kShippedText = "data/shakespeare_sonnets.txt";

// The shipped text from the working directory, else beside the binary (build/bin/../../data).
std::string find_shipped_text() {
  std::error_code ec;
  if (std::filesystem::exists(kShippedText, ec)) return kShippedText;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    for (std::filesystem::path dir = std::filesystem::path(exe).parent_path(); !dir.empty() && dir != dir.parent_path();
         dir = dir.parent_path()) {
      const std::filesystem::path candidate = dir / kShippedText;
      if (std::filesystem::exists(candidate, ec)) return candidate.string();
    }
  }
  throw Error(std::string("--data text reads the shipped text, ") + kShippedText +
              ", which is neither under the working directory nor above the binary; run from the source tree or pass --data text:PATH");
}

}  // namespace

std::u32string utf8_to_code_points(const std::string& text, const std::string& what) {
  std::u32string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    bool ok = len > 0 && i + static_cast<size_t>(len) <= n;
    for (int k = 1; ok && k < len; k++) {
      ok = (s[i + static_cast<size_t>(k)] & 0xC0) == 0x80;
      cp = (cp << 6) | (s[i + static_cast<size_t>(k)] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8 either (Python refuses them too).
    static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (ok) ok = cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (!ok)
      throw Error(what + " is not UTF-8 text: byte " + std::to_string(i) + " starts no valid character; convert it (iconv -t UTF-8) or pass another file");
    out.push_back(cp);
    i += static_cast<size_t>(len);
  }
  return out;
}

std::string decode_tokens(const std::u32string& chars, const int32_t* tokens, int64_t n) {
  std::string out;
  for (int64_t i = 0; i < n; i++) {
    const char32_t c = tokens[i] >= 0 && static_cast<size_t>(tokens[i]) < chars.size() ? chars[static_cast<size_t>(tokens[i])] : U'\uFFFD';
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

Dataset make_text_dataset(const std::string& spec, int64_t ctx) {
  DTLAB_CHECK(ctx > 0, "make_text_dataset needs the window length");
  const std::string path = spec == "text" ? find_shipped_text() : spec.substr(5);
  if (path.empty()) throw Error("--data text: names no file; write --data text:PATH, or --data text for the shipped text");
  const std::string what = "--data " + spec;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error(what + ": " + path + " does not exist; check the path");
  if (std::filesystem::is_directory(path, ec)) throw Error(what + ": " + path + " is a directory, not a text file");
  if (const std::string why = not_a_regular_file(path); !why.empty()) throw Error(what + ": " + path + " " + why);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(what + ": " + path + " cannot be opened for reading");
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() > (size_t{1} << 30)) throw Error(what + ": " + path + " is over 1 GiB; tokenize it into a .npz of tokens instead");
  const std::u32string text = utf8_to_code_points(bytes, what);
  if (static_cast<int64_t>(text.size()) < ctx + 1)
    throw Error(what + " holds " + std::to_string(text.size()) + " characters, fewer than one window of ctx=" + std::to_string(ctx) +
                " plus its next character; use a longer text or a smaller ctx");
  Dataset ds;
  ds.name = spec == "text" ? "text:" + path : spec;
  ds.chars = text;
  std::sort(ds.chars.begin(), ds.chars.end());
  ds.chars.erase(std::unique(ds.chars.begin(), ds.chars.end()), ds.chars.end());
  ds.tokens.resize(text.size());
  for (size_t i = 0; i < text.size(); i++)
    ds.tokens[i] = static_cast<int32_t>(std::lower_bound(ds.chars.begin(), ds.chars.end(), text[i]) - ds.chars.begin());
  ds.ctx = ctx;
  ds.d = ctx;
  ds.n = (static_cast<int64_t>(ds.tokens.size()) - 1) / ctx;
  ds.num_classes = static_cast<int64_t>(ds.chars.size());
  return ds;
}

}  // namespace dtlab
