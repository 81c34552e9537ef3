#include "engine/io/sharded_checkpoint.h"

#include <fcntl.h>  // renameat2, RENAME_EXCHANGE (glibc 2.28+, with _GNU_SOURCE, which g++ and clang++ define)
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <tuple>
#include <nlohmann/json.hpp>

#include "engine/core/check.h"
#include "engine/io/atomic_file.h"
#include "engine/io/safetensors.h"

namespace dtlab {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kIndex = "index.json";
constexpr const char* kFormat = "dtlab-sharded";
// 2: pieces may carry a box in the full tensor (tensor parallelism). An index without "version" is 1.
constexpr int kVersion = 2;

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

std::string piece_name(const std::string& param, int64_t offset) { return param + "@" + std::to_string(offset); }

// The index, parsed and checked for shape (not yet against a model).
struct Index {
  std::map<std::string, std::string> metadata;  // step, model, world, strategy, format, LoRA's rank and alpha
  json params;
  int version = 1;
};

Index read_index(const std::string& dir) {
  const std::string path = join(dir, kIndex);
  if (!fs::is_directory(dir)) fail_at(dir, "is not a directory holding a sharded checkpoint");
  if (const std::string why = not_a_regular_file(path); !why.empty()) fail_at(path, why + "; the checkpoint is corrupt");
  std::ifstream in(path);
  if (!in)
    fail_at(dir, "has no index.json, so it is not a complete sharded checkpoint (was its save interrupted?); "
              "save it again with --save-sharded");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail_at(path, std::string("is not valid JSON (") + e.what() + "); the checkpoint is corrupt");
  }
  // Compared as JSON: a "format" that is not a string (a number, null) is another file, not a type error.
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat)
    fail_at(path, std::string("is not a dtlab sharded checkpoint index (\"format\" must be \"") + kFormat + "\")");
  Index idx;
  if (j.contains("version")) {
    // A newer writer's index may place pieces in ways this reader would misread: refused whole.
    const json& v = j["version"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kVersion)
      fail_at(path, "has index version " + v.dump().substr(0, 40) + ", which this dtlab does not read (it reads 1 to " +
                        std::to_string(kVersion) + "); load it with the dtlab that saved it");
    idx.version = static_cast<int>(v.get<int64_t>());
  }
  for (const char* key : {"format", "step", "model", "moe", "world", "strategy", "lora_rank", "lora_alpha"}) {
    if (!j.contains(key)) continue;
    const json& v = j[key];
    idx.metadata[key] = v.is_string() ? v.get<std::string>() : v.dump();
  }
  if (!j.contains("params") || !j["params"].is_object()) fail_at(path, "has no \"params\" object; the checkpoint is corrupt");
  idx.params = j["params"];
  return idx;
}

}  // namespace

std::string shard_file_name(int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank-%05d-of-%05d.safetensors", rank, world);
  return buf;
}

bool is_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

