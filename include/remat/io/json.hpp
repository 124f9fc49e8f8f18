// remat/io/json.hpp — readers and writers of the interchange formats of docs/formats.md:
// `remat.problem/1`, `remat.chain/1` (expanded exactly as §5 says) and `remat.schedule/1`.
//
// The formats carry the problem model of Checkmate (Jain et al., MLSys 2020) and Rockmate
// (Zhao et al., ICML 2023) and the chain model of Rotor (Beaumont et al., 2019). This is the
// one optional layer of the planner that needs a library (nlohmann/json); the core never
// includes it. Readers are strict because the files are a contract: every malformed input —
// bad JSON, a missing, unknown or duplicated field, an unknown or duplicated name, a size or
// time that is negative, fractional, infinite, a boolean or not a number, an op that writes
// nothing, a graph that cannot produce what it promises — is a remat::InvalidInput whose
// message starts with the source name and names the item with its JSON path (or line:column
// for a syntax error). Writers produce files the readers read back to equal values.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../core/chain.hpp"
#include "../core/errors.hpp"
#include "../core/problem.hpp"
#include "../core/schedule.hpp"
#include "../core/solver.hpp"

namespace remat::io {

inline constexpr std::string_view problem_format = "remat.problem/1";
/// A problem that uses the offloading fields of docs/formats.md §11.
inline constexpr std::string_view problem_format_2 = "remat.problem/2";
inline constexpr std::string_view chain_format = "remat.chain/1";
inline constexpr std::string_view schedule_format = "remat.schedule/1";
/// A schedule with transfers (docs/formats.md §11).
inline constexpr std::string_view schedule_format_2 = "remat.schedule/2";

/// What a solver believed its schedule costs (the `predicted` object of a schedule file).
struct Prediction {
    double time = 0.0;
    Bytes peak = 0;
    friend bool operator==(const Prediction&, const Prediction&) = default;
};

/// A `remat.schedule/1` file: the steps and what the file says about them.
struct SavedSchedule {
    std::string problem;                  ///< name of the problem the steps refer to
    std::string solver;                   ///< empty when the file names none
    std::optional<Bytes> budget;          ///< the budget the plan was made for, when given
    std::optional<Prediction> predicted;  ///< the solver's belief; recompute it with simulate()
    Schedule steps;
    friend bool operator==(const SavedSchedule&, const SavedSchedule&) = default;
};

namespace detail::json {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// RFC 6901 escaping, so that a path names exactly one place even for odd keys.
inline std::string pointer_escape(std::string_view key) {
    std::string out;
    for (const char c : key) {
        if (c == '~') out += "~0";
        else if (c == '/') out += "~1";
        else out += c;
    }
    return out;
}

// nlohmann reports the byte index (1-based) of the last character it read; people read
// line:column. Columns count characters, not UTF-8 continuation bytes.
inline std::string line_column(std::string_view text, std::size_t byte) {
    const std::size_t end = std::min(byte == 0 ? std::size_t{0} : byte - 1, text.size());
    std::size_t line = 1;
    std::size_t column = 1;
    for (std::size_t i = 0; i < end; ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c == '\n') {
            ++line;
            column = 1;
        } else if ((c & 0xC0U) != 0x80U) {
            ++column;
        }
    }
    return std::to_string(line) + ":" + std::to_string(column);
}

// The reason part of nlohmann's parse_error message, without its own (byte-based) position.
inline std::string parse_error_reason(const char* what) {
    const std::string_view message(what);
    const auto at = message.find("parse error");
    if (at != std::string_view::npos) {
        const auto colon = message.find(": ", at);
        if (colon != std::string_view::npos) return std::string(message.substr(colon + 2));
    }
    return std::string(message);
}

inline std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diagonal = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t above = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diagonal = above;
        }
    }
    return row[b.size()];
}

// A name or key in quotes for a message: shortened and escaped (errors.hpp: printable()).
inline std::string in_quotes(std::string_view s) { return remat::detail::quoted(s); }

inline std::string join(const std::vector<std::string_view>& items) {
    std::string out;
    for (const auto item : items) out += (out.empty() ? "" : ", ") + std::string(item);
    return out;
}

// A short rendering of a scalar JSON value for messages (never of a container, whose
// rendering would recurse as deep as the input is nested).
inline std::string preview(const json& value) {
    if (value.is_structured()) return value.is_array() ? "[...]" : "{...}";
    std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
    if (text.size() > 40) text = text.substr(0, 37) + "...";
    return text;
}

inline std::string type_name(const json& value) {
    if (value.is_boolean()) return "a boolean (" + preview(value) + ")";
    if (value.is_number()) return "a number (" + preview(value) + ")";
    if (value.is_string()) return "a string (" + preview(value) + ")";
    if (value.is_null()) return "null";
    if (value.is_array()) return "an array";
    return "an object";
}

// Builds the document from nlohmann's SAX events, in time linear in the text, rejecting
// duplicate keys (nlohmann would keep the last one silently, which would let a doubled field
// hide a typo). A key is looked up in the object being built (a std::map), so a document of
// n values takes O(n log k) for objects of k keys. Syntax errors and numbers out of range
// become InvalidInput with line:column.
class StrictDocument final : public nlohmann::json_sax<json> {
public:
    StrictDocument(json& root, std::string_view text, const std::string& source)
        : root_(root), text_(text), source_(source) {}

