// The safetensors header rules, one test case per rule, from hand-built bytes.
#include "weightcast/format/detail/header_json.hpp"
#include "weightcast/format/dtype.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/format/safetensors.hpp"

#include "support/paths.hpp"
#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace weightcast;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using test::make_safetensors;
using test::write_file;
using test::zeros;

constexpr std::string_view shard_name = "model-00003-of-00004.safetensors";

/// One header entry as JSON text; shape and offsets are pasted verbatim so they may be bad.
std::string entry(std::string_view name, std::string_view dtype, std::string_view shape,
                  std::string_view offsets) {
  return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":{}}})", name, dtype, shape,
                     offsets);
}

std::string object(const std::vector<std::string>& members) {
  return fmt::format("{{{}}}", fmt::join(members, ","));
}

/// Parses a header that must fail; returns the Error after checking the common contract:
/// class invalid_checkpoint, one line, starting with the file name.
Error parse_failure(std::string_view json, std::uint64_t data_bytes) {
  try {
    parse_safetensors_header(json, data_bytes, shard_name);
  } catch (const Error& e) {
    INFO("message: " << e.what());
    CHECK(e.code() == Errc::invalid_checkpoint);
    CHECK(std::string_view(e.what()).starts_with(std::string(shard_name) + ": "));
    CHECK(std::string_view(e.what()).find('\n') == std::string_view::npos);
    return e;
  }
  FAIL("header was accepted but should be rejected: " << json);
  return Error(Errc::internal, "unreachable");
}

/// Writes @p bytes to a file and reads its header, which must fail with @p code.
Error read_failure(const std::string& bytes, Errc code, const test::TempDir& dir,
                   const std::string& file = "shard.safetensors") {
  write_file(dir / file, bytes);
  try {
    read_safetensors_header(dir / file, file);
  } catch (const Error& e) {
    INFO("message: " << e.what());
    CHECK(e.code() == code);
    CHECK(std::string_view(e.what()).starts_with(file + ": "));
    CHECK(std::string_view(e.what()).find('\n') == std::string_view::npos);
    return e;
  }
  FAIL("file was accepted but should be rejected");
  return Error(Errc::internal, "unreachable");
}

const std::string basic_header =
    object({entry("w.a", "F32", "[4,3]", "[0,48]"), entry("w.b", "BF16", "[8]", "[48,64]")});

}  // namespace

TEST_CASE("dtype table: 22 dtypes with the crate's names and bit widths", "[dtype]") {
  struct Expected {
    std::string_view name;
    std::uint32_t bits;
  };
  const std::vector<Expected> expected{
      {"BOOL", 8},        {"F4", 4},      {"F6_E2M3", 6},     {"F6_E3M2", 6},
      {"U8", 8},          {"I8", 8},      {"F8_E5M2", 8},     {"F8_E4M3", 8},
      {"F8_E8M0", 8},     {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
      {"U16", 16},        {"F16", 16},    {"BF16", 16},       {"I32", 32},
      {"U32", 32},        {"F32", 32},    {"C64", 64},        {"F64", 64},
      {"I64", 64},        {"U64", 64}};
  REQUIRE(expected.size() == dtype_count);
  for (std::size_t i = 0; i < dtype_count; ++i) {
    auto dtype = static_cast<Dtype>(i);
    INFO("dtype " << expected[i].name);
    CHECK(dtype_name(dtype) == expected[i].name);
    CHECK(dtype_bits(dtype) == expected[i].bits);
    REQUIRE(parse_dtype(expected[i].name).has_value());
    CHECK(*parse_dtype(expected[i].name) == dtype);
  }
  CHECK_FALSE(parse_dtype("f32").has_value());  // Names are case-sensitive, as in the crate.
  CHECK_FALSE(parse_dtype("F7").has_value());
  CHECK_FALSE(parse_dtype("").has_value());
}

// ---- checks 1–3: the length prefix (need a file) ------------------------------------------

TEST_CASE("rule 1: a file shorter than 8 bytes is rejected", "[safetensors]") {
  test::TempDir dir;
  auto e = read_failure(std::string("\x78\0\0\0\0", 5), Errc::invalid_checkpoint, dir);
  CHECK_THAT(e.what(), Contains("5 bytes") && Contains("8-byte"));
  auto empty = read_failure("", Errc::invalid_checkpoint, dir, "empty.safetensors");
  CHECK_THAT(empty.what(), Contains("0 bytes"));
}

TEST_CASE("rule 2: a header length over 100,000,000 is rejected", "[safetensors]") {
  test::TempDir dir;
  auto e = read_failure(test::le64(100'000'001) + "{}      ", Errc::invalid_checkpoint, dir);
  CHECK_THAT(e.what(), Contains("100000001") && Contains("100000000"));
  auto max = read_failure(test::le64(~std::uint64_t{0}) + "{}", Errc::invalid_checkpoint, dir);
  CHECK_THAT(max.what(), Contains("18446744073709551615") && Contains("limit"));
}

TEST_CASE("rule 3: a header length past the end of the file is rejected", "[safetensors]") {
  test::TempDir dir;
  auto e = read_failure(test::le64(50) + "{}" + std::string(10, ' '), Errc::invalid_checkpoint, dir);
  CHECK_THAT(e.what(), Contains("header length 50") && Contains("20 bytes"));
  // Exactly the limit is allowed by rule 2, so it fails on rule 3 instead.
  auto at_limit = read_failure(test::le64(max_header_bytes) + "{}", Errc::invalid_checkpoint, dir);
  CHECK_THAT(at_limit.what(), Contains("past the end of the file"));
}

TEST_CASE("a Git LFS pointer gets its own message", "[safetensors]") {
  test::TempDir dir;
  std::string pointer =
      "version https://git-lfs.github.com/spec/v1\n"
      "oid sha256:a41fd0fd2ab25fe0553b47b8777f49ad68866d2878ba374bf8cc3b0ed6421490\n"
      "size 4923019144\n";
  auto e = read_failure(pointer, Errc::invalid_checkpoint, dir, "model-00001-of-00002.safetensors");
  CHECK_THAT(e.what(), Contains("Git LFS pointer") && Contains("git lfs pull") &&
                           Contains("4923019144 bytes"));
}

TEST_CASE("a PyTorch .bin (zip or pickle) and other formats get their own message",
          "[safetensors]") {
  // The first bytes of what torch 2 writes: torch.save (a zip archive), torch.save with
  // _use_new_zipfile_serialization=False (pickle protocol 2 and torch's magic number), and
  // pickle.dump protocol 4; padded so that only the magic can tell them apart.
  test::TempDir dir;
  struct Case {
    std::string bytes;
    std::string_view says;
  };
  const std::vector<Case> cases{
      {std::string("PK\x03\x04\x00\x00\x08\x08\x00\x00\x00\x00", 12), "is a zip archive"},
      {std::string("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8", 12),
       "is a Python pickle (protocol 2)"},
      {std::string("\x80\x04\x95\x0a\x00\x00\x00\x00\x00\x00\x00\x7d", 12),
       "is a Python pickle (protocol 4)"},
      {std::string("GGUF\x03\x00\x00\x00\x00\x00\x00\x00", 12) + "x", "is a GGUF file"},
      {std::string("\x89HDF\r\n\x1a\n\x00\x00\x00\x00", 12), "is an HDF5 file"},
  };
  for (const auto& c : cases) {
    INFO(c.says);
    auto e = read_failure(c.bytes + std::string(500, '\x01'), Errc::invalid_checkpoint, dir,
                          "pytorch_model.bin");
    CHECK_THAT(e.what(), StartsWith("pytorch_model.bin: " + std::string(c.says)) &&
                             Contains("not safetensors"));
    if (c.says.find("pickle") != std::string_view::npos || c.says.find("zip") != std::string_view::npos) {
      CHECK_THAT(e.what(), Contains("PyTorch .bin/.pt") &&
                               Contains("st.save_file(torch.load('pytorch_model.bin'"));
    }
  }
}

TEST_CASE("a text file gets a hint that it is not a safetensors file", "[safetensors]") {
  test::TempDir dir;
  auto e = read_failure("# This is a fake SafeTensors model file\nprint('hi')\n",
                        Errc::invalid_checkpoint, dir);
  CHECK_THAT(e.what(), Contains("does not look like a safetensors file") && Contains("'# This i'"));
  // Binary garbage gets no such hint.
  auto binary = read_failure(test::le64(1000) + std::string(80, '\0'), Errc::invalid_checkpoint,
                             dir, "binary.safetensors");
  CHECK_THAT(binary.what(), !Contains("does not look like"));
}

TEST_CASE("a missing file is missing_input, a directory too", "[safetensors]") {
  test::TempDir dir;
  try {
    read_safetensors_header(dir / "absent.safetensors");
    FAIL("a missing file was read");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::missing_input);
    CHECK(exit_status(e.code()) == 66);
    CHECK_THAT(e.what(), Contains((dir / "absent.safetensors").string()));
  }
  try {
    read_safetensors_header(dir.path());
    FAIL("a directory was read as a file");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::missing_input);
    CHECK_THAT(e.what(), Contains("directory"));
  }
}

