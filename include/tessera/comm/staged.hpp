#pragma once
//! \file Collectives over a few host values, staged through backend memory
//! when the communicator works on device buffers, and the one way ranks agree
//! on a verdict. Everything here is collective: every rank of the
//! communicator calls it, in the same order.
//!
//! C is any communicator (a comm::handle<B>, comm::mpi, comm::nccl, ...).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/comm/label.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"

namespace tessera::comm {

//! In-place all-reduce of host values v.
template <class C, element_type T>
void all_reduce_host(C& c, std::span<T> v, reduce_op op) {
  using B = typename C::backend_type;
  if constexpr (std::is_same_v<B, backend::host>) {
    c.all_reduce(v.data(), v.data(), v.size(), dtype_of_v<T>, op);
  } else {
    using ops = backend_ops<B>;
    typename ops::template buffer<T> d(v.size());
    ops::copy_from_host(d.span(), std::span<const T>(v));
    c.all_reduce(d.data(), d.data(), v.size(), dtype_of_v<T>, op);
    ops::copy_to_host(v, std::span<const T>(d.span()));
  }
}

//! Device bytes all_gather_host stages through at most (its own and every
//! rank's piece of one chunk), whatever it gathers: gather_main moves a whole
//! unit of main weights, which is not in any memory estimate.
inline constexpr std::size_t staged_gather_bytes = std::size_t(16) << 20;

//! full (size() x local.size() host values) receives every rank's local.
//! Where the communicator works on device buffers, through device memory in
//! chunks of at most `stage_bytes` (each rank's local.size() must be the same,
//! as for any all-gather, so every rank runs the same chunks).
template <class C, element_type T>
void all_gather_host(C& c, std::span<const T> local, std::span<T> full,
                     std::size_t stage_bytes = staged_gather_bytes) {
  const std::size_t n = local.size(), P = std::size_t(c.size());
  TESSERA_CHECK(full.size() == n * P, "all_gather_host: ", full.size(), " elements to receive ", n, " from each of ",
                P, " ranks");
  using B = typename C::backend_type;
  if constexpr (std::is_same_v<B, backend::host>) {
    c.all_gather(local.data(), full.data(), n, dtype_of_v<T>);
  } else if (P == 1) {  // nothing to send: no device staging
    std::copy(local.begin(), local.end(), full.begin());
  } else {
    using ops = backend_ops<B>;
    const std::size_t chunk = std::clamp<std::size_t>(stage_bytes / sizeof(T) / (P + 1), 1, std::max<std::size_t>(n, 1));
    typename ops::template buffer<T> d_local(chunk), d_full(chunk * P);
    const std::span<const T> gathered = d_full.span();
    for (std::size_t at = 0; at < n; at += chunk) {
      const std::size_t k = std::min(chunk, n - at);
      ops::copy_from_host(d_local.span().first(k), local.subspan(at, k));
      c.all_gather(d_local.data(), d_full.data(), k, dtype_of_v<T>);
      for (std::size_t r = 0; r < P; ++r)  // rank r's piece of this chunk, straight to its place in full
        ops::copy_to_host(full.subspan(r * n + at, k), gathered.subspan(r * k, k));
    }
  }
}

//! Whether `mine` holds on every rank: one one-byte min all-reduce.
template <class C>
[[nodiscard]] bool all_agree(C& c, bool mine) {
  std::uint8_t v = mine ? 1 : 0;
  all_reduce_host(c, std::span<std::uint8_t>(&v, 1), reduce_op::min);
  return v != 0;
}

//! Whether every rank passed the same value (its top 63 bits): one
//! all-reduce of (v, ~v) under max. Where any two ranks differ, no rank holds
//! both maxima, so every rank returns false; nobody is left waiting.
template <class C>
[[nodiscard]] bool all_same(C& c, std::uint64_t v) {
  const std::int64_t mine[2] = {std::int64_t(v >> 1), std::int64_t((~v) >> 1)};
  std::int64_t got[2] = {mine[0], mine[1]};
  all_reduce_host(c, std::span<std::int64_t>(got, 2), reduce_op::max);
  return got[0] == mine[0] && got[1] == mine[1];
}

//! buf (host memory) receives rank root's buf.
template <class C, element_type T>
void broadcast_host(C& c, std::span<T> buf, int root) {
  using B = typename C::backend_type;
  if constexpr (std::is_same_v<B, backend::host>) {
    c.broadcast(buf.data(), buf.size(), dtype_of_v<T>, root);
  } else {
    using ops = backend_ops<B>;
    typename ops::template buffer<T> d(buf.size());
    ops::copy_from_host(d.span(), std::span<const T>(buf));
    c.broadcast(d.data(), buf.size(), dtype_of_v<T>, root);
    ops::copy_to_host(buf, std::span<const T>(d.span()));
  }
}

//! Ends a step that may have failed on some ranks: the failing ones rethrow
//! their own error; the others throw "`what` failed on rank R: <R's error>"
//! with the lowest failing rank's message, so every rank's log says why even
//! where the launcher stops the job at the first exit. Nobody is left
//! waiting, and nobody goes on alone.
template <class C>
void agree_or_throw(C& c, const std::exception_ptr& error_here, std::string_view what) {
  // Labelled, so that a rank that alone reached this point (a save called
  // on one rank) is named by the order check and the trace as doing `what`.
  const std::string name(what);
  const label lbl("agree", name.c_str());
  std::int32_t first = error_here ? c.rank() : c.size();  // the lowest failing rank, or size(): none
  all_reduce_host(c, std::span<std::int32_t>(&first, 1), reduce_op::min);
  if (first == c.size()) return;
  std::array<std::uint8_t, 1024> why{};  // NUL-terminated text
  if (first == c.rank()) {
    try {
      std::rethrow_exception(error_here);
    } catch (const std::exception& e) {
      std::string_view m = e.what();
      if (m.starts_with("tessera: ")) m.remove_prefix(9);
      std::memcpy(why.data(), m.data(), std::min(m.size(), why.size() - 1));
    } catch (...) {
    }
  }
  broadcast_host(c, std::span<std::uint8_t>(why), first);
  if (error_here) std::rethrow_exception(error_here);
  ::tessera::detail::fail(std::string(what) + " failed on rank " + std::to_string(first) + " (" + reinterpret_cast<const char*>(why.data()) +
       "); nothing was changed here");
}

}  // namespace tessera::comm
