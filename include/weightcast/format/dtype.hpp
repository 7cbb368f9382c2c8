/**
 * @file dtype.hpp
 * @brief The 22 element types of the safetensors format.
 *
 * Names and bit widths follow the safetensors crate's `Dtype` enum
 * (huggingface/safetensors, `safetensors/src/tensor.rs`). weightcast never interprets tensor
 * bytes: a dtype only decides how many bytes a shape occupies. Sub-byte dtypes (F4: 4 bits,
 * F6_E2M3 / F6_E3M2: 6 bits) pack elements without padding, so their element count times
 * bits must be a multiple of 8.
 */
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace weightcast {

/// A safetensors dtype. The order is the crate's. The catalogue wire format carries it as
/// one byte (catalogue_wire.hpp), so a change of order needs a new `catalogue_wire_version`.
enum class Dtype : std::uint8_t {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8,
  F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
};

/// Number of dtypes the format defines (22).
inline constexpr std::size_t dtype_count = 22;

/// @return bits per element: 4 (F4), 6 (F6_*), 8, 16, 32 or 64 (C64 is two F32); 0 for a
///         value outside the enum.
std::uint32_t dtype_bits(Dtype dtype) noexcept;

/// @return the dtype's name exactly as written in a safetensors header, e.g. "BF16"; "?" for
///         a value outside the enum.
std::string_view dtype_name(Dtype dtype) noexcept;

/// @return the dtype named @p name (case-sensitive, as in the header), or nullopt if the
///         format has no such dtype.
std::optional<Dtype> parse_dtype(std::string_view name) noexcept;

}  // namespace weightcast
