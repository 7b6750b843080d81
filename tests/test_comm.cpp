// comm::mpi and comm::local collectives, their error path, and ShardedTensor,
// at every world size meson runs this under.
#define BOOST_TEST_MODULE tessera_comm
#include "common/mpi_test_main.hpp"
#include "common/staged_gather.hpp"
#include "common/util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "tessera/tessera.hpp"

using namespace tessera;
using tessera_test::uniform;

namespace {
// Small integers: exactly representable and summed exactly in every dtype.
template <class T> T value(int rank, std::size_t i, int salt = 0) {
  return convert<T>(double((rank * 7 + int(i) * 3 + salt) % 17 - 8));
}
using all_types = std::tuple<float, double, bf16, fp16, std::int64_t>;
using float_types = std::tuple<float, double, bf16, fp16>;
}  // namespace

BOOST_AUTO_TEST_SUITE(mpi_collectives)

BOOST_AUTO_TEST_CASE_TEMPLATE(all_gather_every_rank_block, T, all_types) {
  comm::mpi c;
  const int N = c.size(), r = c.rank();
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(13)}) {
    std::vector<T> send(n), recv(n * std::size_t(N), convert<T>(99.0));
    for (std::size_t i = 0; i < n; ++i) send[i] = value<T>(r, i);
    comm::all_gather(c, std::span<const T>(send), std::span<T>(recv));
    for (int q = 0; q < N; ++q)
      for (std::size_t i = 0; i < n; ++i) BOOST_TEST(convert<double>(recv[q * n + i]) == convert<double>(value<T>(q, i)));
    // in place: each rank's block already sits at its offset
    std::vector<T> inplace(n * std::size_t(N), convert<T>(99.0));
    for (std::size_t i = 0; i < n; ++i) inplace[std::size_t(r) * n + i] = value<T>(r, i);
    c.all_gather(inplace.data() + std::size_t(r) * n, inplace.data(), n, dtype_of_v<T>);
    for (std::size_t k = 0; k < inplace.size(); ++k) BOOST_TEST(convert<double>(inplace[k]) == convert<double>(recv[k]));
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(reduce_scatter_and_all_reduce, T, float_types) {
  comm::mpi c;
  const int N = c.size(), r = c.rank();
  const std::size_t n = 11;
  std::vector<T> send(n * std::size_t(N));
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = value<T>(r, i);
  for (auto op : {comm::reduce_op::sum, comm::reduce_op::max, comm::reduce_op::min, comm::reduce_op::avg}) {
    BOOST_TEST_CONTEXT("op " << comm::name_of(op) << " type " << tessera_test::type_name<T>()) {
      auto expect = [&](std::size_t i) {
        double s = 0, mx = -1e300, mn = 1e300;
        for (int q = 0; q < N; ++q) {
          const double v = convert<double>(value<T>(q, i));
          s += v, mx = std::max(mx, v), mn = std::min(mn, v);
        }
        return op == comm::reduce_op::sum ? s : op == comm::reduce_op::max ? mx : op == comm::reduce_op::min ? mn : s / N;
      };
      const double tol = op == comm::reduce_op::avg ? 4 * epsilon_of<T> * 8 : 0.0;
      std::vector<T> recv(n, convert<T>(99.0));
      comm::reduce_scatter(c, std::span<const T>(send), std::span<T>(recv), op);
      for (std::size_t i = 0; i < n; ++i)
        BOOST_TEST(std::abs(convert<double>(recv[i]) - expect(std::size_t(r) * n + i)) <= tol);
      std::vector<T> all = send;
      comm::all_reduce(c, std::span<T>(all), op);
      for (std::size_t i = 0; i < all.size(); ++i) BOOST_TEST(std::abs(convert<double>(all[i]) - expect(i)) <= tol);
      // non-blocking forms give the same
      std::vector<T> recv2(n), all2(send.size());
      auto q1 = c.ireduce_scatter(send.data(), recv2.data(), n, dtype_of_v<T>, op);
      auto q2 = c.iall_reduce(send.data(), all2.data(), send.size(), dtype_of_v<T>, op);
      BOOST_TEST(q1.pending());
      q2.wait();
      q1.wait();
      BOOST_TEST(!q1.pending());
      for (std::size_t i = 0; i < n; ++i) BOOST_TEST(convert<double>(recv2[i]) == convert<double>(recv[i]));
      for (std::size_t i = 0; i < all.size(); ++i) BOOST_TEST(convert<double>(all2[i]) == convert<double>(all[i]));
    }
  }
}

BOOST_AUTO_TEST_CASE(broadcast_from_every_root_and_nonblocking_gather) {
  comm::mpi c;
  for (int root = 0; root < c.size(); ++root) {
    std::vector<double> x(5, c.rank() == root ? 1.5 * root : -1.0);
    comm::broadcast(c, std::span<double>(x), root);
    for (double v : x) BOOST_TEST(v == 1.5 * root);
  }
  std::vector<float> s(3, float(c.rank())), g(3 * std::size_t(c.size()), -1.0f);
  auto q = c.iall_gather(s.data(), g.data(), 3, dtype::f32);
  q.wait();
  for (int k = 0; k < c.size(); ++k) BOOST_TEST(g[3 * std::size_t(k)] == float(k));
  c.barrier();
}

BOOST_AUTO_TEST_CASE(split_into_even_and_odd_ranks) {
  comm::mpi c;
  comm::mpi half = c.split(c.rank() % 2, c.rank());
  const int expected = (c.size() + (c.rank() % 2 == 0 ? 1 : 0)) / 2;
  BOOST_TEST(half.size() == expected);
  BOOST_TEST(half.rank() == c.rank() / 2);
  std::vector<std::int64_t> v{c.rank()};
  comm::all_reduce(half, std::span<std::int64_t>(v), comm::reduce_op::sum);
  std::int64_t want = 0;
  for (int q = c.rank() % 2; q < c.size(); q += 2) want += q;
  BOOST_TEST(v[0] == want);
}

BOOST_AUTO_TEST_CASE(failed_call_is_a_tessera_error_naming_operation_and_rank) {
  comm::mpi c;
  std::vector<float> x(4);
  try {
    c.broadcast(x.data(), x.size(), dtype::f32, c.size() + 3);  // no such root: every rank fails locally
    BOOST_FAIL("broadcast from a missing root did not throw");
  } catch (const tessera::error& e) {
    const std::string w = e.what();
    BOOST_TEST(w.rfind("tessera: MPI_Bcast failed on rank " + std::to_string(c.rank()), 0) == 0);
    BOOST_TEST(w.find("of " + std::to_string(c.size())) != std::string::npos);
  }
  c.barrier();  // the communicator still works afterwards
  std::vector<float> too_long(x.size() * std::size_t(c.size()) + 1);
  BOOST_CHECK_THROW(comm::all_gather(c, std::span<const float>(x), std::span<float>(too_long)), tessera::error);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(local_communicator_is_a_world_of_one) {
  comm::local<> c;
  std::vector<float> a{1, 2, 3}, b(3);
  comm::all_gather(c, std::span<const float>(a), std::span<float>(b));
  BOOST_TEST(b == a);
  comm::all_reduce(c, std::span<float>(b), comm::reduce_op::avg);
  BOOST_TEST(b == a);
  BOOST_CHECK_THROW(c.broadcast(b.data(), 3, dtype::f32, 1), tessera::error);
}

BOOST_AUTO_TEST_SUITE(sharded_tensor)

BOOST_AUTO_TEST_CASE_TEMPLATE(gather_scatter_and_reduce_scatter, T, float_types) {
  comm::mpi c;
  const int N = c.size(), r = c.rank();
  for (std::size_t align : {std::size_t(1), std::size_t(16)})
    for (const shape& s : {shape({1}), shape({3}), shape({7, 5}), shape({64}), shape({2, 0})}) {
      BOOST_TEST_CONTEXT("shape " << s.str() << " align " << align << " world " << N << " rank " << r) {
        ShardedTensor<T, backend::host> t(c, s, align);
        BOOST_TEST(t.padded_numel() % (std::size_t(N) * align) == 0u);
        std::vector<T> full(s.numel());
        for (std::size_t i = 0; i < full.size(); ++i) full[i] = convert<T>(uniform(i, s.numel(), 5));
        t.scatter_from(full);
        // poison: every element of the output must be written by the gather
        std::vector<T> out(s.numel(), convert<T>(std::numeric_limits<float>::quiet_NaN()));
        t.gather(out);
        for (std::size_t i = 0; i < out.size(); ++i) BOOST_TEST(convert<double>(out[i]) == convert<double>(full[i]));
        std::vector<T> padded(t.padded_numel(), convert<T>(std::numeric_limits<float>::quiet_NaN()));
        t.gather_padded(padded);
        for (std::size_t i = s.numel(); i < padded.size(); ++i) BOOST_TEST(convert<double>(padded[i]) == 0.0);
        // reduce-scatter: every rank contributes (rank + 1) * x; the shard gets the sum
        std::vector<T> contrib(t.padded_numel());
        for (std::size_t i = 0; i < contrib.size(); ++i) contrib[i] = convert<T>(double((i % 5) * (r + 1)));
        t.reduce_scatter_padded(contrib);
        const double ranks_sum = N * (N + 1) / 2.0;
        for (std::size_t i = 0; i < t.shard().size(); ++i)
          BOOST_TEST(convert<double>(t.shard()[i]) == double((t.global_offset() + i) % 5) * ranks_sum);
        BOOST_TEST(t.local().size() <= t.shard().size());
        std::vector<T> wrong(s.numel() + 1);
        BOOST_CHECK_THROW(t.gather(wrong), tessera::error);
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()

// comm::all_gather_host's staged path (a communicator on device buffers: the
// CUDA backend's) runs here on the host: a backend that is the host's in all
// but name takes it. Every rank's piece lands in its place, in as many
// collectives as chunks of at most `stage` bytes of staging, at counts and
// chunk sizes that do not divide. (test-strategies-cuda runs it on the GPU.)
namespace {
struct staged_on_host {};
}  // namespace
template <> struct tessera::backend_ops<staged_on_host> : tessera::backend_ops<tessera::backend::host> {};
namespace {
struct staged_view {  // comm::mpi under the staged backend's name, counting its all-gathers
  using backend_type = staged_on_host;
  comm::mpi& c;
  int calls = 0;
  std::size_t most = 0;  // the most elements a rank sent in one all-gather
  [[nodiscard]] int size() const { return c.size(); }
  [[nodiscard]] int rank() const { return c.rank(); }
  void all_gather(const void* s, void* r, std::size_t n, dtype t) {
    ++calls, most = std::max(most, n);
    c.all_gather(s, r, n, t);
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(all_gather_host_stages_in_chunks) {
  comm::mpi c;
  const std::size_t P = std::size_t(c.size());
  for (const std::size_t n : tessera_test::staged_gather_counts)
    for (const std::size_t stage : tessera_test::staged_gather_bounds) {
      staged_view v{c};
      BOOST_TEST(tessera_test::misplaced_by_all_gather_host(v, n, stage) == 0u,
                 "n " << n << ", stage " << stage << " B, " << P << " ranks");
      // Each chunk stages this rank's piece and every rank's, P + 1 pieces: at most `stage` bytes (or
      // one element each), in as few chunks as that allows. One rank stages nothing.
      const std::size_t bytes = v.most * (P + 1) * sizeof(std::int64_t);
      if (P == 1 || n == 0) {
        BOOST_TEST(v.calls == 0);
      } else {
        BOOST_TEST(bytes <= std::max(stage, (P + 1) * sizeof(std::int64_t)), "n " << n << ", stage " << stage);
        BOOST_TEST(std::size_t(v.calls) == (n + v.most - 1) / v.most, "n " << n << ", stage " << stage);
        BOOST_TEST((v.most == n || (v.most + 1) * (P + 1) * sizeof(std::int64_t) > stage), "n " << n << ", stage " << stage);
      }
    }
  staged_view v{c};  // full must hold P x local: one clear error, nothing sent
  std::vector<std::int64_t> one(3), short_full(3 * P - 1);
  BOOST_CHECK_THROW(comm::all_gather_host(v, std::span<const std::int64_t>(one), std::span<std::int64_t>(short_full)),
                    tessera::error);
  BOOST_TEST(v.calls == 0);
}