    bool null() override { return add(json(nullptr)); }
    bool boolean(bool v) override { return add(json(v)); }
    bool number_integer(number_integer_t v) override { return add(json(v)); }
    bool number_unsigned(number_unsigned_t v) override { return add(json(v)); }
    bool number_float(number_float_t v, const string_t&) override { return add(json(v)); }
    bool string(string_t& v) override { return add(json(std::move(v))); }
    bool binary(binary_t&) override { throw InvalidInput(source_ + ": invalid JSON: binary values are not JSON text"); }
    bool start_object(std::size_t) override { return open(json::value_t::object); }
    bool start_array(std::size_t) override { return open(json::value_t::array); }
    bool end_object() override { return close(); }
    bool end_array() override { return close(); }
    bool key(string_t& k) override {
        Frame& frame = stack_.back();
        const auto [it, inserted] = frame.value->get_ref<json::object_t&>().emplace(std::move(k), json());
        if (!inserted)
            throw InvalidInput(source_ + ": at " + path_to(it->first) + ": field " + quote(it->first) +
                               " appears twice in one object; keep one");
        frame.key = &it->first;
        frame.slot = &it->second;
        return true;
    }
    bool parse_error(std::size_t position, const std::string& token, const nlohmann::detail::exception& e) override {
        // 406: a number like 1e999 that overflows to infinity.
        if (e.id == 406)  // `position` is just past the literal; name where it starts
            throw InvalidInput(source_ + ":" + line_column(text_, position + 1 - std::min(position, token.size())) +
                               ": the number " + printable(token) +
                               " is out of range: not a finite number");
        throw InvalidInput(source_ + ":" + line_column(text_, position) + ": invalid JSON: " +
                           printable(parse_error_reason(e.what()), 200));
    }

private:
    struct Frame {
        json* value = nullptr;
        const std::string* key = nullptr;  // the key being filled, in an object
        json* slot = nullptr;              // its value
    };

    static std::string quote(std::string_view s) { return remat::detail::quoted(s); }

    // Where the next value goes: the root, the end of an array, or the slot of the last key.
    json* place(json&& value) {
        if (stack_.empty()) {
            root_ = std::move(value);
            return &root_;
        }
        Frame& frame = stack_.back();
        if (frame.value->is_array()) {
            frame.value->get_ref<json::array_t&>().push_back(std::move(value));
            return &frame.value->get_ref<json::array_t&>().back();
        }
        *frame.slot = std::move(value);
        return frame.slot;
    }
    bool add(json&& value) {
        place(std::move(value));
        return true;
    }
    bool open(json::value_t type) {
        stack_.push_back(Frame{place(json(type)), nullptr, nullptr});
        return true;
    }
    bool close() {
        stack_.pop_back();
        return true;
    }
    // RFC 6901 path of `last` inside the innermost object.
    [[nodiscard]] std::string path_to(std::string_view last) const {
        std::string path;
        for (std::size_t i = 0; i + 1 < stack_.size(); ++i) {
            const Frame& f = stack_[i];
            path += '/';
            path += f.value->is_array() ? std::to_string(f.value->size() - 1) : printable(pointer_escape(*f.key));
        }
        return path + "/" + printable(pointer_escape(last));
    }

    json& root_;
    std::string_view text_;
    const std::string& source_;
    std::vector<Frame> stack_;
};

// Parses JSON text strictly (see StrictDocument).
inline json parse_document(std::string_view text, const std::string& source) {
    json root;
    StrictDocument handler(root, text, source);
    try {
        json::sax_parse(text.begin(), text.end(), &handler, json::input_format_t::json, true);
    } catch (const json::exception& e) {
        throw InvalidInput(source + ": invalid JSON: " + printable(e.what(), 200));
    }
    return root;
}

// A JSON value with its path and a name for it in messages ("ops[3] 'F2'").
struct Node {
    const json& value;
    std::string path;  // JSON pointer; empty for the document itself
    std::string what;
};

// Checked access to the fields of one document; every failure names source, path and item.
class Reader {
public:
    explicit Reader(std::string source) : source_(std::move(source)) {}

    [[nodiscard]] const std::string& source() const noexcept { return source_; }

    [[noreturn]] void fail(const std::string& path, const std::string& message) const {
        throw InvalidInput(source_ + ": " + (path.empty() ? std::string() : "at " + printable(path, 200) + ": ") + message);
    }

    // An object with exactly the given fields (the optional ones may be absent).
    void expect_object(const Node& node, const std::vector<std::string_view>& required,
                       const std::vector<std::string_view>& optional) const {
        if (!node.value.is_object()) fail(node.path, node.what + " must be a JSON object, not " + type_name(node.value));
        for (auto it = node.value.begin(); it != node.value.end(); ++it) {
            const std::string& key = it.key();
            const auto known = [&key](std::string_view k) { return k == key; };
            if (std::any_of(required.begin(), required.end(), known) ||
                std::any_of(optional.begin(), optional.end(), known))
                continue;
            std::vector<std::string_view> all = required;
            all.insert(all.end(), optional.begin(), optional.end());
            std::string hint;
            for (const auto k : all)
                if (edit_distance(key, k) <= 2) {
                    hint = " (did you mean " + in_quotes(k) + "?)";
                    break;
                }
            fail(child_path(node, key), node.what + " has unknown field " + in_quotes(key) + hint +
                                            "; known fields: " + join(all));
        }
        for (const auto key : required)
            if (!node.value.contains(key))
                fail(node.path, node.what + " misses required field " + in_quotes(key));
    }

    [[nodiscard]] static std::string child_path(const Node& node, std::string_view key) {
        return node.path + "/" + pointer_escape(key);
    }
    [[nodiscard]] static Node field(const Node& node, std::string_view key) {
        return Node{node.value.at(std::string(key)), child_path(node, key), node.what + " field " + in_quotes(key)};
    }
    [[nodiscard]] static Node element(const Node& array, std::size_t i, std::string what) {
        return Node{array.value.at(i), array.path + "/" + std::to_string(i), std::move(what)};
    }