// ---- checks 4–9: the JSON ------------------------------------------------------------------

TEST_CASE("rule 4: the header must be UTF-8", "[safetensors]") {
  struct Case {
    std::string bytes;
    std::string why;
  };
  const std::vector<Case> cases{
      {"\xff\xfe", "invalid lead byte"},
      {"\xc0\xaf", "overlong encoding of '/'"},
      {"\xed\xa0\x80", "UTF-16 surrogate"},
      {"\xf4\x90\x80\x80", "code point past U+10FFFF"},
      {"\xe2\x82", "sequence cut short"},
  };
  for (const auto& c : cases) {
    INFO(c.why);
    auto json = object({entry("w" + c.bytes, "U8", "[1]", "[0,1]")});
    auto e = parse_failure(json, 1);
    CHECK_THAT(e.what(), Contains("not valid UTF-8") && Contains("header offset 3"));
  }
  // Valid multi-byte names pass the check (and the rest of the rules).
  auto ok = parse_safetensors_header(object({entry("\xf0\x9f\xa6\x99.w", "U8", "[1]", "[0,1]")}),
                                     1, shard_name);
  CHECK(ok.tensors.at(0).name == "\xf0\x9f\xa6\x99.w");
}

TEST_CASE("rule 5: the header must be JSON", "[safetensors]") {
  auto trailing_comma = basic_header.substr(0, basic_header.size() - 1) + ",}";
  auto e = parse_failure(trailing_comma, 64);
  CHECK_THAT(e.what(), Contains("not valid JSON") && Contains("column"));
  CHECK_THAT(e.what(), !Contains("[json.exception"));
  // nlohmann alone would stop at a NUL and accept this; the reference rejects NUL padding.
  auto nul = parse_failure(basic_header + std::string(3, '\0'), 64);
  CHECK_THAT(nul.what(), Contains("not valid JSON") &&
                             Contains(fmt::format("NUL byte at offset {}", basic_header.size())));
  CHECK_THAT(parse_failure(std::string("{}\0garbage", 10), 0).what(), Contains("NUL byte"));
}

TEST_CASE("rule 5: a UTF-8 byte-order mark before the JSON is refused, as serde_json does",
          "[safetensors]") {
  // nlohmann's lexer skips a leading BOM; serde_json (safetensors 0.8.0: "expected value at
  // line 1 column 1") does not, and neither does Python's json module.
  const std::string bom = "\xef\xbb\xbf";
  auto e = parse_failure(bom + basic_header, 64);
  CHECK_THAT(e.what(), Contains("not valid JSON") &&
                           Contains("starts with a UTF-8 byte-order mark"));
  // Through the file reader too: status 65, the file named.
  test::TempDir dir;
  const std::string header = bom + basic_header;
  auto from_file = read_failure(make_safetensors(header, zeros(64)), Errc::invalid_checkpoint, dir);
  CHECK_THAT(from_file.what(), Contains("byte-order mark"));
  CHECK(exit_status(from_file.code()) == 65);
  // JSON whitespace before the object stays valid (serde_json skips it); a BOM after it is
  // not whitespace.
  CHECK(parse_safetensors_header(" \n\t\r" + basic_header, 64, shard_name).tensors.size() == 2);
  CHECK_THAT(parse_failure(basic_header + bom, 64).what(), Contains("not valid JSON"));
}

