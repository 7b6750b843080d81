// Tensor parallelism's first layer (issue 65): comm::make_tp_groups (tp
// innermost, the data-parallel world across the groups, bad sizes refused on
// every rank) and the host building blocks of trainer_kit/host_tp.hpp
// (column- and row-parallel products, the vocab-parallel embedding and
// cross-entropy), each against the one-rank computation every rank also
// runs on the same random data, at every tensor-parallel size that divides
// the world; tp::split (every global element held once, Megatron's packed
// qkv slices) and sliced initializers (a slice's values are the global
// tensor's); the optimizer's global norm over (dp, tp) under four
// strategies and wrappers.
#define BOOST_TEST_MODULE tessera_tp
#include "common/mpi_test_main.hpp"
#include "common/util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <tuple>
#include <vector>

#include "tessera/tessera.hpp"
#include "trainer_kit/host_layers.hpp"
#include "trainer_kit/host_tp.hpp"

using namespace tessera;
namespace tp_kit = trainer_kit::host_tp;

namespace {
std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = scale * (float(double(splitmix64(seed * 1000003 + i) >> 11) / 9007199254740992.0) * 2.0f - 1.0f);
  return v;
}
// Rows [first, first + count) of a row-major [rows, w] matrix.
std::vector<float> rows_of(const std::vector<float>& m, std::size_t w, tp_kit::part p) {
  return {m.begin() + std::ptrdiff_t(p.first * w), m.begin() + std::ptrdiff_t((p.first + p.count) * w)};
}
// Columns [first, first + count) of a row-major [rows, w] matrix.
std::vector<float> cols_of(const std::vector<float>& m, std::size_t w, tp_kit::part p) {
  std::vector<float> out;
  for (std::size_t r = 0; r < m.size() / w; ++r)
    out.insert(out.end(), m.begin() + std::ptrdiff_t(r * w + p.first), m.begin() + std::ptrdiff_t(r * w + p.first + p.count));
  return out;
}
void check_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  BOOST_TEST_REQUIRE(got.size() == want.size());
  double worst = 0, big = 1e-30;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(double(got[i]) - double(want[i]))), big = std::max(big, std::fabs(double(want[i])));
  BOOST_TEST(worst <= tol * big, what << ": worst difference " << worst << " against values up to " << big);
}
// Every tensor-parallel size that divides the world.
template <class F>
void for_each_tp(F&& f) {
  comm::mpi world;
  for (int tp = 1; tp <= world.size(); ++tp)
    if (world.size() % tp == 0) {
      auto g = comm::make_tp_groups(world, tp);
      BOOST_TEST_CONTEXT("tp " << tp << " of " << world.size()) { f(g, world); }
    }
}
}  // namespace

BOOST_AUTO_TEST_CASE(tp_groups_are_consecutive_and_dp_strided) {
  for_each_tp([](auto& g, comm::mpi& world) {
    const int tp = g.tp_size(), r = world.rank();
    BOOST_TEST(g.tp.rank() == r % tp);
    BOOST_TEST(g.dp.rank() == r / tp);
    BOOST_TEST(g.dp_size() == world.size() / tp);
    // the tp group holds world ranks [g tp, (g + 1) tp): their sum says so
    std::vector<std::int64_t> v{r};
    comm::all_reduce(g.tp, std::span<std::int64_t>(v));
    const int first = r / tp * tp;
    BOOST_TEST(v[0] == std::int64_t(tp) * first + std::int64_t(tp) * (tp - 1) / 2);
    // a mesh over the data-parallel world (HSDP inside tp) splits as make_mesh always did
    auto m = comm::make_mesh(g.dp, 1);
    BOOST_TEST(m.world_size() == g.dp_size());
  });
}

