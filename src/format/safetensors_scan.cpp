// Checks 5–9 of safetensors.hpp in one SAX pass over a header's JSON text (HeaderScan), with
// the rules themselves left to parse_entry() and parse_metadata() (safetensors_entry.cpp).
#include "weightcast/format/detail/safetensors_rules.hpp"

#include "weightcast/core/error.hpp"
#include "weightcast/format/detail/header_json.hpp"

#include <boost/unordered/unordered_flat_set.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <exception>
#include <optional>
#include <unordered_set>

namespace weightcast::detail::safetensors {

using nlohmann::json;

namespace {

/// Checks 5–9 in one SAX pass over the header text (nlohmann's `json_sax` interface), with no
/// DOM of the whole header: a header of the format's largest size (about a million tensors)
/// as one DOM costs seconds and a gigabyte of memory. A top-level member's value is built
/// as a small DOM and checked by parse_metadata() or parse_entry() when it ends, so the rules
/// and their messages live in those two functions only (an entry key they do not ask for is
/// ignored or refused there, and nowhere else). The one exception is speed, not rules: an
/// entry in the canonical form parse_entry() accepts (exactly dtype, shape, data_offsets,
/// each once, a known dtype string, arrays of unsigned integers, two offsets) is taken
/// straight from the events; at the first event outside that form, what was seen is replayed
/// into the DOM and parse_entry() decides. A fault is remembered, not thrown, until the whole
/// text is known to be JSON (a syntax error anywhere wins), then reported in the rules'
/// order: 6, 7, 8, then the first faulty entry in document order.
class HeaderScan {
 public:
  explicit HeaderScan(std::string_view file, std::size_t text_bytes)
      : _file(file), _names(0, NameHash{&_entries}, NameEqual{&_entries}) {
    // About 100 header bytes per tensor in real files; a guess only saves regrowing.
    _entries.reserve(text_bytes / 96);
    _names.reserve(text_bytes / 96);
  }

  bool null() { return scalar("null", [&] { return _dom->null(); }); }
  bool boolean(bool value) { return scalar("a boolean", [&] { return _dom->boolean(value); }); }
  bool number_integer(json::number_integer_t value) {
    return scalar("an integer", [&] { return _dom->number_integer(value); });
  }
  bool number_unsigned(json::number_unsigned_t value) {
    if (_fast && _depth == 3 && _fast_open >= 0) {
      _fast_arrays[_fast_open].push_back(value);
      return true;
    }
    return scalar("an integer", [&] { return _dom->number_unsigned(value); });
  }
  bool number_float(json::number_float_t value, const json::string_t& text) {
    return scalar("a floating-point number", [&] { return _dom->number_float(value, text); });
  }
  bool string(json::string_t& value) {
    if (_fast && _depth == 2 && _fast_pending == dtype_slot) {
      _fast_dtype = value;
      _fast_pending = -1;
      return true;
    }
    return scalar("a string", [&] { return _dom->string(value); });
  }
  bool binary(json::binary_t& value) {
    return scalar("binary", [&] { return _dom->binary(value); });
  }

  bool start_object(std::size_t elements) {
    if (!open()) return false;
    if (_depth == 1) return true;  // the header object itself
    if (!_capturing) return true;
    if (_fast) {
      leave_fast();
    } else if (_depth == 2 && !_member_is_metadata) {
      enter_fast();
      return true;
    }
    _keys.emplace_back();
    return _dom->start_object(elements);
  }
  bool start_array(std::size_t elements) {
    if (!open()) return false;
    if (_depth == 1) {
      _top_kind = "an array";
      return true;
    }
    if (!_capturing) return true;
    if (_fast) {
      if (_depth == 3 && (_fast_pending == shape_slot || _fast_pending == offsets_slot)) {
        _fast_open = _fast_pending - shape_slot;
        _fast_pending = -1;
        return true;
      }
      leave_fast();
    }
    _keys.emplace_back();  // an array's keys stay empty: it only keeps the stack in step
    return _dom->start_array(elements);
  }
  bool end_object() {
    if (_fast && _depth == 2) {  // the entry's object: nothing else is open in the fast form
      --_depth;
      finish_fast();
      return true;
    }
    return close([&] { return _dom->end_object(); });
  }
  bool end_array() {
    if (_fast && _depth == 3) {
      --_depth;
      _fast_open = -1;
      return true;
    }
    return close([&] { return _dom->end_array(); });
  }