    [[nodiscard]] std::string string(const Node& node) const {
        if (!node.value.is_string()) fail(node.path, node.what + " must be a string, not " + type_name(node.value));
        return node.value.get<std::string>();
    }
    [[nodiscard]] std::string name(const Node& node) const {
        std::string s = string(node);
        if (s.empty()) fail(node.path, node.what + " must be a non-empty name");
        return s;
    }
    [[nodiscard]] const json& array(const Node& node) const {
        if (!node.value.is_array()) fail(node.path, node.what + " must be an array, not " + type_name(node.value));
        return node.value;
    }
    [[nodiscard]] bool boolean(const Node& node) const {
        if (!node.value.is_boolean()) fail(node.path, node.what + " must be true or false, not " + type_name(node.value));
        return node.value.get<bool>();
    }

    // A size: a whole, non-negative number of bytes that fits in Bytes.
    [[nodiscard]] Bytes bytes(const Node& node) const {
        const json& v = node.value;
        if (!v.is_number()) fail(node.path, node.what + " must be a whole number of bytes, not " + type_name(v));
        if (v.is_number_unsigned()) {
            const auto u = v.get<std::uint64_t>();
            if (u > static_cast<std::uint64_t>(std::numeric_limits<Bytes>::max()))
                fail(node.path, node.what + " is too large (" + preview(v) + " bytes)");
            return static_cast<Bytes>(u);
        }
        if (v.is_number_integer()) {
            const auto i = v.get<std::int64_t>();
            if (i < 0) fail(node.path, node.what + " is negative (" + preview(v) + "); sizes are >= 0 bytes");
            return i;
        }
        const double d = v.get<double>();
        if (!std::isfinite(d)) fail(node.path, node.what + " is not a finite number");
        if (d < 0) fail(node.path, node.what + " is negative (" + preview(v) + "); sizes are >= 0 bytes");
        if (d != std::floor(d)) fail(node.path, node.what + " is not a whole number of bytes (" + preview(v) + ")");
        if (d >= 9.2e18) fail(node.path, node.what + " is too large (" + preview(v) + " bytes)");
        return static_cast<Bytes>(d);
    }

    // A time: a finite, non-negative number.
    [[nodiscard]] double time(const Node& node) const {
        const json& v = node.value;
        if (!v.is_number()) fail(node.path, node.what + " must be a number, not " + type_name(v));
        const double d = v.get<double>();
        if (!std::isfinite(d)) fail(node.path, node.what + " is not a finite number (" + preview(v) + ")");
        if (d < 0) fail(node.path, node.what + " is negative (" + preview(v) + "); times are >= 0");
        return d;
    }

    // The "format" field, checked first so that a file of another kind gets one clear message.
    [[nodiscard]] std::string format(const Node& root, std::string_view expected) const {
        if (!root.value.is_object())
            fail("", "the document must be a JSON object with a \"format\" field, not " + type_name(root.value));
        if (!root.value.contains("format"))
            fail("", "the document has no \"format\" field (expected \"" + std::string(expected) + "\")");
        const std::string format = string(field(root, "format"));
        const bool known = format == problem_format || format == problem_format_2 || format == chain_format ||
                           format == schedule_format || format == schedule_format_2;
        if (!known)
            fail("/format", "unknown format " + in_quotes(format) + "; known formats: " +
                                join({problem_format, problem_format_2, chain_format, schedule_format, schedule_format_2}));
        return format;
    }

    void require_format(const Node& root, std::string_view expected, std::string_view hint = {}) const {
        const std::string format = this->format(root, expected);
        if (format != expected)
            fail("/format", "expected format \"" + std::string(expected) + "\" but the document is \"" + format + "\"" +
                                std::string(hint));
    }

private:
    std::string source_;
};

// The name of a list entry, when it has one, so that even a message about its other
// fields can say which entry it is.
inline std::string peek_name(const json& entry) {
    if (entry.is_object())
        if (const auto it = entry.find("name"); it != entry.end() && it->is_string()) return it->get<std::string>();
    return {};
}

inline std::string item(std::string_view list, std::size_t i, std::string_view name = {}) {
    return std::string(list) + "[" + std::to_string(i) + "]" + (name.empty() ? "" : " " + in_quotes(name));
}

// Reads a list of names into ids, rejecting unknown and repeated names with their path.
// `list()` and `owner()` describe the list and its owner, for messages only (they are built
// only when one is needed: files of a million ops read in seconds).
template <class Id, class ListNode, class Owner, class Find>
std::vector<Id> read_names(const Reader& r, const json& value, ListNode&& list, Owner&& owner, std::string_view verb,
                           std::string_view kind, Find&& find) {
    if (!value.is_array()) (void)r.array(list());  // throws, naming the list
    const json& array = value;
    std::vector<Id> ids;
    ids.reserve(array.size());
    std::unordered_set<std::size_t> seen;  // long lists only; short ones are scanned
    for (std::size_t i = 0; i < array.size(); ++i) {
        const auto entry = [&] {
            const Node l = list();
            return Reader::element(l, i, l.what + " entry " + std::to_string(i));
        };
        const auto* name = array[i].get_ptr<const std::string*>();
        if (name == nullptr || name->empty()) (void)r.name(entry());  // throws, naming the entry
        const std::optional<Id> id = find(*name);
        if (!id)
            r.fail(entry().path, owner() + " " + std::string(verb) + " unknown " + std::string(kind) + " " + in_quotes(*name));
        const bool twice = array.size() <= 16 ? std::find(ids.begin(), ids.end(), *id) != ids.end()
                                              : !seen.insert(id->index).second;
        if (twice)
            r.fail(entry().path, owner() + " lists " + std::string(kind) + " " + in_quotes(*name) + " twice in " + list().what);
        ids.push_back(*id);
    }
    return ids;
}