BOOST_AUTO_TEST_CASE(bad_tp_sizes_fail_on_every_rank) {
  comm::mpi world;
  const int N = world.size();
  tessera_test::expect_error([&] { (void)comm::make_tp_groups(world, N + 1); }, "does not divide the world of");
  tessera_test::expect_error([&] { (void)comm::make_tp_groups(world, 0); }, "tensor-parallel size 0");
  if (N > 1)  // rank 0 asks for another size than the others: every rank hears of it
    tessera_test::expect_error([&] { (void)comm::make_tp_groups(world, world.rank() == 0 ? 1 : N); }, "ranks disagree");
  tessera_test::expect_error([] { (void)tp_kit::part_of(12, 5, 0, "--heads"); },
                             "--heads (12) does not split evenly");
}

BOOST_AUTO_TEST_CASE(column_and_row_products_equal_one_rank) {
  // An MLP's pair as Megatron splits it: h = x W1^T (column), y = y0 + h W2^T (row).
  const std::size_t n = 13, d = 12, f = 24;  // n odd; d and f divide 1..4 ranks
  const auto x = random_floats(n * d, 1), W1 = random_floats(f * d, 2, 0.3f), W2 = random_floats(d * f, 3, 0.3f);
  const auto y0 = random_floats(n * d, 4), dy = random_floats(n * d, 5);
  using tessera::host::gemm;
  // one rank
  std::vector<float> h(n * f), y = y0, dW1(f * d, 0.0f), dW2(d * f, 0.0f), dh(n * f), dx(n * d);
  gemm(false, true, int(n), int(f), int(d), 1.0f, x.data(), W1.data(), 0.0f, h.data());
  gemm(false, true, int(n), int(d), int(f), 1.0f, h.data(), W2.data(), 1.0f, y.data());
  gemm(true, false, int(d), int(f), int(n), 1.0f, dy.data(), h.data(), 1.0f, dW2.data());
  gemm(false, false, int(n), int(f), int(d), 1.0f, dy.data(), W2.data(), 0.0f, dh.data());
  gemm(true, false, int(f), int(d), int(n), 1.0f, dh.data(), x.data(), 1.0f, dW1.data());
  gemm(false, false, int(n), int(d), int(f), 1.0f, dh.data(), W1.data(), 0.0f, dx.data());
  for_each_tp([&](auto& g, comm::mpi&) {
    const auto p = tp_kit::part_of(f, g.tp_size(), g.tp.rank(), "the MLP's width");
    const auto W1l = rows_of(W1, d, p), W2l = cols_of(W2, f, p);
    std::vector<float> hl(n * p.count), yt = y0, dW1l(p.count * d, 0.0f), dW2l(d * p.count, 0.0f), dhl(n * p.count),
        dxt(n * d);
    gemm(false, true, int(n), int(p.count), int(d), 1.0f, x.data(), W1l.data(), 0.0f, hl.data());  // column: no sum
    tp_kit::row_forward(g.tp, hl.data(), W2l.data(), yt.data(), n, p.count, d, 1.0f);
    check_close(hl, cols_of(h, f, p), 1e-6, "column-parallel h");
    check_close(yt, y, 1e-5, "row-parallel y");
    tp_kit::row_backward(dy.data(), hl.data(), W2l.data(), dW2l.data(), dhl.data(), n, p.count, d);
    check_close(dW2l, cols_of(dW2, f, p), 1e-5, "row-parallel dW");
    check_close(dhl, cols_of(dh, f, p), 1e-5, "row-parallel dx");
    tp_kit::column_backward(g.tp, dhl.data(), x.data(), W1l.data(), dW1l.data(), dxt.data(), n, d, p.count);
    check_close(dW1l, rows_of(dW1, d, p), 1e-5, "column-parallel dW");
    check_close(dxt, dx, 1e-5, "column-parallel dx");
  });
}

