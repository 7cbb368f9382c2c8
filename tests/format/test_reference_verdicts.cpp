// The safetensors reference's verdict on one file per format rule, and ours: where
// safetensors 0.8.0 loads a file weightcast loads it, where it refuses weightcast refuses.
//
// The verdicts were recorded by running the reference itself on these bytes
// (`safetensors.safe_open(path, "numpy")` from the Python package 0.8.0, whose header reader
// is the crate's `SafeTensors::read_metadata`: serde_json into `HashMetadata`, then
// `Metadata::validate`); `reference_error` is what it said. Case names start with the rule
// they exercise (rNN, the numbering of safetensors.hpp; ok_: valid files). The messages
// weightcast gives are checked rule by rule in test_safetensors.cpp.
#include "weightcast/core/error.hpp"
#include "weightcast/format/safetensors.hpp"

#include "support/paths.hpp"
#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct ReferenceCase {
  std::string_view name;
  std::string header;  ///< The header's bytes; with `length` -1, the whole file.
  std::uint64_t data_bytes;  ///< Zero bytes after the header.
  std::optional<std::int64_t> length;  ///< The length prefix, when it is not the header's size.
  bool reference_loads;
  std::string_view reference_error;  ///< safetensors 0.8.0's message (cut), when it refuses.
};