// A size that needs no message: a non-negative integer that fits in Bytes.
inline std::optional<Bytes> plain_bytes(const json& v) {
    if (v.is_number_unsigned()) {
        const auto u = v.get<std::uint64_t>();
        if (u <= static_cast<std::uint64_t>(std::numeric_limits<Bytes>::max())) return static_cast<Bytes>(u);
    } else if (v.is_number_integer() && v.get<std::int64_t>() >= 0) {
        return v.get<std::int64_t>();
    }
    return std::nullopt;
}

// The fields of a well-formed op entry, found without building any description; false sends
// the entry through the checked path, whose messages name what is wrong.
struct PlainOp {
    const std::string* name = nullptr;
    double time = 0.0;
    Bytes overhead = 0;
    bool exactly_once = false;
    const json* reads = nullptr;
    const json* writes = nullptr;
};

inline bool plain_op(const json& e, PlainOp& op) {
    if (!e.is_object()) return false;
    bool timed = false;
    for (auto it = e.begin(); it != e.end(); ++it) {
        const std::string& key = it.key();
        const json& v = it.value();
        if (key == "name" && v.is_string() && !v.get_ref<const std::string&>().empty()) {
            op.name = v.get_ptr<const std::string*>();
        } else if (key == "time" && v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0) {
            timed = true;
            op.time = v.get<double>();
        } else if (key == "reads" && v.is_array()) {
            op.reads = &v;
        } else if (key == "writes" && v.is_array() && !v.empty()) {
            op.writes = &v;
        } else if (key == "overhead" && plain_bytes(v)) {
            op.overhead = *plain_bytes(v);
        } else if (key == "exactly_once" && v.is_boolean()) {
            op.exactly_once = v.get<bool>();
        } else {
            return false;
        }
    }
    return op.name && timed && op.reads && op.writes;
}

// docs/formats.md §11: "host_limit" and "bandwidth": {"to_host", "to_device"} (bytes per time unit).
inline void read_transfers(const Reader& r, const json& document, ProblemBuilder& builder) {
    TransferSettings settings;
    if (document.contains("host_limit"))
        settings.host_limit = r.bytes(Node{document.at("host_limit"), "/host_limit", "the problem's 'host_limit'"});
    if (document.contains("bandwidth")) {
        const Node node{document.at("bandwidth"), "/bandwidth", "the 'bandwidth' object"};
        r.expect_object(node, {}, {"to_host", "to_device"});
        const auto rate = [&](const char* key) {
            if (!node.value.contains(key)) return 0.0;
            const double v = r.time(Node{node.value.at(key), "/bandwidth/" + std::string(key),
                                         "the bandwidth '" + std::string(key) + "'"});
            if (v <= 0) r.fail("/bandwidth/" + std::string(key), "a bandwidth must be positive (bytes per time unit)");
            return v;
        };
        settings.bandwidth_to_host = rate("to_host");
        settings.bandwidth_to_device = rate("to_device");
    }
    builder.set_transfers(settings);
}