BOOST_AUTO_TEST_CASE(vocab_parallel_embedding_and_loss_equal_one_rank) {
  const std::size_t n = 11, d = 8, vocab = 45, V = 48;  // 3 padded rows: every split but 1 ends in padding
  const auto table = random_floats(V * d, 6), dout = random_floats(n * d, 7);
  const auto z = random_floats(n * V, 8, 4.0f);
  std::vector<std::uint16_t> tokens(n), targets(n);
  for (std::size_t i = 0; i < n; ++i)
    tokens[i] = std::uint16_t(splitmix64(900 + i) % vocab), targets[i] = std::uint16_t(splitmix64(700 + i) % vocab);
  targets[2] = 0, targets[3] = vocab - 1, tokens[4] = tokens[5];  // the ends of the vocabulary; a repeated row
  // one rank: lookup, its table gradient, the loss and its gradient over the live columns
  std::vector<float> emb(n * d), dtable(V * d, 0.0f);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < d; ++c) emb[i * d + c] = table[tokens[i] * d + c], dtable[tokens[i] * d + c] += dout[i * d + c];
  std::vector<float> zl(n * vocab);
  for (std::size_t i = 0; i < n; ++i) std::copy_n(z.begin() + std::ptrdiff_t(i * V), vocab, zl.begin() + std::ptrdiff_t(i * vocab));
  const float scale = 1.0f / 37.0f;
  const double loss = trainer_kit::host::cross_entropy(zl.data(), targets.data(), n, vocab, scale);
  std::vector<float> dz(n * V, 0.0f);  // zl's gradient back in the padded width
  for (std::size_t i = 0; i < n; ++i) std::copy_n(zl.begin() + std::ptrdiff_t(i * vocab), vocab, dz.begin() + std::ptrdiff_t(i * V));
  for_each_tp([&](auto& g, comm::mpi&) {
    const auto rows = tp_kit::part_of(V, g.tp_size(), g.tp.rank(), "the padded vocabulary");
    std::vector<float> out(n * d), dtl(rows.count * d, 0.0f);
    tp_kit::embedding_forward(g.tp, rows_of(table, d, rows).data(), rows, tokens.data(), n, d, out.data());
    BOOST_TEST(out == emb);  // one rank holds each row: the sum adds zeros only
    tp_kit::embedding_backward(dout.data(), rows, tokens.data(), n, d, dtl.data());
    BOOST_TEST(dtl == rows_of(dtable, d, rows));
    auto zt = cols_of(z, V, rows);
    const double lt = tp_kit::cross_entropy(g.tp, zt.data(), rows, vocab, targets.data(), n, scale);
    BOOST_TEST(std::fabs(lt - loss) <= 1e-12 * std::fabs(loss), "loss " << lt << " against one rank's " << loss);
    check_close(zt, cols_of(dz, V, rows), 1e-6, "the logits' gradient");
  });
}

// ---- tp::split: which global elements a tp rank holds, and their initialisation ----
namespace {
// Over every rank of a group of tp: each global element held exactly once, the
// runs in local order, and global_index agreeing with them.
void check_split(const std::function<tp::split(int, int)>& make, const shape& global, int tp) {
  const auto [R, C] = tp::split::extents(global);
  std::vector<int> seen(global.numel(), 0);
  for (int r = 0; r < tp; ++r) {
    const tp::split s = make(tp, r);
    const shape local = s.local(global);
    BOOST_TEST(local.numel() * std::size_t(tp) == global.numel());
    std::size_t next = 0;
    for (const auto& run : s.runs(global)) {
      BOOST_TEST(run.local_offset == next);
      for (std::size_t k = 0; k < run.count; ++k) {
        BOOST_TEST_REQUIRE(s.global_index(R, C, run.local_offset + k) == run.global_offset + k);
        ++seen.at(run.global_offset + k);
      }
      next += run.count;
    }
    BOOST_TEST(next == local.numel());
  }
  BOOST_TEST(std::count(seen.begin(), seen.end(), 1) == std::ptrdiff_t(seen.size()));
}
}  // namespace

