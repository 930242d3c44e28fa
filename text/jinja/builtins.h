#pragma once
// Jinja's filters and tests, Python's methods of str, list and dict, and the
// global functions chat templates call (range, namespace, dict,
// raise_exception), each as the Python original behaves.
#include <string_view>

#include "text/jinja/value.h"

namespace troupe::jinja {

// `operand | name(args)`; throws Error for an unknown filter or bad arguments.
Value apply_filter(std::string_view name, const Value& operand, Args& args);

// `operand is name(args)`; throws Error for an unknown test.
bool apply_test(std::string_view name, const Value& operand, Args& args);

// `object.name`: a dict's entry, else the method of that name bound to the
// object (str.strip, dict.items, list.append, ...), else undefined.
Value attribute(const Value& object, std::string_view name);

// `object[key]`: Python indexing (negative from the end; code points of a
// string), undefined where Python would raise.
Value subscript(const Value& object, const Value& key);

// `object[start:stop:step]`, any bound undefined.
Value slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// The globals every template sees; made once, shared by every render (their
// functions hold no state).
const Dict& builtin_globals();

// What `for x in value` walks: a list's items, a dict's keys, a string's
// characters; nothing for undefined. Error for anything else, after `what`.
List items_of(const Value& v, const std::string& what);

// Python's len() of a string: its code points.
size_t utf8_length(std::string_view s);

}  // namespace troupe::jinja
