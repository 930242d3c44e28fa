// Template definitions of deploy/yaml_schema.h.
#pragma once

#include <algorithm>

namespace troupe::schema {

inline std::string child_key(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}

template <class E>
Kind<E> one_of(std::vector<std::pair<std::string_view, E>> names) {
  std::vector<std::string_view> words;
  for (const auto& [name, value] : names) words.push_back(name);
  const std::string expected = "one of " + join(words);
  Kind<E> k;
  k.read = [names, words, expected](const Origin& o, const Node& n, const std::string& key) {
    if (!n.IsScalar()) fail_expected(o, key, expected, n);
    for (const auto& [name, value] : names)
      if (name == n.Scalar()) return value;
    o.fail(key, "expected " + expected + ", got " + describe(n) + suggestion(n.Scalar(), words));
  };
  k.problem = [](const E&) { return std::string(); };
  k.write = [names](YAML::Emitter& out, const E& v) {
    for (const auto& [name, value] : names)
      if (value == v) {
        out << std::string(name);
        return;
      }
    out << "?";
  };
  return k;
}

template <class S>
Fields<S>& Fields<S>::flow(bool on) {
  flow_ = on;
  return *this;
}

template <class S>
template <class T>
Fields<S>& Fields<S>::add(std::string_view key, T S::*member, Kind<T> kind, bool omit_zero) {
  Entry e;
  e.key = key;
  e.read = [member, kind](Origin& o, const Node& v, const std::string& path, S& s) {
    s.*member = kind.read(o, v, path);
  };
  e.check = [member, kind](const Origin& o, const std::string& path, const S& s) {
    const std::string problem = kind.problem(s.*member);
    if (!problem.empty()) o.fail(path, problem);
  };
  e.write = [key, member, kind, omit_zero](YAML::Emitter& out, const S& s) {
    if constexpr (std::is_arithmetic_v<T>)
      if (omit_zero && s.*member == T{}) return;
    out << YAML::Key << std::string(key) << YAML::Value;
    kind.write(out, s.*member);
  };
  entries_.push_back(std::move(e));
  return *this;
}

template <class S>
template <class T>
Fields<S>& Fields<S>::section(std::string_view key, T S::*member, const Fields<T>& fields) {
  Entry e;
  e.key = key;
  e.read = [member, fields](Origin& o, const Node& v, const std::string& path, S& s) {
    fields.read(o, v, path, s.*member);
  };
  e.check = [member, fields](const Origin& o, const std::string& path, const S& s) {
    fields.check(o, path, s.*member);
  };
  e.write = [key, member, fields](YAML::Emitter& out, const S& s) {
    out << YAML::Key << std::string(key) << YAML::Value;
    fields.write(out, s.*member);
  };
  entries_.push_back(std::move(e));
  return *this;
}

template <class S>
template <class T>
Fields<S>& Fields<S>::list(std::string_view key, std::vector<T> S::*member, const Fields<T>& fields,
                           std::string list_expected, std::string item_expected) {
  // Entries are positional, so a list given replaces the whole list: merging
  // two lists entry by entry would be a guess.
  auto read_item = [fields, item_expected](Origin& o, const Node& v, const std::string& path,
                                           T& item) {
    if (v.IsNull()) fail_expected(o, path, item_expected, v);
    fields.read(o, v, path, item);
  };
  Entry e;
  e.key = key;
  e.read = [member, read_item, list_expected](Origin& o, const Node& v, const std::string& path,
                                              S& s) {
    if (!v.IsSequence()) fail_expected(o, path, list_expected, v);
    std::vector<T> items;
    for (const Node& item : v) {
      const std::string item_key = path + "[" + std::to_string(items.size()) + "]";
      o.note_line(item_key, item.Mark());
      read_item(o, item, item_key, items.emplace_back());
    }
    s.*member = std::move(items);
  };
  e.check = [member, fields](const Origin& o, const std::string& path, const S& s) {
    const std::vector<T>& items = s.*member;
    for (size_t i = 0; i < items.size(); ++i)
      fields.check(o, path + "[" + std::to_string(i) + "]", items[i]);
  };
  e.write = [key, member, fields](YAML::Emitter& out, const S& s) {
    out << YAML::Key << std::string(key) << YAML::Value << YAML::BeginSeq;
    for (const T& item : s.*member) fields.write(out, item);
    out << YAML::EndSeq;
  };
  e.override_entry = [key, member, read_item](Origin& o, size_t index,
                                              const std::string& entry_path,
                                              const std::string& rest, const Node& value, S& s) {
    std::vector<T>& items = s.*member;
    if (index >= items.size())
      o.fail(entry_path,
             "no such entry; " + std::string(key) + " has " + std::to_string(items.size()));
    const Node v = rest.empty() ? value : nest(split_key(o, rest), 0, value);
    read_item(o, v, entry_path, items[index]);
  };
  entries_.push_back(std::move(e));
  return *this;
}

template <class S>
Fields<S>& Fields<S>::after_read(
    std::function<void(const Origin&, const std::string&, S&, const std::set<std::string>&)> fn) {
  after_read_ = std::move(fn);
  return *this;
}

template <class S>
std::vector<std::string_view> Fields<S>::keys() const {
  std::vector<std::string_view> out;
  for (const Entry& e : entries_) out.push_back(e.key);
  return out;
}

template <class S>
const typename Fields<S>::Entry* Fields<S>::find(std::string_view key) const {
  for (const Entry& e : entries_)
    if (e.key == key) return &e;
  return nullptr;
}

template <class S>
void Fields<S>::read(Origin& o, const Node& map, const std::string& path, S& s) const {
  if (map.IsNull()) return;  // "batching:" with nothing under it: all defaults
  const std::vector<std::string_view> known = keys();
  if (!map.IsMap()) fail_expected(o, path, "a map (keys: " + join(known) + ")", map);
  std::set<std::string> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) o.fail(path, "expected key names, got " + describe(kv.first));
    const std::string& name = kv.first.Scalar();
    const std::string key = child_key(path, name);
    o.note_line(key, kv.first.Mark());
    if (!seen.insert(name).second) o.fail(key, "duplicate key");
    const Entry* e = find(name);
    if (e == nullptr) {
      const std::string hint = suggestion(name, known);
      o.fail(key, "unknown key" + (hint.empty() ? "; known keys: " + join(known) : hint));
    }
    e->read(o, kv.second, key, s);
  }
  if (after_read_) after_read_(o, path, s, seen);
}

template <class S>
void Fields<S>::check(const Origin& o, const std::string& path, const S& s) const {
  for (const Entry& e : entries_) e.check(o, child_key(path, e.key), s);
}

template <class S>
void Fields<S>::write(YAML::Emitter& out, const S& s) const {
  if (flow_) out << YAML::Flow;
  out << YAML::BeginMap;
  for (const Entry& e : entries_) e.write(out, s);
  out << YAML::EndMap;
}

template <class S>
void Fields<S>::override_key(Origin& o, const std::string& dotted_key, const Node& value,
                             S& s) const {
  if (const auto lk = list_key(dotted_key)) {
    const Entry* e = find(lk->name);
    if (e != nullptr && e->override_entry) {
      e->override_entry(o, lk->index, lk->entry, lk->rest, value, s);
      return;
    }
  }
  read(o, nest(split_key(o, dotted_key), 0, value), "", s);
}

}  // namespace troupe::schema
