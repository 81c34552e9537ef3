// How a row of the settings table (engine/train/settings.h) reads and writes its TrainConfig field:
// the flag's text in one direction, the field's own JSON type in the other, with the range checks a
// JSON number needs. Only settings.cpp includes it; its rows are built from field(), named() and
// converted().
#pragma once
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/check.h"
#include "engine/train/settings.h"

namespace dtlab::setting_fields {

using nlohmann::json;

template <class T>
inline constexpr bool kIsList = false;
template <class T>
inline constexpr bool kIsList<std::vector<T>> = true;

// The shortest text that reads back as the same number ("0.05", not "0.050000000000000003").
template <class F>
std::string number_text(F v) {
  char buf[40];
  for (int digits = 1; digits <= 17; digits++) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    if (static_cast<F>(std::strtod(buf, nullptr)) == v) break;
  }
  return buf;
}

template <class T>
std::string to_text(const T& v) {
  if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
  else if constexpr (std::is_integral_v<T>) return std::to_string(v);
  else if constexpr (std::is_floating_point_v<T>) return number_text(v);
  else return v;
}

// The CLI's validators have checked the text already; this refusal is for a caller that sets a
// row directly (a test, a script).
template <class T>
T from_text(const char* flag, const std::string& text) {
  if constexpr (std::is_same_v<T, bool>) {
    if (text != "true" && text != "false") throw Error(std::string(flag) + ": '" + text + "' is not true or false");
    return text == "true";
  } else if constexpr (std::is_integral_v<T>) {
    T v{};
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
      throw Error(std::string(flag) + ": '" + text + "' is not a whole number");
    return v;
  } else if constexpr (std::is_floating_point_v<T>) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
      throw Error(std::string(flag) + ": '" + text + "' is not a number");
    return static_cast<T>(v);
  } else {
    return text;
  }
}

inline const std::string& one_item(const char* flag, const SettingValue& v) {
  if (v.size() != 1) throw Error(std::string(flag) + " takes one value; give it once");
  return v[0];
}

template <class T>
SettingValue value_of(const T& v) {
  if constexpr (kIsList<T>) {
    SettingValue out;
    for (const auto& e : v) out.push_back(to_text(e));
    return out;
  } else {
    return {to_text(v)};
  }
}

template <class T>
void assign(T& out, const SettingValue& v, const char* flag) {
  if constexpr (kIsList<T>) {
    T items;
    for (const std::string& e : v) items.push_back(from_text<typename T::value_type>(flag, e));
    out = std::move(items);
  } else {
    out = from_text<T>(flag, one_item(flag, v));
  }
}

inline std::string field_error(const char* key, const std::string& what) {
  return std::string("the run configuration's field '") + key + "' " + what;
}

// A JSON value into `out`; a value of the wrong type or out of T's range names the key (nlohmann's
// get<int>() of 1e300 or of 2^40 is undefined behaviour, not an error).
template <class T>
void read_json(const json& j, const char* key, T& out) {
  if constexpr (kIsList<T>) {
    if (!j.is_array()) throw Error(field_error(key, "must be a list (" + j.dump().substr(0, 40) + ")"));
    T items;
    for (const json& e : j) {
      typename T::value_type x{};
      read_json(e, key, x);
      items.push_back(x);
    }
    out = std::move(items);
    return;
  } else {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (j.is_number()) {
        const bool fits = j.is_number_unsigned() ? j.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                          : j.is_number_integer()
                              ? j.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                    (std::is_unsigned_v<T> || j.get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max()))
                              : false;
        if (!fits) throw Error(field_error(key, "is not a whole number in range (" + j.dump().substr(0, 40) + ")"));
      }
    }
    try {
      out = j.get<T>();
    } catch (const json::exception&) {
      throw Error(field_error(key, "has the wrong type (" + j.dump().substr(0, 40) + ")"));
    }
  }
}

// A row whose flag value is the field itself. `ref` is [](auto& c) -> auto& { return c.field; }.
template <class Ref>
Setting field(Setting s, Ref ref) {
  s.get = [ref](const TrainConfig& c) { return value_of(ref(c)); };
  s.set = [ref, flag = s.flag](TrainConfig& c, const SettingValue& v) { assign(ref(c), v, flag); };
  s.to_json = [ref](const TrainConfig& c, json& out) { out = ref(c); };
  s.from_json = [ref, key = s.key](TrainConfig& c, const json& j) { read_json(j, key, ref(c)); };
  return s;
}

// A row whose flag and JSON value is the field's name (an enum: "ddp", "grad-op").
template <class Ref, class ToText, class FromText>
Setting named(Setting s, Ref ref, ToText name, FromText parse) {
  s.get = [ref, name](const TrainConfig& c) { return SettingValue{std::string(name(ref(c)))}; };
  s.set = [ref, parse, flag = s.flag](TrainConfig& c, const SettingValue& v) { ref(c) = parse(one_item(flag, v)); };
  s.to_json = [ref, name](const TrainConfig& c, json& out) { out = std::string(name(ref(c))); };
  s.from_json = [ref, parse, key = s.key](TrainConfig& c, const json& j) {
    std::string text;
    read_json(j, key, text);
    ref(c) = parse(text);
  };
  return s;
}

// A row whose flag converts (MiB to bytes, a name to a bool): JSON holds the field as it is, the
// flag goes through `get` and `set`.
template <class Ref, class Get, class Set>
Setting converted(Setting s, Ref ref, Get get, Set set) {
  s = field(std::move(s), ref);
  s.get = get;
  s.set = [set, flag = s.flag](TrainConfig& c, const SettingValue& v) { set(c, one_item(flag, v)); };
  return s;
}

}  // namespace dtlab::setting_fields
