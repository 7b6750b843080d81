#pragma once
//! \file The collective-order check: before a collective, every rank agrees
//! on a fingerprint of (sequence, operation, count, dtype, label) with one
//! 16-byte all-reduce, so a program that diverged (a unit reduced out of
//! order, a collective one rank skipped) fails at the first wrong call with a
//! `tessera:` error naming what each rank issued, instead of deadlocking or
//! reducing the wrong buffers. The communicators call it (comm::mpi on its own
//! communicator, comm::nccl over its MPI bootstrap); it costs one tiny host
//! all-reduce per collective.
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tessera/comm/trace.hpp"
#include "tessera/core/checksum.hpp"
#include "tessera/core/dtype.hpp"

namespace tessera::comm::detail {

//! One collective as the order check compares it (fixed size: gathered as bytes).
struct call_desc {
  std::uint64_t seq = 0;
  std::uint64_t count = 0;
  std::uint32_t type = 0;
  std::array<char, 20> op{};
  std::array<char, 72> label{};
};

[[nodiscard]] inline call_desc describe_call(std::uint64_t seq, const char* op, std::size_t count, dtype t) {
  call_desc d;
  d.seq = seq;
  d.count = count;
  d.type = std::uint32_t(t);
  std::strncpy(d.op.data(), op, d.op.size() - 1);
  trace::write_label(d.label);
  return d;
}

// Fixed size, zero-filled beyond each string, no padding: its bytes are its value.
static_assert(std::has_unique_object_representations_v<call_desc>);
[[nodiscard]] inline std::uint64_t fingerprint(const call_desc& d) noexcept { return checksum64::of(&d, sizeof d); }

[[nodiscard]] inline std::string show(const call_desc& d) {
  return trace::call_text(d.op.data(), d.seq, d.count, dtype(d.type), d.label.data());
}

//! Runs the check. max2(int64[2]) all-reduces two values under max in place;
//! gather(const call_desc&, call_desc* all) all-gathers every rank's
//! descriptor. Returns empty when every rank issues the same collective,
//! else the message (the same on every rank).
template <class Max2, class Gather>
[[nodiscard]] std::string order_mismatch(const call_desc& mine, int size, int channel, Max2&& max2, Gather&& gather) {
  const std::uint64_t f = fingerprint(mine);
  // Where any two ranks differ, no rank holds both maxima of (f, ~f): every
  // rank sees the mismatch, so all of them take the gather below.
  const std::int64_t want[2] = {std::int64_t(f >> 1), std::int64_t((~f) >> 1)};
  std::int64_t got[2] = {want[0], want[1]};
  max2(got);
  if (got[0] == want[0] && got[1] == want[1]) return {};
  std::vector<call_desc> all(static_cast<std::size_t>(size));
  gather(mine, all.data());
  std::map<std::string, std::vector<int>> by_call;  // what was issued -> by which ranks
  for (int r = 0; r < size; ++r) by_call[show(all[std::size_t(r)])].push_back(r);
  std::string msg = "collective order differs between ranks on communicator " + std::to_string(channel) + ": ";
  bool first = true;
  for (const auto& [call, ranks] : by_call) {
    msg += first ? "" : "; ";
    first = false;
    msg += ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (i) msg += ',';  // (appending "," + to_string trips g++ 12's -Wrestrict, a false positive)
      msg += std::to_string(ranks[i]);
    }
    msg += " issued " + call;
  }
  return msg + ". Every rank must issue the same collectives in the same order (the same units reduced and "
               "gathered in the same order, the same number of micro-batches, get_param/set_param on every rank)";
}

}  // namespace tessera::comm::detail
