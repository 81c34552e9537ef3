#include "engine/train/config_json.h"

#include <nlohmann/json.hpp>

#include "engine/core/check.h"
#include "engine/train/settings.h"

namespace dtlab {

using nlohmann::json;

namespace {

// The sections of a key: "ddp.bucket_cap_bytes" -> "ddp", "bucket_cap_bytes".
std::vector<std::string> key_path(const char* key) {
  std::vector<std::string> parts(1);
  for (const char* p = key; *p; p++) {
    if (*p == '.') parts.emplace_back();
    else parts.back() += *p;
  }
  return parts;
}

// The value under `key`, or null when the text has none (an older run's JSON).
const json* find_key(const json& root, const char* key) {
  const json* at = &root;
  std::string where;
  for (const std::string& part : key_path(key)) {
    if (!at->is_object())
      throw Error("the run configuration's field '" + where + "' must be an object (" + at->dump().substr(0, 40) + ")");
    auto it = at->find(part);
    if (it == at->end()) return nullptr;
    at = &*it;
    where += (where.empty() ? "" : ".") + part;
  }
  return at;
}

}  // namespace

std::string train_config_to_json(const TrainConfig& c) {
  json j = json::object();
  for (const Setting& s : settings()) {
    json v;
    s.to_json(c, v);
    if (v.is_null()) continue;
    json* at = &j;
    for (const std::string& part : key_path(s.key)) at = &(*at)[part];
    *at = std::move(v);
  }
  return j.dump();
}

TrainConfig train_config_from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(std::string("the run configuration is not JSON (") + e.what() + ")");
  }
  if (!j.is_object()) throw Error("the run configuration is not a JSON object");
  TrainConfig c;
  for (const Setting& s : settings())
    if (const json* v = find_key(j, s.key)) s.from_json(c, *v);
  return c;
}

}  // namespace dtlab