inline Problem read_problem(const json& document, const std::string& source) {
    const Reader r(source);
    const Node root{document, "", "the problem"};
    const bool is_chain = document.is_object() && document.contains("format") && document["format"] == chain_format;
    const bool v2 = document.is_object() && document.contains("format") && document["format"] == problem_format_2;
    if (!v2)
        r.require_format(root, problem_format,
                         is_chain ? " (a chain: read it with parse_any or load_problem, which expand it)" : "");
    if (v2) r.expect_object(root, {"format", "name", "data", "ops", "initial", "final"}, {"loss", "autograd", "host_limit", "bandwidth"});
    else r.expect_object(root, {"format", "name", "data", "ops", "initial", "final"}, {"loss", "autograd"});
    const std::string problem_name = r.name(Reader::field(root, "name"));
    ProblemBuilder builder(problem_name);
    // The builder checks again what was checked above; its messages get the source too.
    const auto prefixed = [&](auto&& action) {
        try {
            return action();
        } catch (const InvalidInput& e) {
            throw InvalidInput(source + ": " + e.what());
        }
    };

    // Data.
    const Node data_node{document.at("data"), "/data", "the \"data\" list"};
    const json& data = r.array(data_node);
    if (const auto ops = document.find("ops"); ops != document.end()) builder.reserve(data.size(), ops->size());
    for (std::size_t i = 0; i < data.size(); ++i) {
        const json& e = data[i];
        if (e.is_object() && e.size() == 2) {  // the fast path: no description built
            const auto n = e.find("name");
            const auto b = e.find("bytes");
            if (n != e.end() && b != e.end() && n->is_string() && !n->get_ref<const std::string&>().empty() &&
                !builder.find_data(n->get_ref<const std::string&>())) {
                if (const auto bytes = plain_bytes(*b)) {
                    builder.add_data(n->get<std::string>(), *bytes);
                    continue;
                }
            }
        }
        Node node = Reader::element(data_node, i, item("data", i, peek_name(e)));
        if (v2) r.expect_object(node, {"name", "bytes"}, {"offloadable"});
        else r.expect_object(node, {"name", "bytes"}, {});
        const Node name_node = Reader::field(node, "name");
        const std::string name = r.name(Node{name_node.value, name_node.path, item("data", i) + " field 'name'"});
        node.what = item("data", i, name);
        if (const auto first = builder.find_data(name))
            r.fail(name_node.path, node.what + " has the same name as data[" + std::to_string(first->index) +
                                       "]; data names must be unique");
        const Bytes bytes = r.bytes(Node{node.value.at("bytes"), node.path + "/bytes", node.what + " 'bytes'"});
        const bool offloadable = node.value.contains("offloadable") &&
                                 r.boolean(Node{node.value.at("offloadable"), node.path + "/offloadable",
                                                node.what + " 'offloadable'"});
        prefixed([&] { return builder.add_data(name, bytes, offloadable); });
    }
    const auto find_data = [&](const std::string& name) { return builder.find_data(name); };

    // Ops.
    const Node ops_node{document.at("ops"), "/ops", "the \"ops\" list"};
    const json& ops = r.array(ops_node);
    std::vector<char> written(data.size(), 0);
    for (std::size_t i = 0; i < ops.size(); ++i) {
        if (PlainOp plain; plain_op(ops[i], plain) && !builder.find_op(*plain.name)) {  // the fast path
            const auto owner = [&] { return item("ops", i, *plain.name); };
            const auto list = [&](std::string_view key) {
                return [&, key] { return Node{ops[i].at(std::string(key)), "/ops/" + std::to_string(i) + "/" + std::string(key),
                                              std::string(key)}; };
            };
            OpSpec spec{*plain.name, plain.time, plain.overhead, {}, {}, plain.exactly_once};
            spec.reads = read_names<DataId>(r, *plain.reads, list("reads"), owner, "reads", "data", find_data);
            spec.writes = read_names<DataId>(r, *plain.writes, list("writes"), owner, "writes", "data", find_data);
            for (const DataId d : spec.writes) written[d.index] = 1;
            prefixed([&] { return builder.add_op(std::move(spec)); });
            continue;
        }
        Node node = Reader::element(ops_node, i, item("ops", i, peek_name(ops[i])));
        if (v2) r.expect_object(node, {"name", "time", "reads", "writes"}, {"overhead", "exactly_once", "updates"});
        else r.expect_object(node, {"name", "time", "reads", "writes"}, {"overhead", "exactly_once"});
        const Node name_node = Reader::field(node, "name");
        const std::string name = r.name(Node{name_node.value, name_node.path, item("ops", i) + " field 'name'"});
        node.what = item("ops", i, name);
        if (const auto first = builder.find_op(name))
            r.fail(name_node.path, node.what + " has the same name as ops[" + std::to_string(first->index) +
                                       "]; op names must be unique");
        const auto sub = [&](std::string_view key, std::string what) {
            return Node{node.value.at(std::string(key)), Reader::child_path(node, key), std::move(what)};
        };
        OpSpec spec;
        spec.name = name;
        spec.time = r.time(sub("time", node.what + " 'time'"));
        if (node.value.contains("overhead")) spec.overhead = r.bytes(sub("overhead", node.what + " 'overhead'"));
        if (node.value.contains("exactly_once"))
            spec.exactly_once = r.boolean(sub("exactly_once", node.what + " 'exactly_once'"));
        const auto owner = [&] { return node.what; };
        const Node reads_node = sub("reads", "reads");
        spec.reads = read_names<DataId>(r, reads_node.value, [&] { return reads_node; }, owner, "reads", "data", find_data);
        const Node writes_node = sub("writes", "writes");
        spec.writes =
            read_names<DataId>(r, writes_node.value, [&] { return writes_node; }, owner, "writes", "data", find_data);
        if (spec.writes.empty())
            r.fail(writes_node.path, node.what + " writes nothing; every op must write at least one data");
        if (node.value.contains("updates")) {
            const Node updates_node = sub("updates", "updates");
            spec.updates = read_names<DataId>(r, updates_node.value, [&] { return updates_node; }, owner, "updates",
                                              "data", find_data);
        }
        for (const DataId d : spec.writes) written[d.index] = 1;
        prefixed([&] { return builder.add_op(std::move(spec)); });
    }
    const auto find_op = [&](const std::string& name) { return builder.find_op(name); };

    // Initial and final data, loss, autograd order.
    const auto problem = [] { return std::string("the problem"); };
    const Node initial_node{document.at("initial"), "/initial", "initial"};
    const auto initial =
        read_names<DataId>(r, initial_node.value, [&] { return initial_node; }, problem, "names", "data", find_data);
    const Node final_node{document.at("final"), "/final", "final"};
    const auto finals = read_names<DataId>(r, final_node.value, [&] { return final_node; }, problem, "names", "data", find_data);
    std::vector<char> is_initial(data.size(), 0);
    for (const DataId d : initial) {
        builder.add_initial(d);
        is_initial[d.index] = 1;
    }
    for (std::size_t i = 0; i < finals.size(); ++i) {
        const DataId d = finals[i];
        if (!written[d.index] && !is_initial[d.index])
            r.fail("/final/" + std::to_string(i), "final data " + in_quotes(document["final"][i].get<std::string>()) +
                                                      " has no writer and is not initial; no schedule can produce it");
        builder.add_final(d);
    }
    if (document.contains("loss")) {
        const Node loss_node{document.at("loss"), "/loss", "the \"loss\" field"};
        const std::string loss = r.name(loss_node);
        const auto id = builder.find_op(loss);
        if (!id) r.fail(loss_node.path, "the loss names unknown op " + in_quotes(loss));
        builder.set_loss(*id);
    }
    if (document.contains("autograd")) {
        const Node order_node{document.at("autograd"), "/autograd", "autograd"};
        const json& order = r.array(order_node);
        std::vector<OpId> ids;
        for (std::size_t i = 0; i < order.size(); ++i) {
            const Node entry = Reader::element(order_node, i, "autograd entry " + std::to_string(i));
            const std::string name = r.name(entry);
            const auto id = find_op(name);
            if (!id) r.fail(entry.path, "the autograd order names unknown op " + in_quotes(name));
            ids.push_back(*id);
        }
        builder.set_autograd_order(std::move(ids));
    }
    if (v2) read_transfers(r, document, builder);
    try {
        return builder.build();
    } catch (const InvalidInput& e) {
        throw InvalidInput(source + ": " + e.what());
    }
}

