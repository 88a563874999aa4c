// spmd/backends/nccl/unique_id.h: the text form of an ncclUniqueId, as spmdrun passes it to its
// ranks.
//
// spmdrun calls ncclGetUniqueId once (no GPU needed) and puts the 128 bytes, as 256 lowercase hex
// digits, in every rank's environment under kUniqueIdVariable; the nccl backend reads it back.
// Header-only and free of spmdsim dependencies, so spmdrun links NCCL alone.
#pragma once

#include <nccl.h>

#include <optional>
#include <string>
#include <string_view>

namespace spmd {

inline constexpr const char* kUniqueIdVariable = "SPMD_NCCL_UNIQUE_ID";

// 256 lowercase hex digits, two per byte in order.
inline std::string unique_id_to_hex(const ncclUniqueId& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * NCCL_UNIQUE_ID_BYTES);
  for (char c : id.internal) {
    const auto byte = static_cast<unsigned char>(c);
    text += kDigits[byte >> 4];
    text += kDigits[byte & 0xf];
  }
  return text;
}

// The id of unique_id_to_hex's text (either case); nullopt unless it is exactly 256 hex digits.
inline std::optional<ncclUniqueId> unique_id_from_hex(std::string_view text) {
  if (text.size() != 2 * NCCL_UNIQUE_ID_BYTES) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  ncclUniqueId id{};
  for (size_t i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) {
    const int hi = digit(text[2 * i]);
    const int lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    id.internal[i] = static_cast<char>((hi << 4) | lo);
  }
  return id;
}

}  // namespace spmd