TEST_CASE("rule 5: nesting deeper than serde_json's recursion limit is refused, not a crash",
          "[safetensors]") {
  // A million levels once overflowed the stack (exit 139). serde_json, which the reference
  // parses with, refuses the 128th open array or object; 127 levels are still JSON (and then
  // fail a later rule).
  const std::string deep_shape = "{\"a\":{\"dtype\":\"F32\",\"shape\":" +
                                 std::string(1'000'000, '[') + std::string(1'000'000, ']') +
                                 ",\"data_offsets\":[0,0]}}";
  CHECK_THAT(parse_failure(deep_shape, 0).what(),
             Contains("not valid JSON: more than 127 nested arrays and objects"));
  auto nested_metadata = [](int levels) {  // levels of objects, the top one included
    std::string text = "{\"__metadata__\":";
    for (int i = 1; i < levels; ++i) text += "{\"a\":";
    return text + "1" + std::string(levels, '}');
  };
  CHECK_THAT(parse_failure(nested_metadata(1'000'000), 0).what(),
             Contains("more than 127 nested"));
  CHECK_THAT(parse_failure(nested_metadata(128), 0).what(), Contains("more than 127 nested"));
  CHECK_THAT(parse_failure(nested_metadata(127), 0).what(),
             Contains("__metadata__ value of key 'a' is an object"));
}

TEST_CASE("rule 5: a header of 100,000 tensors parses (in linear time)", "[safetensors]") {
  // nlohmann's callback parser rescanned the top-level object after each entry: 20,000
  // tensors took minutes. The parse result is what is checked here; time is bench's.
  std::vector<std::string> entries;
  constexpr int count = 100'000;
  for (int i = 0; i < count; ++i) {
    entries.push_back(entry(fmt::format("t{}", i), "U8", "[1]", fmt::format("[{},{}]", i, i + 1)));
  }
  const auto header = parse_safetensors_header(object(entries), count, shard_name);
  REQUIRE(header.tensors.size() == count);
  CHECK(header.tensors.front().name == "t0");
  CHECK(header.tensors.back().name == fmt::format("t{}", count - 1));
  // A repeated name among them keeps its last entry, as the reference's map does: moved to
  // the end, it leaves a hole where its first entry was.
  entries.push_back(entry("t77777", "U8", "[1]", fmt::format("[{},{}]", count, count + 1)));
  CHECK_THAT(parse_failure(object(entries), count + 1).what(),
             Contains("tensor 't77778': data_offsets [77778, 77779] leave a hole of 1 bytes after "
                      "tensor 't77776'") &&
                 // The hole's likely cause is named, not left to the reader.
                 Contains("tensor name 't77777' appears more than once in the header; the last "
                          "entry is used"));
}

TEST_CASE("rule 6: the header JSON must be an object", "[safetensors]") {
  CHECK_THAT(parse_failure("[1, 2, 3]", 0).what(), Contains("is an array"));
  CHECK_THAT(parse_failure("\"w\"", 0).what(), Contains("is a string"));
  CHECK_THAT(parse_failure("null", 0).what(), Contains("is null"));
}

TEST_CASE("rule 7: a repeated key is refused where the reference's serde struct has the field, "
          "and keeps the last value in its maps",
          "[safetensors]") {
  // safetensors 0.8.0: a struct field twice is serde's "duplicate field"; its maps
  // (HashMap<String, TensorInfo>, __metadata__'s HashMap<String, String>) insert, so the last
  // copy wins, but each copy is deserialised first.
  SECTION("a field of an entry twice: refused") {
    auto inner = R"({"w.a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})";
    CHECK_THAT(parse_failure(inner, 4).what(),
               Contains("tensor 'w.a'") && Contains("'dtype'") && Contains("twice"));
  }
  SECTION("__metadata__ twice: refused, even when the first is null") {
    for (const char* json : {R"({"__metadata__":{"a":"1"},"__metadata__":{"b":"2"}})",
                             R"({"__metadata__":null,"__metadata__":{"b":"2"}})"}) {
      INFO(json);
      CHECK_THAT(parse_failure(json, 0).what(), Contains("__metadata__ appears twice"));
    }
  }
  SECTION("a dtype object with its key twice: refused (an enum is a map of one key)") {
    auto json = R"({"w":{"dtype":{"U8":null,"U8":null},"shape":[2],"data_offsets":[0,2]}})";
    CHECK_THAT(parse_failure(json, 2).what(), Contains("tensor 'w'") && Contains("key 'U8' twice"));
    CHECK_THAT(parse_failure(R"({"w":[{"U8":null,"U8":null},[2],[0,2]]})", 2).what(),
               Contains("key 'U8' twice"));
  }
  SECTION("a tensor name twice: the last entry is kept") {
    // The first copy alone would fail rule 14 (4 bytes of shape, 2 of offsets).
    auto json = object({entry("w.a", "U8", "[4]", "[0,2]"), entry("w.b", "U8", "[2]", "[2,4]"),
                        entry("w.a", "U8", "[2]", "[0,2]")});
    auto header = parse_safetensors_header(json, 4, shard_name);
    REQUIRE(header.tensors.size() == 2);
    CHECK(header.tensors[0].name == "w.a");
    CHECK(header.tensors[0].shape == std::vector<std::uint64_t>{2});
    CHECK(header.tensors[1].name == "w.b");
  }
  SECTION("an earlier copy of a repeated name must still be a well-formed entry") {
    auto json = object({entry("w.a", "F7", "[2]", "[0,2]"), entry("w.a", "U8", "[2]", "[0,2]")});
    CHECK_THAT(parse_failure(json, 2).what(), Contains("tensor 'w.a'") && Contains("'F7'"));
  }
  SECTION("a __metadata__ key twice: the last value is kept, an earlier one must be a string") {
    auto last = parse_safetensors_header(R"({"__metadata__":{"a":"1","a":"2"}})", 0, shard_name);
    CHECK(last.metadata == std::map<std::string, std::string>{{"a", "2"}});
    CHECK_THAT(parse_failure(R"({"__metadata__":{"a":1,"a":"2"}})", 0).what(),
               Contains("__metadata__ value of key 'a' is an integer"));
  }
  SECTION("keys the reference ignores may repeat: an unknown entry key, keys inside its value") {
    for (const char* json :
         {R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1,"x":2}})",
          R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":{"a":1,"a":2}}})"}) {
      INFO(json);
      CHECK(parse_safetensors_header(json, 2, shard_name).tensors.size() == 1);
    }
  }
  SECTION("a syntax error wins over a repeated key found before it") {
    auto both = R"({"w":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]},})";
    CHECK_THAT(parse_failure(both, 2).what(), Contains("not valid JSON"));
  }
  SECTION("equal keys in different objects are not repeats") {
    auto ok = parse_safetensors_header(basic_header, 64, shard_name);
    CHECK(ok.tensors.size() == 2);
  }
}