  bool key(json::string_t& key) {
    if (_depth == 1) return top_key(key);
    if (!_capturing) return true;
    if (_depth == 2) _member_key = key;
    if (_fast) {
      const int slot = slot_of(key);
      if (slot >= 0 && !_fast_has[slot]) {
        _fast_has[slot] = true;
        _fast_order[_fast_keys++] = slot;
        _fast_pending = slot;
        return true;
      }
      leave_fast();  // a key parse_entry() has to judge, or a repeated one (check 7)
    }
    if (!_keys.back().insert(key)) repeated_key(key);
    return _dom->key(key);
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& error) {
    _syntax_error = detail::json_error_text(error);
    return false;
  }

  /// Throws the first fault by the rules' order (checks 5–9); after it returns, entries()
  /// holds every tensor entry in document order.
  void report_faults() {
    if (_syntax_error) fail(_file, fmt::format("header is not valid JSON: {}", *_syntax_error));
    // 6.
    if (_top_kind) {
      fail(_file, fmt::format("header JSON is {}, must be an object of tensors", *_top_kind));
    }
    // 7.
    if (_duplicate) {
      const auto& dup = *_duplicate;
      if (dup.depth == 1) fail(_file, "__metadata__ appears twice");
      if (dup.depth == 2) {
        fail_tensor(_file, dup.owner, fmt::format("key {} appears twice", quote(dup.key)));
      }
      fail_tensor(_file, dup.owner,
                  fmt::format("dtype has key {} twice; a dtype written as an object has "
                              "exactly one key, {{\"F32\": null}}",
                              quote(dup.key)));
    }
    // 8.
    if (_metadata_fault) std::rethrow_exception(_metadata_fault);
    // 9.
    if (_entry_fault) std::rethrow_exception(_entry_fault);
  }

  /// For a hole's message: "" without repeated tensor names, else why the hole is likely
  /// there (the earlier entry of a repeated name is dropped, its bytes unclaimed).
  [[nodiscard]] std::string repeated_note() const {
    if (_repeated_names == 0) return {};
    return fmt::format(" (tensor name {} appears more than once in the header; the last entry "
                       "is used, as the safetensors reference does, so an earlier one's bytes "
                       "belong to no tensor)",
                       quote(_first_repeated));
  }

  /// What the reference ignores and a reader may want to know: entry keys besides dtype,
  /// shape and data_offsets (debug), repeated tensor names (warning). After report_faults().
  void log_notes() const {
    if (_notes.entries_with_unknown_keys != 0) {
      spdlog::debug("{}: {} tensor entr{} keys besides dtype, shape, data_offsets (first: {}); "
                    "ignored, as the safetensors reference ignores them",
                    _file, _notes.entries_with_unknown_keys,
                    _notes.entries_with_unknown_keys == 1 ? "y has" : "ies have", _notes.first);
    }
    if (_repeated_names != 0) {
      spdlog::warn("{}: {} tensor name{} repeated in the header (first: {}); the last entry of "
                   "each is used, as the safetensors reference does",
                   _file, _repeated_names, _repeated_names == 1 ? " is" : "s are",
                   quote(_first_repeated));
    }
  }

  std::vector<Entry>& entries() noexcept { return _entries; }
  std::map<std::string, std::string>& metadata() noexcept { return _metadata; }

 private:
  // Hashes top-level names by their index in `_entries`, which keeps one copy of each name
  // however the vector moves.
  struct NameHash {
    const std::vector<Entry>* entries;
    std::size_t operator()(std::uint32_t i) const noexcept {
      return std::hash<std::string_view>{}((*entries)[i].name);
    }
  };
  struct NameEqual {
    const std::vector<Entry>* entries;
    bool operator()(std::uint32_t a, std::uint32_t b) const noexcept {
      return (*entries)[a].name == (*entries)[b].name;
    }
  };

  // The keys of one open object below the top level. Entries have three keys, where a scan
  // of a vector beats a hash set; `__metadata__` may have thousands, where it does not.
  class KeySet {
   public:
    bool insert(const std::string& key) {
      if (!_set.empty()) return _set.insert(key).second;
      if (std::find(_keys.begin(), _keys.end(), key) != _keys.end()) return false;
      _keys.push_back(key);
      if (_keys.size() == 16) {
        _set.insert(std::make_move_iterator(_keys.begin()), std::make_move_iterator(_keys.end()));
        _keys.clear();
      }
      return true;
    }

   private:
    std::vector<std::string> _keys;
    std::unordered_set<std::string> _set;
  };

  bool open() {
    if (_depth == detail::max_json_depth) {
      _syntax_error = fmt::format("more than {} nested arrays and objects (serde_json's "
                                  "recursion limit, which the reference parser uses)",
                                  detail::max_json_depth);
      return false;
    }
    ++_depth;
    return true;
  }

