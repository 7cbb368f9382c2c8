#include "weightcast/format/dtype.hpp"

#include <array>

namespace weightcast {
namespace {

struct DtypeRow {
  Dtype dtype;
  std::string_view name;
  std::uint32_t bits;
};

// Same order as the enum, so a row is found by the enum's value. Widths from the safetensors
// crate's `Dtype::bitsize` (C64 is a pair of F32).
constexpr std::array<DtypeRow, dtype_count> dtype_rows{{
    {Dtype::BOOL, "BOOL", 8},
    {Dtype::F4, "F4", 4},
    {Dtype::F6_E2M3, "F6_E2M3", 6},
    {Dtype::F6_E3M2, "F6_E3M2", 6},
    {Dtype::U8, "U8", 8},
    {Dtype::I8, "I8", 8},
    {Dtype::F8_E5M2, "F8_E5M2", 8},
    {Dtype::F8_E4M3, "F8_E4M3", 8},
    {Dtype::F8_E8M0, "F8_E8M0", 8},
    {Dtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {Dtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {Dtype::I16, "I16", 16},
    {Dtype::U16, "U16", 16},
    {Dtype::F16, "F16", 16},
    {Dtype::BF16, "BF16", 16},
    {Dtype::I32, "I32", 32},
    {Dtype::U32, "U32", 32},
    {Dtype::F32, "F32", 32},
    {Dtype::C64, "C64", 64},
    {Dtype::F64, "F64", 64},
    {Dtype::I64, "I64", 64},
    {Dtype::U64, "U64", 64},
}};

constexpr bool rows_follow_enum() {
  for (std::size_t i = 0; i < dtype_rows.size(); ++i) {
    if (static_cast<std::size_t>(dtype_rows[i].dtype) != i) return false;
  }
  return true;
}
static_assert(rows_follow_enum(), "dtype_rows must list the dtypes in enum order");

const DtypeRow* find_row(Dtype dtype) noexcept {
  auto index = static_cast<std::size_t>(dtype);
  return index < dtype_rows.size() ? &dtype_rows[index] : nullptr;
}

}  // namespace

std::uint32_t dtype_bits(Dtype dtype) noexcept {
  const DtypeRow* row = find_row(dtype);
  return row != nullptr ? row->bits : 0;
}

std::string_view dtype_name(Dtype dtype) noexcept {
  const DtypeRow* row = find_row(dtype);
  return row != nullptr ? row->name : std::string_view("?");
}

std::optional<Dtype> parse_dtype(std::string_view name) noexcept {
  for (const auto& row : dtype_rows) {
    if (row.name == name) return row.dtype;
  }
  return std::nullopt;
}

}  // namespace weightcast