TEST_CASE("rule 8: __metadata__ is null or an object of strings", "[safetensors]") {
  auto with_metadata = [](std::string_view metadata) {
    return fmt::format(R"({{"__metadata__":{},{}}})", metadata, entry("w", "U8", "[2]", "[0,2]"));
  };
  CHECK_THAT(parse_failure(with_metadata(R"({"format":1})"), 2).what(),
             Contains("'format'") && Contains("an integer") && Contains("must be a string"));
  CHECK_THAT(parse_failure(with_metadata(R"({"a":"x","nested":{"b":"c"}})"), 2).what(),
             Contains("'nested'") && Contains("an object"));
  CHECK_THAT(parse_failure(with_metadata(R"(["pt"])"), 2).what(),
             Contains("__metadata__ is an array"));
  CHECK_THAT(parse_failure(with_metadata("\"pt\""), 2).what(), Contains("__metadata__ is a string"));

  auto null_metadata = parse_safetensors_header(with_metadata("null"), 2, shard_name);
  CHECK(null_metadata.metadata.empty());
  CHECK(null_metadata.tensors.size() == 1);
  auto strings = parse_safetensors_header(with_metadata(R"({"format":"pt","note":"ß"})"), 2,
                                          shard_name);
  CHECK(strings.metadata == std::map<std::string, std::string>{{"format", "pt"}, {"note", "ß"}});
}

TEST_CASE("rule 9: an entry has dtype, shape and data_offsets, and other keys are ignored",
          "[safetensors]") {
  for (std::string_view key : {"dtype", "shape", "data_offsets"}) {
    INFO("missing " << key);
    auto full = nlohmann::json::parse(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})");
    full.erase(std::string(key));
    auto json = fmt::format(R"({{"w.a":{}}})", full.dump());
    CHECK_THAT(parse_failure(json, 1).what(),
               Contains("tensor 'w.a'") && Contains(fmt::format("missing key '{}'", key)));
  }
  // safetensors 0.8.0 loads both (TensorInfo has no deny_unknown_fields).
  for (const char* json :
       {R"({"w.a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":"x"}})",
        R"({"w.a":{"Dtype":"F32","offset":{"a":[1,{"b":null}]},"dtype":"U8","shape":[1],)"
        R"("data_offsets":[0,1]}})"}) {
    INFO(json);
    auto header = parse_safetensors_header(json, 1, shard_name);
    REQUIRE(header.tensors.size() == 1);
    CHECK(header.tensors[0].dtype == Dtype::U8);
  }
  CHECK_THAT(parse_failure(R"({"w.a":"U8"})", 1).what(),
             Contains("tensor 'w.a'") && Contains("entry is a string"));
  CHECK_THAT(parse_failure(R"({"w.a":null})", 1).what(), Contains("entry is null"));
}

TEST_CASE("rule 9: an entry may be the array [dtype, shape, data_offsets], as serde reads a "
          "struct",
          "[safetensors]") {
  auto header = parse_safetensors_header(R"({"w":["U8",[2],[0,2]]})", 2, shard_name);
  REQUIRE(header.tensors.size() == 1);
  CHECK(header.tensors[0].shape == std::vector<std::uint64_t>{2});
  CHECK(header.tensors[0].bytes == 2);
  for (const char* json : {R"({"w":[]})", R"({"w":["U8",[2]]})", R"({"w":["U8",[2],[0,2],1]})"}) {
    INFO(json);
    CHECK_THAT(parse_failure(json, 2).what(),
               Contains("tensor 'w'") && Contains("entry is an array of"));
  }
  CHECK_THAT(parse_failure(R"({"w":["U8",[2.0],[0,2]]})", 2).what(),
             Contains("dimension 0 is 2.0"));
}