  template <typename EndFn>
  bool close(EndFn end) {
    --_depth;
    if (_depth == 0 || !_capturing) return true;
    _keys.pop_back();
    if (!end()) return false;
    if (_depth == 1) finish_member();
    return true;
  }

  // A scalar: the top-level value itself (check 6), or part of a member's value, or the
  // whole of it.
  template <typename ValueFn>
  bool scalar(std::string_view kind, ValueFn value) {
    if (_depth == 0) {
      _top_kind = kind;
      return true;
    }
    if (!_capturing) return true;
    if (_fast) leave_fast();  // the fast form's own scalars never reach here
    if (!value()) return false;
    if (_depth == 1) finish_member();
    return true;
  }

  bool top_key(const std::string& key) {
    if (_top_kind) return true;  // not an object of tensors: check 6 reports it
    _value = nullptr;
    _dom.emplace(_value, /*allow_exceptions=*/false);
    _capturing = true;
    _keys.clear();
    if (key == "__metadata__") {
      _member_is_metadata = true;
      if (_metadata_seen && !_duplicate) _duplicate = detail::DuplicateKey{key, 1, {}, {}, nullptr};
      _metadata_seen = true;
      return true;
    }
    _member_is_metadata = false;
    _member_key.clear();
    _entries.push_back(Entry{key, Dtype::U8, {}, 0, 0});
    // A repeated name: the reference's map keeps the last entry, yet deserialises each copy.
    // This copy is read into the back of _entries (not in _names) and checked where it
    // stands, then settle_member() moves it over the first copy's slot, so the tensor keeps
    // the place of its first appearance with the last value.
    if (auto [it, inserted] = _names.insert(static_cast<std::uint32_t>(_entries.size() - 1));
        !inserted) {
      _repeat_of = *it;
      if (_repeated_names++ == 0) _first_repeated = key;
    } else {
      _repeat_of = no_repeat;
    }
    return true;
  }

  // The fast form's keys, in parse_entry()'s order.
  static constexpr int dtype_slot = 0;
  static constexpr int shape_slot = 1;
  static constexpr int offsets_slot = 2;
  static constexpr std::array<std::string_view, 3> slot_keys{"dtype", "shape", "data_offsets"};

  static int slot_of(std::string_view key) noexcept {
    for (int slot = 0; slot < 3; ++slot) {
      if (key == slot_keys[slot]) return slot;
    }
    return -1;
  }

  void enter_fast() {
    _fast = true;
    _fast_has = {};
    _fast_keys = 0;
    _fast_pending = -1;
    _fast_open = -1;
    _fast_arrays[0].clear();
    _fast_arrays[1].clear();
  }

  // Replays what the fast form saw into the DOM, as if it had been built all along: the
  // entry's object, its keys so far with their values, an array left open with its elements.
  void leave_fast() {
    _fast = false;
    _keys.emplace_back();
    _dom->start_object(static_cast<std::size_t>(-1));
    for (int i = 0; i < _fast_keys; ++i) {
      const int slot = _fast_order[i];
      std::string key(slot_keys[slot]);
      _keys.back().insert(key);
      _dom->key(key);
      if (slot == _fast_pending) break;  // its value has not begun
      if (slot == dtype_slot) {
        _dom->string(_fast_dtype);
        continue;
      }
      const int array = slot - shape_slot;
      _dom->start_array(static_cast<std::size_t>(-1));
      for (std::uint64_t value : _fast_arrays[array]) _dom->number_unsigned(value);
      if (array == _fast_open) {
        _keys.emplace_back();
        break;  // still open: the events to come fill it
      }
      _dom->end_array();
    }
  }

  // The entry's object ended in the fast form: take it if parse_entry() would, word for word;
  // anything else (a missing key, an unknown dtype, offsets not two) goes to parse_entry().
  void finish_fast() {
    const bool whole = _fast_has[0] && _fast_has[1] && _fast_has[2];
    const auto dtype = whole ? parse_dtype(_fast_dtype) : std::nullopt;
    if (_entry_fault || (dtype && _fast_arrays[1].size() == 2)) {
      _fast = false;
      _capturing = false;
      if (!_entry_fault) {
        Entry& entry = _entries.back();
        entry.dtype = *dtype;
        entry.shape.assign(_fast_arrays[0].begin(), _fast_arrays[0].end());
        entry.begin = _fast_arrays[1][0];
        entry.end = _fast_arrays[1][1];
      }
      settle_member();
      return;
    }
    leave_fast();
    _keys.pop_back();
    _dom->end_object();
    finish_member();
  }