BOOST_AUTO_TEST_CASE(tp_splits_cover_every_element_once) {
  for (int tp : {1, 2, 3, 4, 6}) {
    BOOST_TEST_CONTEXT("tp " << tp) {
      // a Llama qkv [q | k | v] of 12 heads and 6 kv heads of 2 (= 24 + 12 + 12 rows), 5 columns
      check_split([](int t, int r) { return tp::split::rows(t, r, {24, 12, 12}); }, shape{48, 5}, tp);
      // gate_up [gate | up], an MLP of 12, and a row-parallel down [5, 12]
      check_split([](int t, int r) { return tp::split::rows(t, r, {12, 12}); }, shape{24, 5}, tp);
      check_split([](int t, int r) { return tp::split::cols(t, r); }, shape{5, 12}, tp);
      check_split([](int t, int r) { return tp::split::cols(t, r, {12, 12}); }, shape{3, 24}, tp);
      // a split bias and a vocab-parallel table
      check_split([](int t, int r) { return tp::split::rows(t, r, {12, 12}); }, shape{24}, tp);
      check_split([](int t, int r) { return tp::split::rows(t, r); }, shape{36, 4}, tp);
    }
  }
  // rank 1 of 2 holds q heads 3-5 and kv head 2 of k and of v: Megatron's packed slice
  const auto s = tp::split::rows(2, 1, {6, 2, 2});
  std::vector<std::size_t> rows;
  for (std::size_t i = 0; i < 5; ++i) rows.push_back(s.global_index(10, 1, i));
  BOOST_TEST(rows == (std::vector<std::size_t>{3, 4, 5, 7, 9}));
  // bad splits: one tessera: line naming the problem
  tessera_test::expect_error([] { (void)tp::split::rows(4, 0, {6, 2, 2}).local(shape{10, 3}); }, "a block of 6");
  tessera_test::expect_error([] { (void)tp::split::rows(2, 0, {6, 2}).local(shape{10, 3}); }, "packed blocks of 8");
  tessera_test::expect_error([] { (void)tp::split::cols(2, 0).local(shape{10}); }, "split along dimension 1");
  tessera_test::expect_error([] { (void)tp::split::rows(2, 2); }, "rank 2 of a tensor-parallel group of 2");
}

BOOST_AUTO_TEST_CASE(sliced_initializers_give_the_global_tensor) {
  // The same model registered whole (tp 1) and as each tp rank's slices: every
  // slice's initial values are the global tensor's, read through the split.
  using Cfg = config<no_shard, ddp, full_precision<float>, sum, backend::host>;
  const shape qkv{24, 4}, down{4, 6};
  const init::normal n{.seed = 7, .stdev = 0.5};
  comm::local<backend::host> solo;
  data_parallel_t<Cfg> whole(solo);
  const unit_id u = whole.add_unit("block");
  const param_id pq = whole.add_param(u, "qkv", qkv), pd = whole.add_param(u, "down", down);
  whole.finalize();
  whole.init_param(pq, n), whole.init_param(pd, n);
  const auto gq = whole.get_param(pq), gd = whole.get_param(pd);
  for (int tp : {2, 3}) {
    for (int r = 0; r < tp; ++r) {
      const auto sq = tp::split::rows(tp, r, {12, 6, 6}), sd = tp::split::cols(tp, r);
      data_parallel_t<Cfg> part(solo);
      const unit_id v = part.add_unit("block");  // the same names: the same keys
      const param_id q = part.add_param(v, "qkv", sq.local(qkv)), d = part.add_param(v, "down", sd.local(down));
      part.finalize();
      part.init_param(q, tp::sliced{n, sq, qkv}), part.init_param(d, tp::sliced{n, sd, down});
      const auto lq = part.get_param(q), ld = part.get_param(d);
      for (std::size_t i = 0; i < lq.size(); ++i) BOOST_TEST_REQUIRE(lq[i] == gq[sq.global_index(24, 4, i)]);
      for (std::size_t i = 0; i < ld.size(); ++i) BOOST_TEST_REQUIRE(ld[i] == gd[sd.global_index(4, 6, i)]);
    }
  }
}