TEST_CASE("rule 9: an entry is judged alike whatever its key order and wherever a fault falls",
          "[safetensors]") {
  // The parser takes an entry of the usual form straight from the JSON events and hands any
  // other to the rules with everything seen so far: a fault before, inside or after either
  // array, in any key order, must read as it does in the usual order.
  const std::vector<std::array<std::string, 3>> orders = {
      {"dtype", "shape", "data_offsets"}, {"dtype", "data_offsets", "shape"},
      {"shape", "dtype", "data_offsets"}, {"shape", "data_offsets", "dtype"},
      {"data_offsets", "dtype", "shape"}, {"data_offsets", "shape", "dtype"}};
  auto with = [](const std::array<std::string, 3>& order, std::string_view dtype,
                 std::string_view shape, std::string_view offsets) {
    std::vector<std::string> members;
    for (const auto& key : order) {
      const std::string_view value = key == "dtype" ? dtype : key == "shape" ? shape : offsets;
      if (!value.empty()) members.push_back(fmt::format(R"("{}":{})", key, value));
    }
    // A good tensor before and after: the faulty one is found among others, and the state
    // of one entry never leaks into the next.
    return fmt::format(R"({{"a":{{"dtype":"U8","shape":[2],"data_offsets":[0,2]}},)"
                       R"("w":{{{}}},"z":{{"shape":[1],"dtype":"U8","data_offsets":[14,15]}}}})",
                       fmt::join(members, ","));
  };
  struct Case {
    std::string_view dtype, shape, offsets, expected;
  };
  const std::vector<Case> cases = {
      {R"("F32")", "[2,-1]", "[2,14]", "shape [2, -1]: dimension 1 is -1"},
      {R"("F32")", "[-1,2]", "[2,14]", "dimension 0 is -1"},
      {R"("F32")", "[2,[1]]", "[2,14]", "dimension 1 is [1]"},
      {R"("F32")", "[2,{}]", "[2,14]", "dimension 1 is {}"},
      {R"("F32")", "[3.0]", "[2,14]", "dimension 0 is 3.0"},
      {R"("F32")", R"("3")", "[2,14]", R"(shape "3" is a string)"},
      {R"("F32")", "{}", "[2,14]", "shape {} is an object"},
      {R"("F32")", "[3]", "[2,14,15]", "data_offsets [2, 14, 15] must be two"},
      {R"("F32")", "[3]", "[2]", "data_offsets [2] must be two"},
      {R"("F32")", "[3]", "[2,-14]", "data_offsets [2, -14] must be two"},
      {R"("F32")", "[3]", "[[2],14]", "data_offsets [[2], 14] must be two"},
      {R"("F32")", "[3]", "null", "data_offsets null must be two"},
      {R"(["F32"])", "[3]", "[2,14]", R"(dtype ["F32"] is an array)"},
      {"null", "[3]", "[2,14]", "dtype null is null"},
      {R"("F7")", "[3]", "[2,14]", "unknown dtype 'F7'"},
      {"", "[3]", "[2,14]", "missing key 'dtype'"},
      {R"("F32")", "", "[2,14]", "missing key 'shape'"},
      {R"("F32")", "[3]", "", "missing key 'data_offsets'"},
  };
  for (const auto& order : orders) {
    for (const Case& c : cases) {
      const std::string json = with(order, c.dtype, c.shape, c.offsets);
      INFO(json);
      CHECK_THAT(parse_failure(json, 15).what(),
                 Contains("tensor 'w': ") && Contains(std::string(c.expected)));
    }
    // A key given twice, at each place: check 7 (a repeated key), not a rule of entries.
    for (const auto& again : order) {
      std::string json = with(order, R"("F32")", "[3]", "[2,14]");
      const std::string repeated = fmt::format(R"("{}":[0],)", again);
      json.insert(json.find(R"("w":{)") + 5, repeated);
      INFO(json);
      CHECK_THAT(parse_failure(json, 15).what(),
                 Contains(fmt::format("tensor 'w': key '{}' appears twice", again)));
    }
    const std::string good = with(order, R"("F32")", "[3]", "[2,14]");
    INFO(good);
    const auto header = parse_safetensors_header(good, 15, shard_name);
    REQUIRE(header.tensors.size() == 3);
    CHECK(header.tensors[1].name == "w");
    CHECK(header.tensors[1].dtype == Dtype::F32);
    CHECK(header.tensors[1].shape == std::vector<std::uint64_t>{3});
    CHECK(header.tensors[1].bytes == 12);
    CHECK(header.tensors[2].name == "z");
    CHECK(header.tensors[2].shape == std::vector<std::uint64_t>{1});
  }
}

TEST_CASE("rule 9: the dtype is a string the format defines", "[safetensors]") {
  CHECK_THAT(parse_failure(object({entry("w.a", "F7", "[1]", "[0,1]")}), 1).what(),
             Contains("tensor 'w.a'") && Contains("unknown dtype 'F7'") && Contains("BF16"));
  CHECK_THAT(parse_failure(object({entry("w.a", "f32", "[1]", "[0,4]")}), 4).what(),
             Contains("unknown dtype 'f32'"));
  auto numeric = R"({"w.a":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})";
  CHECK_THAT(parse_failure(numeric, 4).what(),
             Contains("tensor 'w.a'") && Contains("dtype 32 is an integer"));
  // serde reads an enum's unit variant from {"NAME": null} too; nothing else in an object.
  auto unit = parse_safetensors_header(
      R"({"w":{"dtype":{"BF16":null},"shape":[1],"data_offsets":[0,2]}})", 2, shard_name);
  REQUIRE(unit.tensors.size() == 1);
  CHECK(unit.tensors[0].dtype == Dtype::BF16);
  for (const char* dtype : {R"({"U8":1})", R"({"U8":[]})", R"({"U8":{}})", R"({})",
                            R"({"U8":null,"I8":null})"}) {
    INFO(dtype);
    auto json = fmt::format(R"({{"w":{{"dtype":{},"shape":[2],"data_offsets":[0,2]}}}})", dtype);
    CHECK_THAT(parse_failure(json, 2).what(), Contains("is an object, must be a string"));
  }
  CHECK_THAT(parse_failure(R"({"w":{"dtype":{"F7":null},"shape":[2],"data_offsets":[0,2]}})", 2)
                 .what(),
             Contains("unknown dtype 'F7'"));
}

TEST_CASE("rule 9: shape values are non-negative integers", "[safetensors]") {
  CHECK_THAT(parse_failure(object({entry("w.a", "F32", "[-4,-3]", "[0,48]")}), 48).what(),
             Contains("tensor 'w.a'") && Contains("shape [-4, -3]") && Contains("dimension 0 is -4"));
  CHECK_THAT(parse_failure(object({entry("w.a", "F32", "[4,3.0]", "[0,48]")}), 48).what(),
             Contains("dimension 1 is 3.0"));
  CHECK_THAT(parse_failure(object({entry("w.a", "F32", "[4,\"3\"]", "[0,48]")}), 48).what(),
             Contains("dimension 1 is \"3\""));
  CHECK_THAT(parse_failure(object({entry("w.a", "F32", "12", "[0,48]")}), 48).what(),
             Contains("shape 12 is an integer"));
  // -0: serde_json (the reference's parser) reads it as a float and refuses it.
  CHECK_THAT(parse_failure(object({entry("w.a", "F32", "[4,-0]", "[0,16]")}), 16).what(),
             Contains("shape [4, -0]: dimension 1 is -0, must be a non-negative integer"));
  // Beyond 2^64-1 the JSON number no longer is an integer.
  CHECK_THAT(
      parse_failure(object({entry("w.a", "U8", "[18446744073709551616]", "[0,1]")}), 1).what(),
      Contains("dimension 0 is 18446744073709551616, must be a non-negative integer below 2^64"));
  CHECK_THAT(parse_failure(object({entry("w.a", "U8", "[1e20]", "[0,1]")}), 1).what(),
             Contains("dimension 0 is 100000000000000000000,"));
}