inline Chain read_chain(const json& document, const std::string& source) {
    const Reader r(source);
    const Node root{document, "", "the chain"};
    r.require_format(root, chain_format);
    r.expect_object(root, {"format", "name", "input_bytes", "stages"}, {});
    Chain chain;
    chain.name = r.name(Reader::field(root, "name"));
    chain.input_bytes = r.bytes(Node{document.at("input_bytes"), "/input_bytes", "the chain's 'input_bytes'"});
    const Node stages_node{document.at("stages"), "/stages", "the \"stages\" list"};
    const json& stages = r.array(stages_node);
    if (stages.empty()) r.fail("/stages", "a chain needs at least one stage");
    std::unordered_map<std::string, std::size_t> names;
    for (std::size_t i = 0; i < stages.size(); ++i) {
        Node node = Reader::element(stages_node, i, item("stages", i, peek_name(stages[i])));
        r.expect_object(node, {"name", "fwd_time", "bwd_time", "out_bytes", "saved_bytes"},
                        {"fwd_overhead", "bwd_overhead"});
        const Node name_node = Reader::field(node, "name");
        Stage stage;
        stage.name = r.name(Node{name_node.value, name_node.path, item("stages", i) + " field 'name'"});
        node.what = item("stages", i, stage.name);
        if (const auto it = names.find(stage.name); it != names.end())
            r.fail(name_node.path, node.what + " has the same name as stages[" + std::to_string(it->second) +
                                       "]; stage names must be unique");
        names.emplace(stage.name, i);
        const auto sub = [&](std::string_view key) {
            return Node{node.value.at(std::string(key)), Reader::child_path(node, key),
                        node.what + " " + in_quotes(key)};
        };
        stage.fwd_time = r.time(sub("fwd_time"));
        stage.bwd_time = r.time(sub("bwd_time"));
        stage.out_bytes = r.bytes(sub("out_bytes"));
        stage.saved_bytes = r.bytes(sub("saved_bytes"));
        if (node.value.contains("fwd_overhead")) stage.fwd_overhead = r.bytes(sub("fwd_overhead"));
        if (node.value.contains("bwd_overhead")) stage.bwd_overhead = r.bytes(sub("bwd_overhead"));
        if (stage.saved_bytes < stage.out_bytes)
            r.fail(node.path + "/saved_bytes", node.what + " has saved_bytes " + std::to_string(stage.saved_bytes) +
                                                   " below out_bytes " + std::to_string(stage.out_bytes) +
                                                   "; saved_bytes includes the stage's own output");
        chain.stages.push_back(std::move(stage));
    }
    try {
        validate(chain);
    } catch (const InvalidInput& e) {
        throw InvalidInput(source + ": " + e.what());
    }
    return chain;
}

inline SavedSchedule read_schedule(const Problem& problem, const json& document, const std::string& source) {
    const Reader r(source);
    const Node root{document, "", "the schedule"};
    r.require_format(root, schedule_format);
    r.expect_object(root, {"format", "problem", "steps"}, {"solver", "budget", "predicted"});
    SavedSchedule saved;
    saved.problem = r.name(Reader::field(root, "problem"));
    if (saved.problem != problem.name())
        r.fail("/problem", "the schedule is for problem " + in_quotes(saved.problem) + " but the problem given is " +
                               in_quotes(problem.name()));
    if (document.contains("solver")) saved.solver = r.string(Reader::field(root, "solver"));
    if (document.contains("budget"))
        saved.budget = r.bytes(Node{document.at("budget"), "/budget", "the schedule's 'budget'"});
    if (document.contains("predicted")) {
        const Node node{document.at("predicted"), "/predicted", "the 'predicted' object"};
        r.expect_object(node, {"time", "peak"}, {});
        saved.predicted = Prediction{r.time(Node{node.value.at("time"), "/predicted/time", "the predicted 'time'"}),
                                     r.bytes(Node{node.value.at("peak"), "/predicted/peak", "the predicted 'peak'"})};
    }
    const Node steps_node{document.at("steps"), "/steps", "the \"steps\" list"};
    const json& steps = r.array(steps_node);
    saved.steps.reserve(steps.size());
    for (std::size_t i = 0; i < steps.size(); ++i) {
        const Node node = Reader::element(steps_node, i, item("steps", i));
        if (!node.value.is_object())
            r.fail(node.path, node.what + " must be {\"run\": OP} or {\"free\": DATA}, not " + type_name(node.value));
        if (node.value.size() != 1 || !(node.value.contains("run") || node.value.contains("free"))) {
            std::vector<std::string_view> keys;
            for (const auto& [key, unused] : node.value.items()) {
                (void)unused;
                keys.push_back(key);
            }
            r.fail(node.path, node.what + " must be {\"run\": OP} or {\"free\": DATA}, not an object with fields " +
                                  (keys.empty() ? std::string("(none)") : join(keys)));
        }
        if (node.value.contains("run")) {
            const Node op_node{node.value.at("run"), node.path + "/run", node.what + " 'run'"};
            const std::string name = r.name(op_node);
            const auto id = problem.find_op(name);
            if (!id) r.fail(op_node.path, node.what + " runs unknown op " + in_quotes(name));
            saved.steps.push_back(Step::run(*id));
        } else {
            const Node data_node{node.value.at("free"), node.path + "/free", node.what + " 'free'"};
            const std::string name = r.name(data_node);
            const auto id = problem.find_data(name);
            if (!id) r.fail(data_node.path, node.what + " frees unknown data " + in_quotes(name));
            saved.steps.push_back(Step::free(*id));
        }
    }
    return saved;
}