// clang-format off
const std::vector<ReferenceCase>& reference_cases() {
  static const std::vector<ReferenceCase> cases{
    {"ok_empty", R"({})", 0, std::nullopt, true, ""},
    {"ok_empty_name", R"({"":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"ok_empty_with_data", R"({})", 1, std::nullopt, false, "incomplete metadata, file not fully covered"},
    {"ok_metadata_only", R"({"__metadata__":{"format":"pt"}})", 0, std::nullopt, true, ""},
    {"ok_zero_size_ties", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"r01_short", std::string("\x02\0\0\0\0", 5), 0, -1, false, "header too small"},
    {"r02_len_huge", R"({})", 0, 100000001, false, "header too large"},
    {"r03_len_past_eof", R"({})", 0, 50, false, "invalid header length"},
    {"r04_not_utf8", std::string("{\"w\xff""\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 54), 2, std::nullopt, false, "invalid UTF-8 in header: invalid utf-8 sequence of 1 bytes from index 3"},
    {"r05_bom", std::string("\xef""\xbb""\xbf""{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 56), 2, std::nullopt, false, "expected value at line 1 column 1"},
    {"r05_depth_127", R"({"__metadata__":null,"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}})", 2, std::nullopt, true, ""},
    {"r05_depth_128", R"({"__metadata__":null,"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}})", 2, std::nullopt, false, "recursion limit exceeded at line 1 column 202"},
    {"r05_leading_space", std::string(" \x0a""{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 55), 2, std::nullopt, true, ""},
    {"r05_lone_surrogate", R"({"w\ud800":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "unexpected end of hex escape at line 1 column 10"},
    {"r05_nul_padding", std::string("{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}\x00""\x00""", 55), 2, std::nullopt, false, "trailing characters at line 1 column 54"},
    {"r05_syntax", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},})", 2, std::nullopt, false, "trailing comma at line 1 column 54"},
    {"r05_trailing_garbage", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}} x)", 2, std::nullopt, false, "trailing characters at line 1 column 55"},
    {"r05_trailing_space", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}   )", 2, std::nullopt, true, ""},
    {"r06_array", R"([1,2])", 0, std::nullopt, false, "invalid type: sequence, expected struct HashMetadata at line 1 column 0"},
    {"r06_null", R"(null)", 0, std::nullopt, false, "invalid type: null, expected struct HashMetadata at line 1 column 4"},
    {"r07_dup_dtype_map_key", R"({"w":{"dtype":{"U8":null,"U8":null},"shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid value: map, expected map with a single key at line 1 column 70"},
    {"r07_dup_entry_key", R"({"w":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "duplicate field `dtype` at line 1 column 66"},
    {"r07_dup_inside_unknown", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":{"a":1,"a":2}}})", 2, std::nullopt, true, ""},
    {"r07_dup_metadata", R"({"__metadata__":{"a":"1"},"__metadata__":{"b":"2"},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "duplicate field `__metadata__` at line 1 column 40"},
    {"r07_dup_metadata_key", R"({"__metadata__":{"a":"1","a":"2"},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"r07_dup_metadata_key_first_bad", R"({"__metadata__":{"a":1,"a":"2"},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: integer `1`, expected a string at line 1 column 22"},
    {"r07_dup_metadata_null_then_obj", R"({"__metadata__":null,"__metadata__":{"b":"2"},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "duplicate field `__metadata__` at line 1 column 35"},
    {"r07_dup_name", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"r07_dup_name_differs", R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"r07_dup_name_first_bad", R"({"w":{"dtype":"F7","shape":[2],"data_offsets":[0,2]},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "unknown variant `F7`, expected one of `BOOL`, `F4`, `F6_E2M3`, `F6_E3M2`, `U8`, `I8`, `F8_"},
    {"r07_dup_name_first_extra", R"({"w":{"dtype":"U8","shape":[9],"data_offsets":[0,2],"q":1},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"r07_dup_unknown_key", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1,"x":2}})", 2, std::nullopt, true, ""},
    {"r08_metadata_array", R"({"__metadata__":["a"],"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: sequence, expected a map at line 1 column 16"},
    {"r08_metadata_empty", R"({"__metadata__":{},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"r08_metadata_int", R"({"__metadata__":{"a":1},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: integer `1`, expected a string at line 1 column 22"},
    {"r08_metadata_nested_null", R"({"__metadata__":{"a":null},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: null, expected a string at line 1 column 25"},
    {"r08_metadata_null", R"({"__metadata__":null,"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"r08_metadata_string", R"({"__metadata__":"a","w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: string 'a', expected a map at line 1 column 19"},
    {"r09_case_key", R"({"w":{"Dtype":"F32","dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"r09_dtype_empty", R"({"w":{"dtype":"","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "unknown variant ``, expected one of `BOOL`, `F4`, `F6_E2M3`, `F6_E3M2`, `U8`, `I8`, `F8_E5"},
    {"r09_dtype_escaped", R"({"w":{"dtype":"\u0055\u0038","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"r09_dtype_int", R"({"w":{"dtype":8,"shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: integer `8`, expected string or map at line 1 column 50"},
    {"r09_dtype_lower", R"({"w":{"dtype":"u8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "unknown variant `u8`, expected one of `BOOL`, `F4`, `F6_E2M3`, `F6_E3M2`, `U8`, `I8`, `F8_"},
    {"r09_dtype_map_1", R"({"w":{"dtype":{"U8":1},"shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: integer `1`, expected unit at line 1 column 57"},
    {"r09_dtype_map_empty", R"({"w":{"dtype":{},"shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid value: map, expected map with a single key at line 1 column 51"},
    {"r09_dtype_map_emptyarr", R"({"w":{"dtype":{"U8":[]},"shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: sequence, expected unit at line 1 column 58"},
    {"r09_dtype_map_emptyobj", R"({"w":{"dtype":{"U8":{}},"shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: map, expected unit at line 1 column 58"},
    {"r09_dtype_map_null", R"({"w":{"dtype":{"U8":null},"shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"r09_dtype_map_two", R"({"w":{"dtype":{"U8":null,"I8":null},"shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid value: map, expected map with a single key at line 1 column 70"},
    {"r09_dtype_map_unknown", R"({"w":{"dtype":{"F7":null},"shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "unknown variant `F7`, expected one of `BOOL`, `F4`, `F6_E2M3`, `F6_E3M2`, `U8`, `I8`, `F8_"},
    {"r09_dtype_unknown", R"({"w":{"dtype":"F7","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "unknown variant `F7`, expected one of `BOOL`, `F4`, `F6_E2M3`, `F6_E3M2`, `U8`, `I8`, `F8_"},
    {"r09_entry_array0", R"({"w":[]})", 2, std::nullopt, false, "invalid length 0, expected struct TensorInfo with 3 elements at line 1 column 8"},
    {"r09_entry_array2", R"({"w":["U8",[2]]})", 2, std::nullopt, false, "invalid length 2, expected struct TensorInfo with 3 elements at line 1 column 16"},
    {"r09_entry_array3", R"({"w":["U8",[2],[0,2]]})", 2, std::nullopt, true, ""},
    {"r09_entry_array3_badshape", R"({"w":["U8",[2.0],[0,2]]})", 2, std::nullopt, false, "invalid type: floating point `2.0`, expected usize at line 1 column 24"},
    {"r09_entry_array4", R"({"w":["U8",[2],[0,2],1]})", 2, std::nullopt, false, "invalid length 4, expected 3 elements in sequence at line 1 column 24"},
    {"r09_entry_empty_obj", R"({"w":{}})", 2, std::nullopt, false, "missing field `dtype` at line 1 column 8"},
    {"r09_entry_null", R"({"w":null})", 2, std::nullopt, false, "invalid type: null, expected struct TensorInfo at line 1 column 10"},
    {"r09_entry_string", R"({"w":"U8"})", 2, std::nullopt, false, "invalid type: string 'U8', expected struct TensorInfo at line 1 column 10"},
    {"r09_extra_key", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"extra":"x"}})", 2, std::nullopt, true, ""},
    {"r09_extra_key_nested", R"({"w":{"dtype":"U8","extra":{"a":[1,{"b":null}]},"shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"r09_metadata_in_array_form", R"({"__metadata__":[],"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: sequence, expected a map at line 1 column 16"},
    {"r09_missing_dtype", R"({"w":{"shape":[2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "missing field `dtype` at line 1 column 40"},
    {"r09_offsets_float", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2.0]}})", 2, std::nullopt, false, "invalid type: floating point `2.0`, expected usize at line 1 column 55"},
    {"r09_offsets_minus0", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[-0,2]}})", 2, std::nullopt, false, "invalid type: floating point `-0.0`, expected usize at line 1 column 54"},
    {"r09_offsets_object", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":{"a":0,"b":2}}})", 2, std::nullopt, false, "invalid type: map, expected a tuple of size 2 at line 1 column 61"},
    {"r09_offsets_one", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[2]}})", 2, std::nullopt, false, "invalid length 1, expected a tuple of size 2 at line 1 column 51"},
    {"r09_offsets_three", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2,2]}})", 2, std::nullopt, false, "invalid length 3, expected 2 elements in sequence at line 1 column 55"},
    {"r09_shape_2p64", R"({"w":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: floating point `1.8446744073709552e+19`, expected usize at line 1 column 72"},
    {"r09_shape_big_exp_int", R"({"w":{"dtype":"U8","shape":[1E1],"data_offsets":[0,10]}})", 10, std::nullopt, false, "invalid type: floating point `10.0`, expected usize at line 1 column 56"},
    {"r09_shape_exp", R"({"w":{"dtype":"U8","shape":[2e0],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: floating point `2.0`, expected usize at line 1 column 55"},
    {"r09_shape_float", R"({"w":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: floating point `2.0`, expected usize at line 1 column 55"},
    {"r09_shape_int", R"({"w":{"dtype":"U8","shape":2,"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: integer `2`, expected a sequence at line 1 column 51"},
    {"r09_shape_leading_zero", R"({"w":{"dtype":"U8","shape":[02],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid number at line 1 column 30"},
    {"r09_shape_minus0", R"({"w":{"dtype":"U8","shape":[2,-0],"data_offsets":[0,0]}})", 0, std::nullopt, false, "invalid type: floating point `-0.0`, expected usize at line 1 column 56"},
    {"r09_shape_neg", R"({"w":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid value: integer `-2`, expected usize at line 1 column 54"},
    {"r09_shape_null", R"({"w":{"dtype":"U8","shape":null,"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: null, expected a sequence at line 1 column 54"},
    {"r09_shape_object", R"({"w":{"dtype":"U8","shape":{"0":2},"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: map, expected a sequence at line 1 column 57"},
    {"r09_shape_string", R"({"w":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}})", 2, std::nullopt, false, "invalid type: string '2', expected usize at line 1 column 55"},
    {"r09_shape_u64max", R"({"w":{"dtype":"U8","shape":[18446744073709551615,0],"data_offsets":[0,0]}})", 0, std::nullopt, true, ""},
    {"r10_first_not_zero", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3, std::nullopt, false, "invalid offset for tensor `a`"},
    {"r10_hole", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})", 5, std::nullopt, false, "invalid offset for tensor `b`"},
    {"r10_overlap", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3, std::nullopt, false, "invalid offset for tensor `b`"},
    {"r11_reversed", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,0]}})", 2, std::nullopt, false, "invalid offset for tensor `a`"},
    {"r12_bits_overflow", R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0, std::nullopt, false, "overflow computing buffer size from shape and/or element type"},
    {"r12_elements_overflow", R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0, std::nullopt, false, "overflow computing buffer size from shape and/or element type"},
    {"r12_zero_dim_overflow", R"({"a":{"dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", 0, std::nullopt, true, ""},
    {"r13_subbyte_ok", R"({"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 2, std::nullopt, true, ""},
    {"r13_subbyte_partial", R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2, std::nullopt, false, "The slice is slicing for subbytes dtypes, and the slice does not end up at a byte boundary"},
    {"r14_size_mismatch", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, std::nullopt, false, "invalid shape, data type, or offset for tensor"},
    {"r15_trailing", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 3, std::nullopt, false, "incomplete metadata, file not fully covered"},
    {"r15_truncated", R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 1, std::nullopt, false, "incomplete metadata, file not fully covered"},
  };
  return cases;
}
// clang-format on

}  // namespace

TEST_CASE("reference verdicts: weightcast loads exactly the files safetensors 0.8.0 loads, one "
          "case per rule",
          "[safetensors][reference]") {
  using namespace weightcast;
  test::TempDir dir;
  for (const auto& c : reference_cases()) {
    INFO(c.name << (c.reference_loads ? ": the reference loads it"
                                      : ": the reference refuses it: ")
                << c.reference_error);
    std::string bytes;
    if (c.length == -1) {
      bytes = c.header;
    } else {
      bytes = test::le64(c.length ? static_cast<std::uint64_t>(*c.length) : c.header.size()) +
              c.header + test::zeros(c.data_bytes);
    }
    const auto path = dir / (std::string(c.name) + ".safetensors");
    test::write_file(path, bytes);
    std::optional<Error> refusal;
    try {
      read_safetensors_header(path, std::string(c.name));
    } catch (const Error& e) {
      refusal = e;
    }
    if (refusal) {
      INFO("weightcast: " << refusal->what());
      CHECK(!c.reference_loads);
      CHECK(refusal->code() == Errc::invalid_checkpoint);
    } else {
      CHECK(c.reference_loads);
    }
  }
}