  // A key again in one open object below the top level, classified as the reference's serde
  // types take it (check 7): a struct's field twice (dtype, shape or data_offsets in an
  // entry) or an enum's key twice (a dtype written {"F32":null,"F32":null}; an array entry's
  // first element) is refused; a map keeps the last value (__metadata__'s keys, but an
  // earlier value must still be a string, check 8); what serde ignores (an unknown entry
  // key, anything in its value) may repeat.
  void repeated_key(const std::string& key) {
    if (_member_is_metadata) {
      // At depth 2 the open object is __metadata__ itself, the root of _value, and still
      // holds the earlier value that the DOM builder is about to replace.
      if (_depth != 2 || _metadata_fault || !_value.is_object()) return;
      const auto it = _value.find(key);
      if (it == _value.end() || it->is_string()) return;
      try {
        fail(_file, fmt::format("__metadata__ value of key {} is {} ({}), must be a string",
                                quote(key), detail::json_kind(*it), json_brief(*it)));
      } catch (const Error&) {
        _metadata_fault = std::current_exception();
      }
      return;
    }
    if (_duplicate) return;
    const std::string& owner = _entries.back().name;
    if (_depth == 2 && slot_of(key) >= 0) {
      _duplicate = detail::DuplicateKey{key, 2, owner, {}, nullptr};
    } else if (_depth == 3 && (_member_key == "dtype" || _member_key.empty())) {
      // _member_key empty: the entry is an array, the object one of its elements.
      _duplicate = detail::DuplicateKey{key, 3, owner, _member_key, nullptr};
    }
  }

  // A tensor entry's value is done (taken or judged): a repeated name's copy replaces the
  // first copy's entry and leaves the back of _entries.
  void settle_member() {
    if (_repeat_of == no_repeat) return;
    if (!_entry_fault) _entries[_repeat_of] = std::move(_entries.back());
    _entries.pop_back();
    _repeat_of = no_repeat;
  }

  // The value of a top-level member is complete: check it by its rules.
  void finish_member() {
    _capturing = false;
    if (_member_is_metadata) {
      if (!_metadata_fault) {
        try {
          _metadata = parse_metadata(_file, _value);
        } catch (const Error&) {
          _metadata_fault = std::current_exception();
        }
      }
    } else {
      // After a fault the entries keep only their names: the fault is thrown.
      if (!_entry_fault) {
        try {
          Entry& entry = _entries.back();
          entry = parse_entry(_file, entry.name, _value, _notes);
        } catch (const Error&) {
          _entry_fault = std::current_exception();
        }
      }
      settle_member();
    }
    _value = nullptr;
  }

 private:
  std::string_view _file;
  std::size_t _depth = 0;  // containers open
  std::optional<std::string_view> _top_kind;  // set when the header is not a JSON object
  bool _capturing = false;  // inside a top-level member's value
  bool _member_is_metadata = false;
  static constexpr std::uint32_t no_repeat = static_cast<std::uint32_t>(-1);
  std::uint32_t _repeat_of = no_repeat;  // the first copy's index when the name repeats
  std::size_t _repeated_names = 0;
  std::string _first_repeated;
  std::string _member_key;  // the last key at depth 2 of the current member
  EntryNotes _notes;
  bool _metadata_seen = false;
  // The fast form of the current entry (see the class comment).
  bool _fast = false;
  std::array<bool, 3> _fast_has{};    // by slot
  std::array<int, 3> _fast_order{};   // slots in document order
  int _fast_keys = 0;                 // entries of `_fast_order`
  int _fast_pending = -1;             // the slot whose value comes next, or -1
  int _fast_open = -1;                // 0: inside shape's array, 1: data_offsets', or -1
  std::string _fast_dtype;
  std::array<std::vector<std::uint64_t>, 2> _fast_arrays;  // shape, data_offsets
  json _value;  // the current member's value
  std::optional<nlohmann::detail::json_sax_dom_parser<json>> _dom;  // builds `_value`
  std::vector<KeySet> _keys;  // per open container inside the member's value
  std::vector<Entry> _entries;
  boost::unordered_flat_set<std::uint32_t, NameHash, NameEqual> _names;
  std::map<std::string, std::string> _metadata;
  std::optional<detail::DuplicateKey> _duplicate;  // the first refused repeat (check 7)
  std::optional<std::string> _syntax_error;
  std::exception_ptr _metadata_fault;
  std::exception_ptr _entry_fault;  // the first faulty entry, in document order
};

}  // namespace

ScannedHeader scan_header(std::string_view json_text, std::string_view file) {
  HeaderScan scan(file, json_text.size());
  json::sax_parse(json_text.data(), json_text.data() + json_text.size(), &scan);
  scan.report_faults();
  scan.log_notes();
  return ScannedHeader{std::move(scan.entries()), std::move(scan.metadata()),
                       scan.repeated_note()};
}

}  // namespace weightcast::detail::safetensors