// Compact rendering with a space after ':' and ',' — one item per line in the writers below
// keeps files diffable and readable, like the examples of docs/formats.md.
inline void write_compact(std::string& out, const ordered_json& value) {
    if (value.is_object()) {
        out += '{';
        bool first = true;
        for (const auto& [key, child] : value.items()) {
            if (!first) out += ", ";
            first = false;
            out += ordered_json(key).dump();
            out += ": ";
            write_compact(out, child);
        }
        out += '}';
    } else if (value.is_array()) {
        out += '[';
        for (std::size_t i = 0; i < value.size(); ++i) {
            if (i) out += ", ";
            write_compact(out, value[i]);
        }
        out += ']';
    } else {
        out += value.dump();
    }
}

// A document of top-level fields; fields whose value is a list of objects get one item per line.
inline std::string write_document(const ordered_json& document) {
    try {
        std::string out = "{\n";
        bool first = true;
        for (const auto& [key, value] : document.items()) {
            if (!first) out += ",\n";
            first = false;
            out += "  " + ordered_json(key).dump() + ": ";
            const bool list_of_objects = value.is_array() && !value.empty() && value.front().is_object();
            if (list_of_objects) {
                out += "[\n";
                for (std::size_t i = 0; i < value.size(); ++i) {
                    out += "    ";
                    write_compact(out, value[i]);
                    out += i + 1 < value.size() ? ",\n" : "\n";
                }
                out += "  ]";
            } else {
                write_compact(out, value);
            }
        }
        out += "\n}\n";
        return out;
    } catch (const nlohmann::json::exception& e) {
        // Names built in code may not be valid UTF-8; JSON text must be.
        throw InvalidInput(std::string("cannot write JSON: ") + e.what());
    }
}

inline std::string read_text_file(const std::filesystem::path& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw InvalidInput("cannot read '" + path.string() + "': no such file");
    if (std::filesystem::is_directory(path, ec))
        throw InvalidInput("cannot read '" + path.string() + "': it is a directory");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InvalidInput("cannot read '" + path.string() + "': the file cannot be opened");
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) throw InvalidInput("cannot read '" + path.string() + "': read error");
    return std::move(text).str();
}

}  // namespace detail::json

// ------------------------------------------------------------------------------ readers

/// Reads a `remat.problem/1` document. `source` (a file name) starts every error message.
[[nodiscard]] inline Problem parse_problem(std::string_view text, std::string_view source = "<input>") {
    const std::string src(source);
    return detail::json::read_problem(detail::json::parse_document(text, src), src);
}

/// Reads a `remat.chain/1` document.
[[nodiscard]] inline Chain parse_chain(std::string_view text, std::string_view source = "<input>") {
    const std::string src(source);
    return detail::json::read_chain(detail::json::parse_document(text, src), src);
}

/// Reads either a problem or a chain (expanded with to_problem, docs/formats.md §5 (chains)), as its
/// "format" field says.
[[nodiscard]] inline Problem parse_any(std::string_view text, std::string_view source = "<input>") {
    const std::string src(source);
    const nlohmann::json document = detail::json::parse_document(text, src);
    const detail::json::Reader r(src);
    const std::string format =
        r.format(detail::json::Node{document, "", "the document"}, "remat.problem/1 or remat.chain/1");
    if (format == chain_format) return to_problem(detail::json::read_chain(document, src));
    if (format == schedule_format || format == schedule_format_2)
        r.fail("/format", "this is a schedule (" + format + "); expected a problem (remat.problem/1 or /2) or a chain "
                          "(remat.chain/1)");
    return detail::json::read_problem(document, src);
}

/// Reads a `remat.schedule/1` document whose names refer to `problem`.
[[nodiscard]] inline SavedSchedule parse_schedule(const Problem& problem, std::string_view text,
                                                  std::string_view source = "<input>") {
    const std::string src(source);
    return detail::json::read_schedule(problem, detail::json::parse_document(text, src), src);
}

/// A problem or chain file; the file name starts every error message.
[[nodiscard]] inline Problem load_problem(const std::filesystem::path& path) {
    return parse_any(detail::json::read_text_file(path), path.string());
}
[[nodiscard]] inline Chain load_chain(const std::filesystem::path& path) {
    return parse_chain(detail::json::read_text_file(path), path.string());
}
[[nodiscard]] inline SavedSchedule load_schedule(const Problem& problem, const std::filesystem::path& path) {
    return parse_schedule(problem, detail::json::read_text_file(path), path.string());
}

// ------------------------------------------------------------------------------ writers