// ---- the global gradient norm over (dp, tp): slices summed over the group, replicated tensors once ----
namespace {
template <class Cfg>
void check_tp_norm(int tp) {
  comm::mpi world;
  auto g = comm::make_tp_groups(world, tp);
  const shape W{12, 3}, T{3, 24}, Bv{5};  // 12 divides by 1-4 ranks
  const auto Gw = random_floats(W.numel(), 21), Gt = random_floats(T.numel(), 22), Gb = random_floats(Bv.numel(), 23);
  double want = 0;
  for (const auto* v : {&Gw, &Gt, &Gb})
    for (float x : *v) want += double(x) * double(x);
  want = std::sqrt(want);
  const auto sw = tp::split::rows(tp, g.tp.rank()), st = tp::split::cols(tp, g.tp.rank(), {12, 12});
  data_parallel_t<Cfg> m(g.dp);
  const unit_id u1 = m.add_unit("block"), u2 = m.add_unit("head");
  const param_id pw = m.add_param(u1, "w", sw.local(W)), pb = m.add_param(u1, "b", Bv, false);
  const param_id pt = m.add_param(u2, "t", st.local(T));
  m.finalize();
  for (bool with_tp : {true, false}) {
    ShardedOptimizer opt(m, sgd{.lr = 0.0}, {.clip_norm = want / 2});
    if (with_tp) opt.set_tensor_parallel(tp_norm_over(g.tp, [pb](param_id p) { return p == pb; }));
    for (auto [u, p, full, s, R, C] : {std::tuple{u1, pw, &Gw, sw, W[0], W[1]}, std::tuple{u2, pt, &Gt, st, T[0], T[1]}}) {
      auto scope = m.gather(u);
      auto gr = scope.grad(p);
      for (std::size_t i = 0; i < gr.size(); ++i) gr[i] = (*full)[s.global_index(R, C, i)];
      if (u == u1) std::copy(Gb.begin(), Gb.end(), scope.grad(pb).begin());
    }
    const step_result r = opt.step();
    if (with_tp) {
      // (the dp ranks' mean of equal fp32 gradients rounds: fp32's tolerance)
      BOOST_TEST(std::fabs(r.grad_norm - want) <= 1e-6 * want, "norm " << r.grad_norm << " against " << want);
      BOOST_TEST(std::fabs(r.clip_coef - 0.5) < 1e-6);
    } else if (tp > 1) {  // without the group: only this rank's slices, so another norm
      BOOST_TEST(std::fabs(r.grad_norm - want) > 1e-3 * want);
    }
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(the_global_norm_counts_slices_over_tp_and_replicated_tensors_once) {
  comm::mpi world;
  for (int tp = 1; tp <= world.size(); ++tp) {
    if (world.size() % tp != 0) continue;
    BOOST_TEST_CONTEXT("tp " << tp << " of " << world.size()) {
      check_tp_norm<config<optim_grads_params, fsdp>>(tp);
      check_tp_norm<config<no_shard, ddp>>(tp);
      check_tp_norm<config<optim_grads_params, fsdp2>>(tp);
      check_tp_norm<config<optim, fsdp>>(tp);
    }
  }
  // options that do not go together are one tessera: line
  data_parallel_t<config<no_shard, ddp>> m(world);
  m.add_param(m.add_unit("u"), "w", {4});
  m.finalize();
  ShardedOptimizer opt(m, sgd{});
  tessera_test::expect_error([&] { opt.set_tensor_parallel({.sum = tp_norm_over(world, {}).sum, .replicated = {}}); },
                             "a tp_norm needs its sum and its replicated set");
  data_parallel_t<config<no_shard, ddp, full_precision<float>, sum, exact_reduction>> x(world);
  x.add_param(x.add_unit("u"), "w", {4});
  x.finalize();
  ShardedOptimizer ox(x, sgd{});
  tessera_test::expect_error([&] { ox.set_tensor_parallel(tp_norm_over(world, [](param_id) { return false; })); },
                             "exact_reduction's norm over a tensor-parallel");
}
