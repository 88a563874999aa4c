// spmd/collectives/fingerprint.cpp: building and comparing collective fingerprints
// (Note [Collective fingerprint]).
#include <spmd/collectives/fingerprint.h>

#include <algorithm>
#include <cstring>

#include <spmd/core/error.h>
#include <spmd/core/hash.h>

namespace spmd {
namespace {

void copy_text(char* dst, size_t capacity, std::string_view text) {
  const size_t n = std::min(capacity - 1, text.size());
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

std::string fingerprint_shape(const CollectiveFingerprint& f) {
  std::string out = "[";
  for (int d = 0; d < f.ndim; ++d) {
    if (d == kFingerprintDims) {
      out += ", ...";
      break;
    }
    out += fmt::format("{}{}", d ? ", " : "", f.dims[d]);
  }
  return out + "]";
}

}  // namespace

CollectiveFingerprint make_fingerprint(const FingerprintInput& in) {
  const Tensor& x = *in.input;
  CollectiveFingerprint f;
  std::memset(&f, 0, sizeof f);  // padding included: the bytes travel as they are
  const CollectiveKind kind = kind_of(*in.options);
  f.kind = static_cast<int32_t>(kind);
  f.dtype = static_cast<int32_t>(x.dtype());
  f.ndim = static_cast<int32_t>(x.dim());
  const bool rows_may_differ = is_ragged(kind);  // Note [Ragged collectives]
  size_t shape_hash = 0;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < kFingerprintDims) f.dims[d] = x.size(d);
    if (!(rows_may_differ && d == 0)) hash_combine(shape_hash, x.size(d));
  }
  f.shape_hash = shape_hash;
  f.options_hash = shared_hash(*in.options);
  size_t group_hash = hash_range(*in.group);
  hash_combine(group_hash, std::string(in.dim_name));
  f.group_hash = group_hash;
  f.group_size = static_cast<int32_t>(in.group->size());
  copy_text(f.dim_name, sizeof f.dim_name, in.dim_name);
  copy_text(f.detail, sizeof f.detail, describe(*in.options));
  if (in.with_site) {
    f.sequence = in.sequence;
    copy_text(f.site, sizeof f.site, site_text(in.location));
  }
  return f;
}

std::string fingerprint_text(const CollectiveFingerprint& f, bool fingerprint) {
  std::string text = fmt::format("{} {} {}", static_cast<CollectiveKind>(f.kind),
                                 fingerprint_shape(f), static_cast<DType>(f.dtype));
  if (f.detail[0] != '\0') text += fmt::format(" {}", f.detail);
  if (fingerprint) text += fmt::format(" (call #{} at {})", f.sequence, f.site);
  return text;
}

void check_fingerprints(const CollectiveCall& call, std::span<const CollectiveFingerprint> all,
                        const std::vector<int>& members, bool fingerprint, bool same_site) {
  auto list = [&](auto&& text_of) {
    std::string out;
    for (size_t k = 0; k < all.size(); ++k) {
      out += fmt::format("{}rank {}: {}", k ? ", " : "", members[k], text_of(all[k]));
    }
    return out;
  };
  const CollectiveFingerprint& first = all[0];
  bool same_kind = true;
  bool same_tensor = true;
  bool same_rest = true;
  bool same_group = true;
  for (const CollectiveFingerprint& f : all) {
    same_kind &= f.kind == first.kind;
    same_tensor &=
        f.dtype == first.dtype && f.ndim == first.ndim && f.shape_hash == first.shape_hash;
    same_rest &= f.options_hash == first.options_hash && f.sequence == first.sequence;
    same_group &= f.group_hash == first.group_hash && f.group_size == first.group_size;
  }
  if (!same_group) {
    throw_error<CollectiveMismatchError>(
        "{}: the members of this communicator think they are in different groups (were the "
        "mesh dims' communicators created in different orders on different ranks?): {}",
        describe_call(call), list([&](const CollectiveFingerprint& f) {
          return fmt::format("mesh dim '{}', a group of {} ranks, {}", f.dim_name, f.group_size,
                             fingerprint_text(f, fingerprint));
        }));
  }
  bool same_line = true;
  if (same_site) {
    for (const CollectiveFingerprint& f : all) {
      same_line &= std::string_view(f.site, strnlen(f.site, sizeof f.site)) ==
                   std::string_view(first.site, strnlen(first.site, sizeof first.site));
    }
  }
  if (!same_line) {
    throw_error<CollectiveMismatchError>(
        "{}: the ranks are at different DTensor ops, so the debug checks' gathers of them do not "
        "meet (a rank skipped or added a call before this point): {}",
        describe_call(call),
        list([&](const CollectiveFingerprint& f) { return fingerprint_text(f, fingerprint); }));
  }
  if (!same_kind || !same_rest || (fingerprint && !same_tensor)) {
    throw_error<CollectiveMismatchError>(
        "{}: the ranks of the group issued different calls: {}", describe_call(call),
        list([&](const CollectiveFingerprint& f) { return fingerprint_text(f, fingerprint); }));
  }
  if (!same_tensor) {
    // The message of check_group (the sim backend's), so both backends report alike.
    const bool rows_may_differ = is_ragged(static_cast<CollectiveKind>(first.kind));
    throw_error<CommError>(
        "{}: inputs differ within the group{}: {}", describe_call(call),
        rows_may_differ ? " (beyond dim 0)" : "", list([](const CollectiveFingerprint& f) {
          return fmt::format("{} {}", fingerprint_shape(f), static_cast<DType>(f.dtype));
        }));
  }
}

}  // namespace spmd