[[nodiscard]] inline std::string to_json(const Problem& problem) {
    using detail::json::ordered_json;
    ordered_json doc;
    const bool v2 = problem.uses_transfer_fields();
    doc["format"] = v2 ? problem_format_2 : problem_format;
    doc["name"] = problem.name();
    ordered_json data = ordered_json::array();
    for (const Data& d : problem.all_data()) {
        data.push_back(ordered_json{{"name", d.name}, {"bytes", d.bytes}});
        if (d.offloadable) data.back()["offloadable"] = true;
    }
    doc["data"] = std::move(data);
    const auto names = [&](const std::vector<DataId>& ids) {
        ordered_json list = ordered_json::array();
        for (const DataId id : ids) list.push_back(problem.data(id).name);
        return list;
    };
    ordered_json ops = ordered_json::array();
    for (const Op& op : problem.all_ops()) {
        ordered_json o{{"name", op.name}, {"time", op.time}, {"overhead", op.overhead}};
        o["reads"] = names(op.reads);
        o["writes"] = names(op.writes);
        if (op.exactly_once) o["exactly_once"] = true;
        if (!op.updates.empty()) o["updates"] = names(op.updates);
        ops.push_back(std::move(o));
    }
    doc["ops"] = std::move(ops);
    doc["initial"] = names({problem.initial().begin(), problem.initial().end()});
    doc["final"] = names({problem.final_data().begin(), problem.final_data().end()});
    if (const auto loss = problem.loss()) doc["loss"] = problem.op(*loss).name;
    if (!problem.autograd_order().empty()) {
        ordered_json order = ordered_json::array();
        for (const OpId id : problem.autograd_order()) order.push_back(problem.op(id).name);
        doc["autograd"] = std::move(order);
    }
    const TransferSettings& transfers = problem.transfers();
    if (transfers.host_limit) doc["host_limit"] = *transfers.host_limit;
    if (transfers.bandwidth_to_host > 0 || transfers.bandwidth_to_device > 0) {
        ordered_json bandwidth = ordered_json::object();
        if (transfers.bandwidth_to_host > 0) bandwidth["to_host"] = transfers.bandwidth_to_host;
        if (transfers.bandwidth_to_device > 0) bandwidth["to_device"] = transfers.bandwidth_to_device;
        doc["bandwidth"] = std::move(bandwidth);
    }
    return detail::json::write_document(doc);
}

[[nodiscard]] inline std::string to_json(const Chain& chain) {
    using detail::json::ordered_json;
    ordered_json doc;
    doc["format"] = chain_format;
    doc["name"] = chain.name;
    doc["input_bytes"] = chain.input_bytes;
    ordered_json stages = ordered_json::array();
    for (const Stage& s : chain.stages)
        stages.push_back(ordered_json{{"name", s.name},
                                      {"fwd_time", s.fwd_time},
                                      {"bwd_time", s.bwd_time},
                                      {"out_bytes", s.out_bytes},
                                      {"saved_bytes", s.saved_bytes},
                                      {"fwd_overhead", s.fwd_overhead},
                                      {"bwd_overhead", s.bwd_overhead}});
    doc["stages"] = std::move(stages);
    return detail::json::write_document(doc);
}

/// A schedule file for `saved.steps`, whose ids index into `problem`.
[[nodiscard]] inline std::string to_json(const Problem& problem, const SavedSchedule& saved) {
    using detail::json::ordered_json;
    ordered_json doc;
    doc["format"] = schedule_format;
    doc["problem"] = saved.problem.empty() ? problem.name() : saved.problem;
    if (!saved.solver.empty()) doc["solver"] = saved.solver;
    if (saved.budget) doc["budget"] = *saved.budget;
    ordered_json steps = ordered_json::array();
    for (const Step& step : saved.steps) {
        if (step.is_run()) steps.push_back(ordered_json{{"run", problem.op(step.op()).name}});
        else steps.push_back(ordered_json{{"free", problem.data(step.data()).name}});
    }
    doc["steps"] = std::move(steps);
    if (saved.predicted) doc["predicted"] = ordered_json{{"time", saved.predicted->time}, {"peak", saved.predicted->peak}};
    return detail::json::write_document(doc);
}

/// The schedule file of a plan: its steps, solver, budget and simulated time and peak.
[[nodiscard]] inline SavedSchedule saved_schedule(const Problem& problem, const Plan& plan) {
    return SavedSchedule{problem.name(), plan.stats.solver, plan.budget, Prediction{plan.time, plan.peak}, plan.schedule};
}
[[nodiscard]] inline std::string to_json(const Problem& problem, const Plan& plan) {
    return to_json(problem, saved_schedule(problem, plan));
}

/// Writes text to a file, replacing it atomically: the text goes to a temporary file in the
/// same folder, which is then renamed over `path`, so that a reader (or a crash) never sees a
/// half-written file. A path that cannot be written is an InvalidInput; the temporary file is
/// removed on every failure.
inline void write_file(const std::filesystem::path& path, std::string_view text) {
    namespace fs = std::filesystem;
    static std::atomic<unsigned> counter{0};
    const std::string shown = "'" + printable(path.string(), 200) + "'";
    std::error_code ec;
    if (fs::is_directory(path, ec)) throw InvalidInput("cannot write " + shown + ": it is a directory");
    const auto stamp = static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count());
    fs::path temporary = path;
    temporary += ".tmp-" + std::to_string(stamp % 1000000007ULL) + "-" + std::to_string(counter++);
    {
        std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
        if (!out) throw InvalidInput("cannot write " + shown + ": the file cannot be created");
        out.write(text.data(), static_cast<std::streamsize>(text.size()));
        out.close();
        if (!out) {
            fs::remove(temporary, ec);
            throw InvalidInput("cannot write " + shown + ": write error");
        }
    }
    fs::rename(temporary, path, ec);
    if (ec) {
        std::error_code ignored;
        fs::remove(temporary, ignored);
        throw InvalidInput("cannot write " + shown + ": " + ec.message());
    }
}

}  // namespace remat::io