TEST_CASE("rule 9: data_offsets are exactly two non-negative integers", "[safetensors]") {
  for (std::string_view offsets : {"[0.0,48.5]", "[0.0,48]", "[0]", "[0,24,48]", "[-1,47]", "[-0,48]",
                                   "[\"0\",\"48\"]", "{\"begin\":0}", "48"}) {
    INFO("data_offsets " << offsets);
    auto e = parse_failure(object({entry("w.a", "F32", "[12]", offsets)}), 48);
    CHECK_THAT(e.what(), Contains("tensor 'w.a'") && Contains("data_offsets") &&
                             Contains("two non-negative integers"));
  }
}

// ---- checks 10–15: offsets and sizes -------------------------------------------------------

TEST_CASE("rule 10: tensors tile the data section with no hole", "[safetensors]") {
  auto hole = object({entry("w.a", "F32", "[4,3]", "[0,48]"), entry("w.b", "BF16", "[8]", "[56,72]")});
  CHECK_THAT(parse_failure(hole, 72).what(),
             Contains("tensor 'w.b'") && Contains("[56, 72]") && Contains("hole of 8 bytes") &&
                 Contains("'w.a'") && Contains("48"));
  auto late_start = object({entry("w.a", "F32", "[4,3]", "[8,56]")});
  CHECK_THAT(parse_failure(late_start, 56).what(),
             Contains("tensor 'w.a'") && Contains("must begin at 0"));
}

TEST_CASE("rule 10: tensors do not overlap", "[safetensors]") {
  auto overlap =
      object({entry("w.a", "F32", "[4,3]", "[0,48]"), entry("w.b", "BF16", "[8]", "[44,60]")});
  CHECK_THAT(parse_failure(overlap, 60).what(),
             Contains("tensor 'w.b'") && Contains("[44, 60]") && Contains("overlap tensor 'w.a'") &&
                 Contains("ends at 48"));
  auto same_bytes =
      object({entry("w.a", "F32", "[4,3]", "[0,48]"), entry("w.b", "F32", "[4,3]", "[0,48]")});
  CHECK_THAT(parse_failure(same_bytes, 48).what(), Contains("overlap"));
}

TEST_CASE("rule 11: data_offsets end before begin", "[safetensors]") {
  auto json = object({entry("layers.6.down", "U8", "[1024]", "[0,1024]"),
                      entry("model.layers.7.mlp.up_proj.weight", "U8", "[124]", "[1024,900]")});
  auto e = parse_failure(json, 1024);
  CHECK(std::string(e.what()) ==
        "model-00003-of-00004.safetensors: tensor 'model.layers.7.mlp.up_proj.weight': "
        "data_offsets [1024, 900] end before begin");
}

TEST_CASE("rule 12: the element count must fit 64 bits", "[safetensors]") {
  auto elements = object({entry("w.a", "F32", "[1099511627776,1099511627776,1048576]", "[0,48]")});
  CHECK_THAT(parse_failure(elements, 48).what(),
             Contains("tensor 'w.a'") && Contains("[1099511627776, 1099511627776, 1048576]") &&
                 Contains("64 bits"));
  // 2^62 elements fit, but 2^62 × 32 bits do not.
  auto bits = object({entry("w.a", "F32", "[4611686018427387904]", "[0,48]")});
  CHECK_THAT(parse_failure(bits, 48).what(),
             Contains("tensor 'w.a'") && Contains("F32") && Contains("64 bits"));
  // A zero dimension makes the count 0, whatever the other dimensions are.
  auto zero = parse_safetensors_header(
      object({entry("w.a", "F32", "[0,18446744073709551615,18446744073709551615]", "[0,0]")}), 0,
      shard_name);
  CHECK(zero.tensors.at(0).bytes == 0);
}

TEST_CASE("rule 13: sub-byte dtypes must fill whole bytes", "[safetensors]") {
  CHECK_THAT(parse_failure(object({entry("x", "F4", "[3]", "[0,2]")}), 2).what(),
             Contains("tensor 'x'") && Contains("12 bits") && Contains("whole number of bytes"));
  CHECK_THAT(parse_failure(object({entry("x", "F6_E2M3", "[5]", "[0,4]")}), 4).what(),
             Contains("30 bits"));
  auto ok = parse_safetensors_header(
      object({entry("a", "F4", "[2,3]", "[0,3]"), entry("b", "F6_E3M2", "[4]", "[3,6]")}), 6,
      shard_name);
  CHECK(ok.tensors.at(0).bytes == 3);
  CHECK(ok.tensors.at(1).bytes == 3);
}

TEST_CASE("rule 14: shape × dtype must equal the data_offsets span", "[safetensors]") {
  auto json = object({entry("w.a", "F32", "[4,4]", "[0,48]"), entry("w.b", "BF16", "[8]", "[48,64]")});
  CHECK_THAT(parse_failure(json, 64).what(),
             Contains("tensor 'w.a'") && Contains("shape [4, 4] of F32 is 64 bytes") &&
                 Contains("[0, 48] span 48 bytes"));
}