namespace {

// DIR without trailing slashes ("ckpt/" -> "ckpt"), so its name and parent are what they look like.
fs::path checkpoint_path(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

// Where a save of DIR is written before the swap: ".NAME.saving" beside it (every rank derives the
// same name, also in separate processes).
fs::path staging_path(const fs::path& target) {
  return target.parent_path() / ("." + target.filename().string() + ".saving");
}

// The names a sharded checkpoint's directory holds: index.json, rank files, and the temp files of
// their atomic writes.
bool is_checkpoint_file(const std::string& name) {
  static const std::regex re(R"((index\.json|rank-\d{5}-of-\d{5}\.safetensors)(\.tmp\.\d+\.\d+)?)");
  return std::regex_match(name, re);
}

void sync_directory(const fs::path& dir) {
  const std::string d = dir.empty() ? "." : dir.string();
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Puts the complete checkpoint at `staging` in place of `target`. With an old checkpoint there, the
// two directories are exchanged atomically (renameat2 RENAME_EXCHANGE), so DIR is always one
// complete checkpoint; a filesystem without the exchange gets two renames with the old one kept
// aside as .NAME.old until the new one is in place.
void swap_into_place(const fs::path& staging, const fs::path& target) {
  std::error_code ec;
  if (!fs::exists(target, ec)) {
    if (::rename(staging.c_str(), target.c_str()) != 0)
      fail_at(target.string(), std::string("cannot save: renaming ") + staging.string() + " into place failed (" +
                                std::strerror(errno) + ")");
  } else if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(staging, ec);  // now the old checkpoint
  } else {
    const fs::path old = target.parent_path() / ("." + target.filename().string() + ".old");
    fs::remove_all(old, ec);
    if (::rename(target.c_str(), old.c_str()) != 0 || ::rename(staging.c_str(), target.c_str()) != 0)
      fail_at(target.string(), std::string("cannot save: moving the new checkpoint into place failed (") + std::strerror(errno) +
                                "); the new one is in " + staging.string() + " and the last one in " + old.string());
    fs::remove_all(old, ec);
  }
  sync_directory(target.parent_path());
}

}  // namespace

void check_sharded_output_dir(const std::string& flag, const std::string& dir) {
  std::error_code ec;
  const fs::path target = checkpoint_path(dir);
  if (fs::exists(target, ec) && !fs::is_directory(target, ec))
    throw Error(flag + " " + dir + " is a file; give a directory (it is created if missing)");
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  if (!fs::is_directory(parent, ec))
    throw Error(flag + " " + dir + ": directory " + parent.string() + " does not exist; create it first");
  if (::access(parent.c_str(), W_OK) != 0)
    throw Error(flag + " " + dir + ": directory " + parent.string() + " is not writable (" + std::strerror(errno) + ")");
  // The save replaces the whole directory: it may only hold a sharded checkpoint's files.
  if (!fs::is_directory(target, ec)) return;
  for (fs::directory_iterator it(target, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!is_checkpoint_file(name))
      throw Error(flag + " " + dir + " holds " + name + ", which is not part of a sharded checkpoint, and the save replaces the "
                  "whole directory; give an empty or new directory");
  }
}

namespace {

// Where one of the model's parameters goes in a sharded checkpoint: the name and FULL shape the
// index lists, and the boxes this rank's values fill there. A box covers the elements
// [local_begin, local_end) of this rank's parameter (row-major); its offsets and sizes are empty when
// it is the whole tensor. Most parameters have one box; a GPT shard's c_attn has three (its heads'
// rows of q, k and v), written as the pieces "NAME#0@...", "NAME#1@..." and "NAME#2@...".
struct SavedBox {
  Shape offsets, sizes;
  int64_t local_begin = 0, local_end = 0;
  bool held_lower = false;  // a lower TP rank holds the same box (a replicated piece): it writes it
};
struct SavedParam {
  std::string name;
  Shape shape;
  std::vector<SavedBox> boxes;
};

std::vector<SavedParam> saved_params(const Model& model) {
  const auto& params = model.parameters();
  // peft's names under LoRA, as the full save writes them (save_lora_checkpoint).
  const std::string prefix = model.lora() ? "base_model.model." : "";
  std::vector<SavedParam> out;
  for (const Parameter& p : params) out.push_back({prefix + p.name, p.shape, {SavedBox{{}, {}, 0, p.numel, false}}});
  const TensorParallelSpec& tp = model.tensor_parallel();
  if (tp.degree == 1) return out;
  // A TP shard's parameters are pieces of the full ones: tp_pieces says which rows and columns of
  // which block of rows (a bias is (out, 1) there, a 1-D tensor here).
  std::vector<std::vector<std::vector<TpPiece>>> of_rank(static_cast<size_t>(tp.degree));  // [rank][param] -> pieces
  for (int t = 0; t < tp.degree; t++) {
    of_rank[static_cast<size_t>(t)].resize(params.size());
    for (const TpPiece& q : tp_pieces(model, t)) of_rank[static_cast<size_t>(t)].at(static_cast<size_t>(q.param)).push_back(q);
  }
  for (size_t i = 0; i < out.size(); i++) {
    const std::vector<TpPiece>& mine = of_rank[static_cast<size_t>(tp.rank)][i];
    DTLAB_CHECK(!mine.empty(), "a tensor-parallel shard's parameter has no piece");
    const size_t dims = params[i].shape.size();
    const int64_t base = mine.front().full_offset, cols = mine.front().cols;
    // The box of piece q in the full tensor: its block of rows starts (full_offset - base) / cols down.
    const auto box = [&](const TpPiece& q) {
      const int64_t row0 = (q.full_offset - base) / cols;
      Shape at{row0 + q.row_begin}, size{q.row_end - q.row_begin};
      if (dims == 2) at.push_back(q.col_begin), size.push_back(q.col_end - q.col_begin);
      return std::make_pair(at, size);
    };
    int64_t rows = 0;
    for (const TpPiece& q : mine) rows = std::max(rows, (q.full_offset - base) / cols + q.rows);
    out[i].shape = dims == 2 ? Shape{rows, cols} : Shape{rows};
    out[i].boxes.clear();
    for (const TpPiece& q : mine) {
      SavedBox b;
      std::tie(b.offsets, b.sizes) = box(q);
      b.local_begin = q.local_offset - params[i].offset;
      b.local_end = b.local_begin + (q.row_end - q.row_begin) * (q.col_end - q.col_begin);
      // (Under --ep an expert is whole on its rank and the TP ranks may hold different ones: which of
      // its holders writes it is the caller's choice, params_this_rank_writes.)
      const bool expert = model.spec().gpt.moe.ep > 1 && params[i].name.find(".mlp.experts.") != std::string::npos;
      for (int t = 0; t < tp.rank && !expert; t++)
        for (const TpPiece& o : of_rank[static_cast<size_t>(t)][i]) b.held_lower |= box(o) == box(q);
      if (b.sizes == out[i].shape) b.offsets.clear(), b.sizes.clear();  // whole: no box
      out[i].boxes.push_back(std::move(b));
    }
  }
  return out;
}

}  // namespace

std::vector<int> dedup_replicated_params(const std::vector<int64_t>& bytes, int replicas) {
  std::vector<int> owner(bytes.size(), 0);
  std::vector<int64_t> planned(static_cast<size_t>(std::max(replicas, 1)), 0);
  for (size_t k = 0; k < bytes.size(); k++) {
    const auto least = std::min_element(planned.begin(), planned.end());  // the first of the smallest: the lowest rank
    owner[k] = static_cast<int>(least - planned.begin());
    *least += std::max<int64_t>(bytes[k], 1);
  }
  return owner;
}

std::vector<bool> params_this_rank_writes(const std::vector<int64_t>& bytes, const std::vector<bool>& expert, int replicas, int replica,
                                          int expert_replicas, int expert_replica) {
  std::vector<bool> writes(bytes.size(), false);
  for (const bool experts : {false, true}) {
    std::vector<int64_t> kind;
    std::vector<size_t> at;
    for (size_t k = 0; k < bytes.size(); k++)
      if (expert[k] == experts) {
        kind.push_back(bytes[k]);
        at.push_back(k);
      }
    const std::vector<int> owner = dedup_replicated_params(kind, experts ? expert_replicas : replicas);
    for (size_t i = 0; i < at.size(); i++) writes[at[i]] = owner[i] == (experts ? expert_replica : replica);
  }
  return writes;
}

void save_sharded_checkpoint(const std::string& dir, const Model& model, const std::vector<ParamSlice>& given,
                             const SaveGroup& group, int64_t step, const std::string& strategy) {
  save_sharded_checkpoint(dir, {SavedPart{&model, given}}, group, step, strategy);
}

void save_sharded_checkpoint(const std::string& dir, const std::vector<SavedPart>& parts, const SaveGroup& group, int64_t step,
                             const std::string& strategy) {
  DTLAB_CHECK(!parts.empty() && parts.front().model, "a sharded save needs the rank's model");
  const Model& model = *parts.front().model;  // the run's spec and LoRA settings (every part shares them)
  const int rank = group.rank, world = group.world;
  // Each slice cut at its parameter's boxes; a piece the TP group holds whole on several ranks is
  // written by the lowest only: each element of the full tensor lies in exactly one piece, which the
  // loader checks.
  struct Cut {
    ParamSlice slice;  // offset: within the box
    std::string name;  // the parameter's, with "#j" when it has several boxes
    const SavedBox* box;
    const Model* model;
  };
  std::vector<std::vector<SavedParam>> saved;
  saved.reserve(parts.size());
  std::vector<Cut> slices;
  json shapes = json::object();  // the FULL shape of each parameter this rank writes, for rank 0's index
  for (const SavedPart& part : parts) {
    saved.push_back(saved_params(*part.model));
    for (const ParamSlice& s : part.slices) {
      const SavedParam& sp = saved.back()[static_cast<size_t>(s.param)];
      for (size_t j = 0; j < sp.boxes.size(); j++) {
        const SavedBox& b = sp.boxes[j];
        const int64_t begin = std::max(s.offset, b.local_begin), end = std::min(s.offset + s.length, b.local_end);
        if (begin >= end || b.held_lower) continue;
        slices.push_back({ParamSlice{s.param, begin - b.local_begin, end - begin, s.data + (begin - s.offset)},
                          sp.boxes.size() > 1 ? sp.name + "#" + std::to_string(j) : sp.name, &b, part.model});
        shapes[sp.name] = sp.shape;
      }
    }
  }
  // Everything is written into a staging directory beside DIR and swapped in at the end: an
  // interrupted save leaves the last good checkpoint where it was (and its staging directory,
  // which the next save replaces).
  const fs::path target = checkpoint_path(dir);
  const fs::path staging_dir = staging_path(target);
  const std::string staging = staging_dir.string();
  if (rank == 0) {
    check_sharded_output_dir("--save-sharded", dir);
    std::error_code ec;
    fs::remove_all(staging_dir, ec);  // a save interrupted before
    fs::create_directory(staging_dir, ec);
    if (ec) fail_at(staging, "cannot be created (" + ec.message() + "); choose a writable --save-sharded directory");
  }
  group.barrier();
  if (!slices.empty()) {
    // Slices on a device are written from host copies.
    std::vector<std::vector<float>> host(slices.size());
    std::vector<TensorView> views;
    json boxes = json::object();  // the pieces' boxes, for rank 0's index
    for (size_t i = 0; i < slices.size(); i++) {
      const ParamSlice& s = slices[i].slice;
      const float* data = s.data;
      Device& dev = slices[i].model->device();
      if (!dev.is_host()) {
        host[i].resize(static_cast<size_t>(s.length));
        dev.download(host[i].data(), s.data, s.length * static_cast<int64_t>(sizeof(float)));
        data = host[i].data();
      }
      const SavedBox& b = *slices[i].box;
      views.push_back({piece_name(slices[i].name, s.offset), DType::F32, {s.length}, data});
      if (!b.sizes.empty()) boxes[views.back().name] = {{"offsets", b.offsets}, {"sizes", b.sizes}};
    }
    std::map<std::string, std::string> meta = {
        {"format", kFormat}, {"rank", std::to_string(rank)}, {"world", std::to_string(world)}, {"shapes", shapes.dump()}};
    if (!boxes.empty()) meta["boxes"] = boxes.dump();
    save_safetensors(join(staging, shard_file_name(rank, world)), views, meta);
  }
  group.barrier();
  if (rank == 0) {
    // The index lists the parameters and pieces every rank wrote (read back from the files' headers:
    // a pipeline's ranks each hold other stages' parameters).
    json ps = json::object();
    for (int r = 0; r < world; r++) {
      const std::string file = shard_file_name(r, world);
      if (!fs::exists(join(staging, file))) continue;  // a rank that owns nothing (HYBRID_SHARD's copies)
      const SafetensorsFile header = load_safetensors_header(join(staging, file));
      const auto b = header.metadata.find("boxes");
      const json boxes = b == header.metadata.end() ? json::object() : json::parse(b->second);
      const auto sh = header.metadata.find("shapes");
      const json shapes_of = sh == header.metadata.end() ? json::object() : json::parse(sh->second);
      for (const auto& [name, shape] : shapes_of.items())
        if (!ps.contains(name)) ps[name] = {{"shape", shape}, {"pieces", json::array()}};
      for (const SafetensorsEntry& e : header.entries) {
        const size_t at = e.name.rfind('@');
        const std::string name = e.name.substr(0, std::min(at, e.name.find('#')));  // "NAME#j@k": box j of NAME
        json piece = {{"file", file}, {"tensor", e.name}, {"offset", std::stoll(e.name.substr(at + 1))}, {"length", e.shape.at(0)}};
        if (boxes.contains(e.name)) piece["box"] = boxes[e.name];
        ps[name]["pieces"].push_back(piece);
      }
    }
    json j = {{"format", kFormat}, {"version", kVersion}, {"step", step},         {"model", model.spec().str()},
              {"world", world},    {"strategy", strategy}, {"params", ps}};
    if (model.lora())  // the metadata the full adapter file carries
      for (const auto& [key, value] : lora_metadata(model.lora_spec())) j[key] = value;
    if (model.spec().is_gpt() && model.spec().gpt.moe.on()) j["moe"] = model.spec().gpt.moe.str();  // --moe, which "model" leaves out
    const std::string text = j.dump(1) + "\n";
    AtomicFile f(join(staging, kIndex));
    f.write(text.data(), text.size());
    f.commit();
    swap_into_place(staging_dir, target);
  }
  group.barrier();  // nobody reads the directory before the new checkpoint is in place
}

CheckpointInfo read_sharded_checkpoint_info(const std::string& dir) {
  Index idx = read_index(dir);
  return checkpoint_info_from(join(dir, kIndex), idx.metadata);
}

namespace {

CheckpointInfo load_sharded(const std::string& dir, Model& model);
std::vector<FullTensor> read_tensors(const std::string& dir, CheckpointInfo* info);

// Any entry of index.json of the wrong JSON type (a piece that is not an object, a file name that is
// a number) is the corrupt-checkpoint sentence, not an internal error.
template <typename F>
auto corrupt_entries_fail(const std::string& dir, F&& f) {
  try {
    return f();
  } catch (const json::exception& e) {
    fail_at(join(dir, kIndex), std::string("has an entry of the wrong kind (") + e.what() + "); the checkpoint is corrupt");
  }
}

}  // namespace

CheckpointInfo load_sharded_checkpoint(const std::string& dir, Model& model) {
  return corrupt_entries_fail(dir, [&] { return load_sharded(dir, model); });
}

std::vector<FullTensor> read_sharded_tensors(const std::string& dir, CheckpointInfo* info) {
  return corrupt_entries_fail(dir, [&] { return read_tensors(dir, info); });
}

void consolidate_sharded_checkpoint(const std::string& dir, const std::string& path) {
  CheckpointInfo info;
  const std::vector<FullTensor> tensors = read_sharded_tensors(dir, &info);
  // The full save's metadata: a "dtlab" file of the same step and model (and LoRA's rank and alpha).
  std::map<std::string, std::string> metadata = info.metadata;
  metadata["format"] = "dtlab";
  std::vector<TensorView> views;
  for (const FullTensor& t : tensors) views.push_back({t.name, DType::F32, t.shape, t.values.data()});
  save_safetensors(path, views, metadata);
}

namespace {

// The shape index.json gives `name`, checked to be a list of whole numbers.
Shape index_shape(const std::string& index_path, const std::string& name, const json& jp) {
  if (!jp.contains("shape") || !jp["shape"].is_array())
    fail_at(index_path, "'" + name + "' has no shape list; the checkpoint is corrupt");
  Shape shape;
  for (const json& d : jp["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      fail_at(index_path, "'" + name + "' has a shape that is not a list of whole numbers; the checkpoint is corrupt");
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// A piece's box in the full tensor of `shape`: the whole tensor without "box" (version 1's only kind).
void piece_box(const std::string& index_path, const std::string& name, const json& piece, const Shape& shape, int version,
               Shape& offsets, Shape& sizes) {
  offsets.assign(shape.size(), 0);
  sizes = shape;
  if (!piece.contains("box")) return;
  const std::string bad = "'" + name + "' has a piece whose box is not ";
  if (version < 2) fail_at(index_path, bad + "allowed in a version 1 index; the checkpoint is corrupt");
  const json& b = piece["box"];
  if (!b.is_object() || !b.contains("offsets") || !b.contains("sizes") || !b["offsets"].is_array() || !b["sizes"].is_array() ||
      b["offsets"].size() != shape.size() || b["sizes"].size() != shape.size())
    fail_at(index_path, bad + "an offset and a size for each of its " + std::to_string(shape.size()) +
                            " dimensions; the checkpoint is corrupt");
  for (size_t d = 0; d < shape.size(); d++) {
    const json &o = b["offsets"][d], &z = b["sizes"][d];
    if (!o.is_number_integer() || !z.is_number_integer())
      fail_at(index_path, bad + "made of whole numbers; the checkpoint is corrupt");
    offsets[d] = o.get<int64_t>(), sizes[d] = z.get<int64_t>();
    // Compared without adding them (an offset near 2^63 plus a size would overflow).
    if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] > shape[d] || sizes[d] > shape[d] - offsets[d])
      fail_at(index_path, bad + "inside its shape " + json(shape).dump() + "; the checkpoint is corrupt");
  }
}

// Element k of a box (row-major over `sizes`, placed at `offsets`) in the full tensor's flat order.
int64_t box_element(const Shape& shape, const Shape& offsets, const Shape& sizes, int64_t k) {
  int64_t at = 0, stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    at += (offsets[d] + k % sizes[d]) * stride;
    k /= sizes[d];
    stride *= shape[d];
  }
  return at;
}

// Fills `out` (the full tensor of `shape`, row-major) from the pieces index.json lists for `name`,
// checking each (whole numbers, a plain file name, inside the tensor, present in its file) and that
// every element lies in exactly one piece.
void assemble(const std::string& dir, const Index& idx, const std::string& name, const Shape& shape, const json& jp,
              std::map<std::string, SafetensorsFile>& files, float* out) {
  const std::string index_path = join(dir, kIndex);
  const int64_t numel = shape_numel(shape);
  std::vector<uint8_t> covered(static_cast<size_t>(numel), 0);
  if (!jp.contains("pieces") || !jp["pieces"].is_array()) fail_at(index_path, "'" + name + "' has no pieces list; the checkpoint is corrupt");
  std::vector<float> values;
  for (const json& piece : jp["pieces"]) {
    const std::string file = piece.value("file", ""), tensor = piece.value("tensor", "");
    // Whole numbers only (a fraction would be truncated), compared without adding them: an offset
    // near 2^63 plus a length would overflow past the bounds check.
    for (const char* key : {"offset", "length"})
      if (!piece.contains(key) || !piece[key].is_number_integer())
        fail_at(index_path, "'" + name + "' has a piece whose " + key + " is not a whole number; the checkpoint is corrupt");
    const int64_t offset = piece["offset"].get<int64_t>(), length = piece["length"].get<int64_t>();
    // A plain name in the directory: no path separator, and no NUL (the open would cut the name there).
    if (file.empty() || file.find_first_of(std::string("/\0", 2)) != std::string::npos)
      fail_at(index_path, "'" + name + "' has a piece whose file is not a plain file name in the checkpoint's directory; "
                       "the checkpoint is corrupt");
    Shape box_at, box_size;
    piece_box(index_path, name, piece, shape, idx.version, box_at, box_size);
    const int64_t box_numel = shape_numel(box_size);
    if (offset < 0 || length < 0 || offset > box_numel || length > box_numel - offset)
      fail_at(index_path, "'" + name + "' lists a piece outside its " + std::to_string(box_numel) + " elements" +
                              (piece.contains("box") ? " (its box)" : "") + "; the checkpoint is corrupt");
    auto it = files.find(file);
    if (it == files.end()) it = files.emplace(file, load_safetensors(join(dir, file))).first;
    const SafetensorsEntry* e = it->second.find(tensor);
    if (!e || e->dtype != DType::F32 || e->shape != Shape{length})
      fail_at(join(dir, file), "has no float32 tensor '" + tensor + "' of " + std::to_string(length) +
                                " elements, which index.json lists; the checkpoint is incomplete");
    values.resize(static_cast<size_t>(length));
    std::memcpy(values.data(), it->second.bytes(*e), static_cast<size_t>(length) * sizeof(float));
    for (int64_t k = 0; k < length; k++) {
      const int64_t at = box_element(shape, box_at, box_size, offset + k);
      if (covered[static_cast<size_t>(at)]) fail_at(index_path, "'" + name + "' element " + std::to_string(at) + " is in two pieces; the checkpoint is corrupt");
      covered[static_cast<size_t>(at)] = 1;
      out[at] = values[static_cast<size_t>(k)];
    }
  }
  for (int64_t i = 0; i < numel; i++)
    if (!covered[static_cast<size_t>(i)])
      fail_at(index_path, "'" + name + "' element " + std::to_string(i) + " is in no piece; a rank's file is missing from the checkpoint");
}

CheckpointInfo load_sharded(const std::string& dir, Model& model) {
  const std::string index_path = join(dir, kIndex);
  Index idx = read_index(dir);
  CheckpointInfo info = checkpoint_info_from(index_path, idx.metadata, &model);
  const std::string spec = model.spec().str();
  // Staged in full before any parameter is written: a bad piece leaves the model untouched.
  std::vector<float> staged(static_cast<size_t>(model.num_params()));
  std::map<std::string, SafetensorsFile> files;
  // Every parameter the index lists is one the model has (an extra one means another model), ...
  for (auto it = idx.params.begin(); it != idx.params.end(); ++it)
    if (model.find_parameter(it.key()) < 0)
      fail_at(index_path, "lists parameter '" + it.key().substr(0, 80) + "', which " + spec +
                           " does not have; was it saved from a different model?");
  for (const Parameter& p : model.parameters()) {
    if (!idx.params.contains(p.name))
      fail_at(index_path, "has no parameter '" + p.name + "', which " + spec + " needs; was it saved from a different model?");
    const json& jp = idx.params[p.name];
    // ... with the model's shape (a transposed or made-up shape would load the same elements into the
    // wrong places or hide a corrupt index).
    const Shape shape = index_shape(index_path, p.name, jp);
    if (shape != p.shape)
      fail_at(index_path, "'" + p.name + "' has shape " + jp["shape"].dump() + " but " + spec + " needs " + json(p.shape).dump() +
                           "; the checkpoint is corrupt");
    assemble(dir, idx, p.name, shape, jp, files, staged.data() + p.offset);
  }
  model.upload_params(staged.data());
  return info;
}

std::vector<FullTensor> read_tensors(const std::string& dir, CheckpointInfo* info) {
  const std::string index_path = join(dir, kIndex);
  Index idx = read_index(dir);
  const CheckpointInfo read = checkpoint_info_from(index_path, idx.metadata);
  if (info) *info = read;
  std::map<std::string, SafetensorsFile> files;
  std::vector<FullTensor> out;
  int64_t total = 0;
  for (auto it = idx.params.begin(); it != idx.params.end(); ++it) {
    FullTensor t{it.key(), index_shape(index_path, it.key(), it.value()), {}};
    // Without a model to bound them, the shapes may not ask for more than a model may hold: a small
    // index naming a huge tensor is refused before the allocation.
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d > 0 && numel > (kMaxModelParams - total) / d)
        fail_at(index_path, "lists more values than any model holds; the checkpoint is corrupt");
      numel *= d;
    }
    total += numel;
    t.values.resize(static_cast<size_t>(numel));
    assemble(dir, idx, t.name, t.shape, it.value(), files, t.values.data());
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

}  // namespace dtlab