TEST_CASE("rule 15: the data section ends exactly at the end of the file", "[safetensors]") {
  SECTION("trailing bytes") {
    CHECK_THAT(parse_failure(basic_header, 80).what(),
               Contains("16 trailing bytes") && Contains("64") && Contains("80"));
    CHECK_THAT(parse_failure("{}", 3).what(), Contains("3 trailing bytes"));
  }
  SECTION("truncated data names the first tensor past the end") {
    auto e = parse_failure(basic_header, 60);
    CHECK_THAT(e.what(), Contains("tensor 'w.b'") && Contains("[48, 64]") && Contains("60 bytes"));
    auto early = parse_failure(basic_header, 40);
    CHECK_THAT(early.what(), Contains("tensor 'w.a'"));
  }
  SECTION("read from a file") {
    test::TempDir dir;
    auto bytes = make_safetensors(basic_header, zeros(64));
    auto e = read_failure(bytes.substr(0, bytes.size() - 4), Errc::invalid_checkpoint, dir);
    CHECK_THAT(e.what(), Contains("tensor 'w.b'") && Contains("60 bytes"));
    auto trailing = read_failure(bytes + "xx", Errc::invalid_checkpoint, dir, "t.safetensors");
    CHECK_THAT(trailing.what(), Contains("2 trailing bytes"));
  }
}

// ---- the order of the checks ---------------------------------------------------------------

TEST_CASE("a header with several faults reports the earliest rule", "[safetensors][order]") {
  SECTION("UTF-8 (4) before JSON syntax (5)") {
    CHECK_THAT(parse_failure("{\"\xff\":", 0).what(), Contains("UTF-8"));
  }
  SECTION("not an object (6) before everything in it") {
    CHECK_THAT(parse_failure(R"([{"a":1},{"a":2}])", 0).what(), Contains("is an array"));
  }
  SECTION("a repeated field (7) before an unknown dtype earlier in the document (9)") {
    auto json = fmt::format(R"({{{},"w.a":{{"dtype":"U8","dtype":"U8","shape":[1],)"
                            R"("data_offsets":[1,2]}}}})",
                            entry("w.z", "F7", "[1]", "[0,1]"));
    CHECK_THAT(parse_failure(json, 2).what(), Contains("'w.a'") && Contains("twice"));
  }
  SECTION("__metadata__ (8) before a bad entry (9) placed before it") {
    auto json = fmt::format(R"({{{},"__metadata__":{{"n":1}}}})", entry("w", "F7", "[1]", "[0,1]"));
    CHECK_THAT(parse_failure(json, 1).what(), Contains("__metadata__"));
  }
  SECTION("entry fields (9) before offsets (10)") {
    auto json = object({entry("w.a", "F32", "[4,3]", "[0,48]"), entry("w.b", "F7", "[8]", "[56,72]")});
    CHECK_THAT(parse_failure(json, 72).what(), Contains("unknown dtype"));
  }
  SECTION("entry faults in document order, not name order") {
    auto json = object({entry("z.first", "F7", "[1]", "[0,1]"), entry("a.second", "F9", "[1]", "[1,2]")});
    CHECK_THAT(parse_failure(json, 2).what(), Contains("'z.first'"));
  }
  SECTION("per tensor in offset order: size (14) of the first before a hole (10) after it") {
    auto json = object({entry("w.b", "BF16", "[8]", "[56,72]"), entry("w.a", "F32", "[4,4]", "[0,48]")});
    CHECK_THAT(parse_failure(json, 72).what(), Contains("tensor 'w.a'") && Contains("64 bytes"));
  }
  SECTION("offsets (10–14) before the end of the data (15)") {
    auto json = object({entry("w.a", "F32", "[4,4]", "[0,48]")});
    CHECK_THAT(parse_failure(json, 10).what(), Contains("span 48 bytes"));
  }
  SECTION("a Git LFS pointer is recognised before its text is read as a length (2)") {
    test::TempDir dir;
    auto e = read_failure("version https://git-lfs.github.com/spec/v1\nsize 12\n",
                          Errc::invalid_checkpoint, dir);
    CHECK_THAT(e.what(), Contains("Git LFS"));
  }
}

// ---- valid headers -------------------------------------------------------------------------

TEST_CASE("valid: a basic file, with absolute offsets and sizes", "[safetensors][valid]") {
  test::TempDir dir;
  auto bytes = make_safetensors(basic_header, zeros(64));
  write_file(dir / "basic.safetensors", bytes);
  auto header = read_safetensors_header(dir / "basic.safetensors");
  auto n = bytes.size() - 8 - 64;
  CHECK(header.header_bytes == n);
  CHECK(header.data_bytes == 64);
  REQUIRE(header.tensors.size() == 2);
  CHECK(header.tensors[0].name == "w.a");
  CHECK(header.tensors[0].dtype == Dtype::F32);
  CHECK(header.tensors[0].shape == std::vector<std::uint64_t>{4, 3});
  CHECK(header.tensors[0].file_offset == 8 + n);
  CHECK(header.tensors[0].bytes == 48);
  CHECK(header.tensors[0].shard == 0);
  CHECK(header.tensors[1].name == "w.b");
  CHECK(header.tensors[1].dtype == Dtype::BF16);
  CHECK(header.tensors[1].file_offset == 8 + n + 48);
  CHECK(header.tensors[1].bytes == 16);
  CHECK(header.metadata.empty());
}

TEST_CASE("valid: whitespace padding after the JSON, or none", "[safetensors][valid]") {
  for (std::string_view padding : {"", " ", "       ", "\n", "\t \r\n"}) {
    INFO("padding of " << padding.size() << " bytes");
    auto header = parse_safetensors_header(basic_header + std::string(padding), 64, shard_name);
    CHECK(header.tensors.size() == 2);
    CHECK(header.header_bytes == basic_header.size() + padding.size());
  }
  auto spaced = R"(  { "w" : { "dtype" : "U8" , "shape" : [ 2 ] , "data_offsets" : [ 0 , 2 ] } }  )";
  CHECK(parse_safetensors_header(spaced, 2, shard_name).tensors.at(0).bytes == 2);
}

TEST_CASE("valid: zero-size and scalar tensors", "[safetensors][valid]") {
  auto json = object({entry("empty", "F16", "[0]", "[0,0]"), entry("scalar", "F64", "[]", "[0,8]"),
                      entry("empty2", "F32", "[3,0,5]", "[8,8]"), entry("w", "U8", "[1]", "[8,9]")});
  auto header = parse_safetensors_header(json, 9, shard_name);
  REQUIRE(header.tensors.size() == 4);
  CHECK(header.tensors[0].name == "empty");
  CHECK(header.tensors[0].bytes == 0);
  CHECK(header.tensors[1].name == "scalar");
  CHECK(header.tensors[1].shape.empty());
  CHECK(header.tensors[1].bytes == 8);
  CHECK(header.tensors[2].name == "empty2");
  CHECK(header.tensors[2].bytes == 0);
  CHECK(header.tensors[3].bytes == 1);
}

TEST_CASE("valid: every dtype", "[safetensors][valid]") {
  std::vector<std::string> members;
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < dtype_count; ++i) {
    auto dtype = static_cast<Dtype>(i);
    std::uint64_t bytes = 16 * dtype_bits(dtype) / 8;  // 16 elements: whole bytes for all.
    members.push_back(entry(fmt::format("t.{}", dtype_name(dtype)), dtype_name(dtype), "[16]",
                            fmt::format("[{},{}]", offset, offset + bytes)));
    offset += bytes;
  }
  auto header = parse_safetensors_header(object(members), offset, shard_name);
  REQUIRE(header.tensors.size() == dtype_count);
  for (std::size_t i = 0; i < dtype_count; ++i) {
    auto dtype = static_cast<Dtype>(i);
    CHECK(header.tensors[i].dtype == dtype);
    CHECK(header.tensors[i].bytes == 2 * dtype_bits(dtype));
  }
}

TEST_CASE("valid: unicode and odd tensor names", "[safetensors][valid]") {
  auto json = object({entry("ß.gewicht", "F32", "[2]", "[0,8]"), entry("层.权重", "U8", "[1]", "[8,9]"),
                      entry(R"(quote\"and\\slash)", "U8", "[1]", "[9,10]")});
  auto header = parse_safetensors_header(json, 10, shard_name);
  REQUIRE(header.tensors.size() == 3);
  CHECK(header.tensors[0].name == "ß.gewicht");
  CHECK(header.tensors[1].name == "层.权重");
  CHECK(header.tensors[2].name == "quote\"and\\slash");
}

TEST_CASE("valid: JSON order differing from offset order, result sorted by offset",
          "[safetensors][valid]") {
  auto json = object({entry("c", "U8", "[4]", "[8,12]"), entry("a", "U8", "[8]", "[0,8]"),
                      entry("b", "U8", "[0]", "[8,8]")});
  auto header = parse_safetensors_header(json, 12, shard_name);
  REQUIRE(header.tensors.size() == 3);
  CHECK(header.tensors[0].name == "a");
  CHECK(header.tensors[1].name == "b");
  CHECK(header.tensors[2].name == "c");
}

TEST_CASE("valid: an empty checkpoint {}", "[safetensors][valid]") {
  auto header = parse_safetensors_header("{}", 0, shard_name);
  CHECK(header.tensors.empty());
  CHECK(header.data_bytes == 0);
  auto only_metadata = parse_safetensors_header(R"({"__metadata__":{"format":"pt"}})", 0, shard_name);
  CHECK(only_metadata.tensors.empty());
  CHECK(only_metadata.metadata.at("format") == "pt");
}

TEST_CASE("names in messages are escaped onto one line", "[safetensors]") {
  auto json = object({entry("bad\\nname", "F7", "[1]", "[0,1]")});
  auto e = parse_failure(json, 1);
  CHECK_THAT(e.what(), Contains("tensor 'bad\\nname'"));
}

TEST_CASE("a long name or dtype in a message is cut at 256 bytes", "[safetensors]") {
  // A 100 KB dtype once made a 100 KB error line. The cut never splits a UTF-8 character.
  const std::string dtype(100'000, 'x');
  const std::string e = parse_failure(object({entry("w", dtype, "[1]", "[0,1]")}), 1).what();
  CHECK_THAT(e, Contains("unknown dtype '" + std::string(256, 'x') + "…' (100000 bytes)"));
  CHECK(e.size() < 1000);
  // 'a', 200 b and 40 c are 241 bytes; then ten 2-byte é: byte 256 is the second byte of
  // the eighth, so the cut keeps seven.
  const std::string prefix = "a" + std::string(200, 'b') + std::string(40, 'c');
  std::string name = prefix;
  for (int i = 0; i < 10; ++i) name += "\xc3\xa9";
  name += std::string(100, 'd');
  std::string kept = prefix;
  for (int i = 0; i < 7; ++i) kept += "\xc3\xa9";
  const std::string named =
      parse_failure(object({entry(name, "F7", "[1]", "[0,1]")}), 1).what();
  CHECK_THAT(named, Contains("tensor '" + kept + "…' (361 bytes)"));
}

TEST_CASE("a long shape or dtype value in a message is cut at a UTF-8 character boundary",
          "[safetensors]") {
  // json_brief cut its text at 160 bytes wherever that fell, once in the middle of a
  // multibyte character: the message was no longer valid UTF-8 (and a JSON summary of it
  // could not be written as is). Every character width at every offset against the cut:
  for (const std::string character : {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"}) {
    for (std::size_t pad = 0; pad < 4; ++pad) {
      std::string text(pad, 'x');
      for (int i = 0; i < 100; ++i) text += character;
      const std::string quoted = "\"" + text + "\"";
      for (const auto& [dtype_json, shape_json] :
           std::vector<std::pair<std::string, std::string>>{
               {"\"U8\"", "[" + quoted + "]"},  // shape and dimension 0, both cut
               {"\"U8\"", quoted},              // a shape that is a string
               {"[" + quoted + "]", "[1]"}}) {  // a dtype that is an array
        const std::string json = fmt::format(
            R"({{"w":{{"dtype":{},"shape":{},"data_offsets":[0,1]}}}})", dtype_json, shape_json);
        const std::string e = parse_failure(json, 1).what();
        INFO("character " << character.size() << " bytes, pad " << pad << ": " << e);
        CHECK_THAT(e, Contains("…"));
        CHECK(detail::find_invalid_utf8(e) == std::nullopt);
      }
    }
  }
}
