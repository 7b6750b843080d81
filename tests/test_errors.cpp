// Bad input: each misuse is a clear tessera error on every rank involved,
// never a hang or a silently wrong answer.
#define BOOST_TEST_MODULE tessera_errors
#include "common/mpi_test_main.hpp"
#include "common/util.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <sys/wait.h>

#include "tessera/tessera.hpp"
#include "tessera/checkpoint/checkpoint.hpp"

using namespace tessera;
using tessera_test::expect_error;

namespace {
using Z3 = config<optim_grads_params, fsdp>;
using Z1 = config<optim, ddp>;
}  // namespace

BOOST_AUTO_TEST_CASE(registration_after_finalize) {
  comm::mpi c;
  data_parallel_t<Z3> m(c);
  auto u = m.add_unit("u");
  m.add_param(u, "w", {4, 3});
  expect_error([&] { m.add_param(u, "w", {2}); }, "registered twice");
  m.finalize();
  expect_error([&] { m.add_param(u, "late", {2}); }, "after finalize()");
  expect_error([&] { (void)m.add_unit("late"); }, "after finalize()");
  expect_error([&] { m.finalize(); }, "after finalize()");
}

BOOST_AUTO_TEST_CASE(use_before_finalize) {
  comm::mpi c;
  data_parallel_t<Z1> m(c);
  auto u = m.add_unit("u");
  expect_error([&] { (void)m.gather(u); }, "gather() before finalize()");
  expect_error([&] { m.begin_micro_batch(0, 1); }, "before finalize()");
  auto w = m.add_param(u, "w", {3});
  expect_error([&] { m.init_param(w, init::constant{.v = 1}); }, "init_param() before finalize()");
  expect_error([&] { m.set_param(w, std::vector<float>(3, 1.0f)); }, "set_param() before finalize()");
  data_parallel_t<Z1> empty(c);
  expect_error([&] { empty.finalize(); }, "no unit");
}

BOOST_AUTO_TEST_CASE(shape_mismatches) {
  comm::mpi c;
  data_parallel_t<Z3> m(c);
  auto u = m.add_unit("u");
  auto w = m.add_param(u, "w", {4, 3});
  m.finalize();
  std::vector<float> wrong(11);
  expect_error([&] { m.set_param(w, wrong); }, "set_param('w'): 11 values for shape [4, 3]");
  expect_error([&] { (void)m.find(u, "nope"); }, "no parameter 'nope' in unit 'u'");
  ShardedTensor<float, backend::host> t(c, {5, 2});
  std::vector<float> out(9);
  expect_error([&] { t.gather(out); }, "buffer of 9 elements for a tensor of shape [5, 2]");
  expect_error([] { unit_layout("u", {}, 0, 16); }, "world size 0");
}

BOOST_AUTO_TEST_CASE(gradient_view_of_a_released_unit) {
  comm::mpi c;
  data_parallel_t<Z3> m(c);
  auto u0 = m.add_unit("first"), u1 = m.add_unit("second");
  auto w0 = m.add_param(u0, "w", {3});
  auto w1 = m.add_param(u1, "w", {3});
  m.finalize();
  expect_error([&] { (void)m.grad(w0); }, "unit 'first' requested while the unit is released");
  auto s = m.gather(u0);
  BOOST_TEST(s.grad(w0).size() == 3u);
  expect_error([&] { (void)s.grad(w1); }, "parameter 'w' of unit 'second' used through the scope of unit 'first'");
  s.release();
  expect_error([&] { (void)s.grad(w0); }, "released unit scope");
  expect_error([&] { (void)s.weights(); }, "released unit scope");
  m.finish_grad_sync();
  m.zero_grad();
}

BOOST_AUTO_TEST_CASE(reduction_and_micro_batch_misuse) {
  comm::mpi c;
  data_parallel_t<Z1> m(c);
  auto u = m.add_unit("u");
  auto w = m.add_param(u, "w", {5});
  m.finalize();
  m.begin_micro_batch(0, 2);
  expect_error([&] { m.begin_micro_batch(0, 3); }, "does not follow");
  {
    auto s = m.gather(u);
    s.grad(w)[0] = 1.0f;
    s.reduce_grads();
    expect_error([&] { s.reduce_grads(); }, "called twice in one micro-batch: a unit is reduced once");
    expect_error([&] { s.reduce_grads(); }, "tied embedding and head");
    expect_error([&] { (void)s.grad(w); }, "after reduce_grads in the same micro-batch");
  }
  expect_error([&] { m.finish_grad_sync(); }, "finish_grad_sync in micro-batch 0 of 2");
  m.begin_micro_batch(1, 2);
  m.finish_grad_sync();
  expect_error([&] { (void)m.grad(w); }, "after finish_grad_sync");
  expect_error([&] { m.begin_micro_batch(0, 1); }, "does not follow");
  m.zero_grad();
  expect_error([&] { m.begin_micro_batch(2, 2); }, "begin_micro_batch(2, 2)");
  expect_error([&] { m.begin_micro_batch(1, 2); }, "(none open)");
}

BOOST_AUTO_TEST_CASE(gather_pool_exhausted) {
  comm::mpi c;
  data_parallel_t<Z3> m(c, wrapper_options{.gather_buffers = 2});
  std::vector<unit_id> u;
  for (int i = 0; i < 3; ++i) {
    u.push_back(m.add_unit("u" + std::to_string(i)));
    m.add_param(u.back(), "w", {4});
  }
  m.finalize();
  auto a = m.gather(u[0]);
  auto b = m.gather(u[1]);
  if (c.size() == 1) {  // one rank: its shard is the whole unit, no gather buffer is used
    BOOST_TEST(m.planned().gathered_buffers == 0u);
    auto d = m.gather(u[2]);
    BOOST_TEST(d.weights().size() >= 4u);
    return;
  }
  expect_error([&] { (void)m.gather(u[2]); }, "gather buffers are held by live scopes");
  a.release();
  auto d = m.gather(u[2]);  // a freed buffer is reused
  BOOST_TEST(d.weights().size() >= 4u);
}

BOOST_AUTO_TEST_CASE(ranks_that_disagree_on_the_model) {
  comm::mpi c;
  data_parallel_t<Z3> m(c);
  auto u = m.add_unit("u");
  // The last rank registers a different shape; with one rank a different name order stands in.
  m.add_param(u, "w", {c.rank() == c.size() - 1 && c.size() > 1 ? 5 : 4, 3});
  if (c.size() == 1) return;  // nothing to disagree with
  expect_error([&] { m.finalize(); }, "ranks disagree on the model");
  c.barrier();  // every rank got here: nobody hangs in a collective
}

BOOST_AUTO_TEST_CASE(bad_options) {
  comm::mpi c;
  expect_error([&] { data_parallel_t<Z3> m(c, wrapper_options{.alignment = 0}); }, "alignment");
  expect_error([&] { data_parallel_t<Z3> m(c, wrapper_options{.gather_buffers = 0}); }, "gather_buffers");
  data_parallel_t<Z3> m(c);
  m.add_param(m.add_unit("u"), "w", {2});
  expect_error([&] { ShardedOptimizer o(m, adamw{}); }, "before the wrapper's finalize()");
  m.finalize();
  expect_error([&] { ShardedOptimizer o(m, adamw{}, {.clip_norm = -1}); }, "clip_norm");
}

BOOST_AUTO_TEST_CASE(lent_gradient_shards) {
  comm::mpi c;
  {
    data_parallel_t<Z3> m(c);
    auto u = m.add_unit("u");
    m.add_param(u, "w", {40});
    m.finalize();
    std::vector<float> mem(64);
    expect_error([&] { m.lend_grad_shard(u, mem); }, "needs wrapper_options.lend_grad_shards");
  }
  data_parallel_t<Z3> m(c, wrapper_options{.lend_grad_shards = true});
  auto u = m.add_unit("u");
  auto w = m.add_param(u, "w", {40});
  m.finalize();
  if (c.size() == 1) return;  // one rank: no shard to lend (lending is a no-op)
  BOOST_TEST(m.planned().grads == 0u);  // nothing of its own: the shard is lent
  const std::size_t n = m.shards().layout(0).shard_numel();
  host::buffer<float> mem(n + 4);
  expect_error([&] { m.lend_grad_shard(u, mem.span().first(n - 1)); }, "its gradient shard needs");
  expect_error([&] { m.lend_grad_shard(u, mem.span().subspan(1, n)); }, "not 16-byte aligned");
  expect_error([&] { m.begin_micro_batch(0, 2); }, "holds one micro-batch's reduction only");
  m.begin_micro_batch(0, 1);
  {
    auto s = m.gather(u);
    s.grad(w)[0] = 1.0f;
    // Every rank fails here, before any collective: nobody is left waiting.
    expect_error([&] { s.reduce_grads(); }, "has no gradient shard");
    expect_error([&] { m.lend_grad_shard(u, mem.span()); }, "during a step");
  }
  m.zero_grad();
  m.lend_grad_shard(u, mem.span());  // between steps: accepted
  c.barrier();
}

// ---- never hang: misuse across ranks is one clear error on every rank --------
// comm::mpi checks the collective order by default, so each of these fails at
// the first wrong collective instead of hanging or reducing the wrong buffers.
namespace {
using ZG = config<optim_grads, fsdp>;

template <class Model>
void fill_grads(Model& m, unit_id u, param_id w) {
  auto s = m.gather(u);
  for (auto& g : s.grad(w)) g = 1.0f;
}
}  // namespace

BOOST_AUTO_TEST_CASE(reductions_in_a_different_order_on_one_rank) {
  comm::mpi c;
  if (c.size() == 1) return;
  data_parallel_t<ZG> m(c);
  auto a = m.add_unit("alpha"), b = m.add_unit("beta");
  auto wa = m.add_param(a, "w", {6}), wb = m.add_param(b, "w", {6});  // equal sizes: MPI alone would not notice
  m.finalize();
  m.begin_micro_batch(0, 1);
  fill_grads(m, a, wa);
  fill_grads(m, b, wb);
  const bool odd = c.rank() == 1;
  expect_error([&] {
    m.reduce_grads(odd ? a : b);
    m.reduce_grads(odd ? b : a);
  }, "collective order differs");
  // The check stopped every rank before the collective: the communicator still works.
  double one = 1;
  comm::all_reduce(c, std::span<double>(&one, 1));
  BOOST_TEST(one == double(c.size()));
  m.zero_grad();
}

BOOST_AUTO_TEST_CASE(order_error_names_both_sides) {
  comm::mpi c;
  if (c.size() == 1) return;
  std::string msg;
  try {
    comm::label l(c.rank() == 0 ? "gather" : "reduce_grads", "unit7");
    std::vector<float> x(c.rank() == 0 ? 4 : 5, 1.0f);
    comm::all_reduce(c, std::span<float>(x));
  } catch (const tessera::error& e) {
    msg = e.what();
  }
  BOOST_TEST(msg.find("collective order differs") != std::string::npos, msg);
  BOOST_TEST(msg.find("rank 0 issued all_reduce") != std::string::npos, msg);
  BOOST_TEST(msg.find("4 x F32, gather unit7") != std::string::npos, msg);
  BOOST_TEST(msg.find("5 x F32, reduce_grads unit7") != std::string::npos, msg);
}

BOOST_AUTO_TEST_CASE(ranks_with_different_configs) {
  comm::mpi c;
  if (c.size() == 1) return;
  auto run = [&]<class Cfg>() {
    data_parallel_t<Cfg> m(c);
    auto u = m.add_unit("u");
    (void)m.add_param(u, "w", {7});
    expect_error([&] { m.finalize(); }, "ranks disagree on the configuration");
  };
  if (c.rank() == 0) run.template operator()<config<optim_grads_params, fsdp>>();
  else run.template operator()<config<no_shard, fsdp>>();
}

// Under every strategy: with no_shard and optim only the last micro-batch
// reduces, so the counts show only in the reduction's label ("mb 2/2 u").
BOOST_AUTO_TEST_CASE(micro_batch_counts_that_differ) {
  comm::mpi c;
  if (c.size() == 1) return;
  auto run = [&]<class Cfg>() {
    data_parallel_t<Cfg> m(c);
    auto u = m.add_unit("u");
    auto w = m.add_param(u, "w", {8});
    m.finalize();
    ShardedOptimizer opt(m, sgd{.lr = 0.1});
    const int count = c.rank() == 0 ? 2 : 1;
    const auto before = m.get_param(w);
    expect_error([&] {
      for (int mb = 0; mb < count; ++mb) {
        m.begin_micro_batch(mb, count);
        fill_grads(m, u, w);
        m.reduce_grads(u);
      }
      (void)opt.step().get();
    }, "collective order differs");
    m.zero_grad();
    BOOST_TEST(m.get_param(w) == before);  // no rank stepped
  };
  run.template operator()<ZG>();
  run.template operator()<config<no_shard, fsdp>>();
  run.template operator()<config<optim, ddp>>();
  run.template operator()<Z3>();
}

BOOST_AUTO_TEST_CASE(units_registered_in_another_order) {
  comm::mpi c;
  if (c.size() == 1) return;
  data_parallel_t<ZG> m(c);
  const bool odd = c.rank() == 1;
  auto a = m.add_unit(odd ? "beta" : "alpha"), b = m.add_unit(odd ? "alpha" : "beta");
  (void)m.add_param(odd ? b : a, "w", {6});
  (void)m.add_param(odd ? a : b, "w", {7});
  expect_error([&] { m.finalize(); }, "ranks disagree on the order of the units");
}

BOOST_AUTO_TEST_CASE(get_param_on_one_rank) {
  comm::mpi c;
  if (c.size() == 1) return;
  data_parallel_t<Z3> m(c);
  auto u = m.add_unit("u");
  auto w = m.add_param(u, "w", {9});
  m.finalize();
  expect_error([&] {
    if (c.rank() == 0) (void)m.get_param(w);
    double loss = 1;
    comm::all_reduce(c, std::span<double>(&loss, 1));  // what the others do next
  }, "collective order differs");
}

// The optimizer's settings take part in the order check: the grad-norm
// all-reduce is labelled with the step's learning rate and a digest of every
// setting, so a rank that differs fails that step, its value named.
BOOST_AUTO_TEST_CASE(optimizer_settings_that_differ_on_one_rank) {
  comm::mpi c;
  if (c.size() == 1) return;
  const bool odd = c.rank() == 1;  // the message is the same on every rank
  auto one_step = [&](adamw hp, std::function<double(long, double)> schedule, const std::string& expect) {
    data_parallel_t<ZG> m(c);
    auto u = m.add_unit("u");
    auto w = m.add_param(u, "w", {8});
    m.finalize();
    ShardedOptimizer opt(m, hp);
    if (schedule) opt.set_schedule(std::move(schedule));
    m.begin_micro_batch(0, 1);
    fill_grads(m, u, w);
    const auto before = m.get_param(w);
    expect_error([&] { (void)opt.step().get(); }, expect);
    BOOST_TEST(m.get_param(w) == before);  // no rank moved
  };
  one_step(adamw{.lr = odd ? 0.2 : 0.1}, {}, "lr 0.2, settings");
  one_step(adamw{.lr = 0.1, .beta2 = odd ? 0.95 : 0.999}, {}, "collective order differs");
  one_step(adamw{.lr = 0.1}, [odd](long t, double lr) { return odd ? lr * double(t) / 10 : lr; }, "lr 0.01");
}

// set_param is local (no communication); what it set is summed into a digest
// that the next step's grad-norm label carries, so values set on some ranks
// only, or differing between ranks, fail that step under every strategy.
BOOST_AUTO_TEST_CASE(set_param_on_one_rank_or_with_other_values) {
  comm::mpi c;
  if (c.size() == 1) return;
  auto run = [&]<class Cfg>(bool everywhere, float mine, bool agree = false) {
    data_parallel_t<Cfg> m(c);
    auto u = m.add_unit("u");
    auto w = m.add_param(u, "w", {8});
    m.finalize();
    ShardedOptimizer opt(m, sgd{.lr = 0.1});
    const std::vector<float> v(8, mine);
    if (everywhere || c.rank() == 0) m.set_param(w, v);
    m.begin_micro_batch(0, 1);
    fill_grads(m, u, w);
    if (agree) {
      BOOST_TEST(!opt.step().get().skipped);  // the same values everywhere: no error
      return;
    }
    expect_error([&] { (void)opt.step().get(); }, "set_param");
    m.zero_grad();
  };
  run.template operator()<config<no_shard, ddp>>(false, 0.5f);
  run.template operator()<Z1>(false, 0.5f);
  run.template operator()<ZG>(false, 0.5f);
  run.template operator()<Z3>(false, 0.5f);
  run.template operator()<Z3>(true, c.rank() == 1 ? 0.25f : 0.5f);  // differing values
  run.template operator()<Z3>(true, 0.5f, true);
}

// init_param is local too: its parameter and initializer settings join the
// same digest, which get_param checks before gathering, so a rank that drew
// other values (another seed) or skipped the call fails on every rank.
BOOST_AUTO_TEST_CASE(init_param_on_one_rank_or_with_another_seed) {
  comm::mpi c;
  if (c.size() == 1) return;
  auto run = [&](bool everywhere, std::uint64_t seed, const char* expect) {
    data_parallel_t<Z3> m(c);
    auto u = m.add_unit("u");
    auto w = m.add_param(u, "w", {13});
    m.finalize();
    if (everywhere || c.rank() == 0) m.init_param(w, init::normal{.seed = seed, .stdev = 0.02});
    if (expect == nullptr) {
      const auto v = m.get_param(w);
      BOOST_TEST(v.size() == 13u);
      BOOST_TEST(v[0] != 0.0f);  // drawn, and the same call everywhere: no error
      return;
    }
    expect_error([&] { (void)m.get_param(w); }, expect);
  };
  run(false, 7, "init_param was called on some ranks only");
  run(true, c.rank() == 1 ? 8 : 7, "the ranks hold different parameter values");
  run(true, 7, nullptr);
  // The optimizer's step sees it as well (its label carries the digest).
  data_parallel_t<ZG> m(c);
  auto u = m.add_unit("u");
  auto w = m.add_param(u, "w", {8});
  m.finalize();
  ShardedOptimizer opt(m, sgd{.lr = 0.1});
  m.init_param(w, init::uniform{.seed = c.rank() == 1 ? 2u : 1u});
  m.begin_micro_batch(0, 1);
  fill_grads(m, u, w);
  expect_error([&] { (void)opt.step().get(); }, "init_param");
}

// A save called on one rank: the order check names what that rank was doing
// (the save's first agreement), not an unlabelled 1 x I32 all-reduce.
BOOST_AUTO_TEST_CASE(save_on_one_rank) {
  comm::mpi c;
  if (c.size() == 1) return;
  data_parallel_t<Z3> m(c);
  auto u = m.add_unit("u");
  (void)m.add_param(u, "w", {8});
  m.finalize();
  ShardedOptimizer opt(m, sgd{.lr = 0.1});
  const auto root = std::filesystem::temp_directory_path() / ("tessera-one-rank-save-" + std::to_string(::getpid()));
  expect_error([&] {
    if (c.rank() == 0) (void)checkpoint::save(opt, root, 1);
    double loss = 1;
    comm::all_reduce(c, std::span<double>(&loss, 1));  // what the others do next
  }, "checkpoint::save");
  if (c.rank() == 0) std::filesystem::remove_all(root);
}

BOOST_AUTO_TEST_CASE(step_without_gradients) {
  comm::mpi c;
  data_parallel_t<ZG> m(c);
  auto u = m.add_unit("u");
  auto w = m.add_param(u, "w", {5});
  m.finalize();
  ShardedOptimizer opt(m, adamw{.lr = 0.1});
  expect_error([&] { (void)opt.step().get(); }, "step() with no gradients");
  m.begin_micro_batch(0, 1);
  fill_grads(m, u, w);
  BOOST_TEST(!opt.step().get().skipped);
  const auto before = m.get_param(w);
  expect_error([&] { (void)opt.step().get(); }, "step() with no gradients");
  BOOST_TEST(m.get_param(w) == before);  // nothing moved
}

BOOST_AUTO_TEST_CASE(forgotten_begin_micro_batch) {
  comm::mpi c;
  data_parallel_t<ZG> m(c);
  auto u = m.add_unit("u");
  auto w = m.add_param(u, "w", {5});
  m.finalize();
  m.begin_micro_batch(0, 2);
  fill_grads(m, u, w);
  m.reduce_grads(u);
  expect_error([&] { fill_grads(m, u, w); }, "call begin_micro_batch(index, count) before each one's backward");
  m.zero_grad();
}

BOOST_AUTO_TEST_CASE(flight_recorder_file) {
  comm::mpi c;
  const auto dir = std::filesystem::temp_directory_path() / ("tessera-trace-test-" + std::to_string(::getppid()));
  {
    comm::label l("unit_test", "recorder");
    std::vector<float> x(3, 1.0f);
    comm::all_reduce(c, std::span<float>(x));
    BOOST_TEST(x[0] == float(c.size()));
  }
  // Unasked, the files go to the job's folder under the temporary directory, never the working directory.
  const auto unasked = comm::trace::global().file();
  BOOST_TEST(unasked.parent_path().filename().string().starts_with("tessera-traces-"), unasked);
  BOOST_TEST(unasked.parent_path().parent_path() == std::filesystem::path(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp"));
  ::setenv("TESSERA_TRACE_DIR", dir.c_str(), 1);
  const auto path = comm::trace::global().dump("test", "asked by the test");
  ::unsetenv("TESSERA_TRACE_DIR");
  BOOST_REQUIRE(!path.empty());
  std::ifstream f(path);
  const auto j = nlohmann::json::parse(f);
  BOOST_TEST(j["format"] == "tessera-trace");
  BOOST_TEST(j["reason"] == "test");
  bool found = false;
  for (const auto& e : j["entries"])
    if (e["label"] == "unit_test recorder") {
      found = true;
      BOOST_TEST(e["op"] == "all_reduce");
      BOOST_TEST(e["count"] == 3);
      BOOST_TEST(e["dtype"] == "F32");
      BOOST_TEST(e["state"] == "completed");
      BOOST_TEST(e["completed_us"].get<std::int64_t>() >= e["issued_us"].get<std::int64_t>());
    }
  BOOST_TEST(found);
  c.barrier();
  if (c.rank() == 0) std::filesystem::remove_all(dir);
}

// ---- wrapper_options::poison_released: misuse shows at once --------------------
BOOST_AUTO_TEST_CASE(weights_kept_past_their_scope_are_nan) {
  comm::mpi c;
  if (c.size() == 1) return;  // one rank holds the whole unit: nothing is gathered or released
  data_parallel_t<Z3> m(c, wrapper_options{.poison_released = true});
  auto u = m.add_unit("u");
  auto w = m.add_param(u, "w", {12});
  m.finalize();
  m.set_param(w, std::vector<float>(12, 1.0f));
  std::span<const float> kept;
  {
    auto s = m.gather(u);
    kept = s.weights();
    BOOST_TEST(kept[0] == 1.0f);
  }
  BOOST_TEST(std::isnan(kept[0]));  // the misuse reads NaN, not plausible weights
  auto s = m.gather(u);
  BOOST_TEST(s.weights()[0] == 1.0f);  // gathered again
}

// On the host the released buffer's whole pages are also inaccessible: a read
// through the kept span ends the process with a line naming the unit (run in
// a forked child, which makes no MPI call), and the next gather lifts the guard.
BOOST_AUTO_TEST_CASE(weights_kept_past_their_scope_fault_on_the_host) {
  comm::mpi c;
  if (c.size() == 1) return;
  data_parallel_t<Z3> m(c, wrapper_options{.poison_released = true});
  auto u = m.add_unit("big.unit");
  constexpr std::size_t n = 1 << 15;  // 128 KiB: many whole pages
  auto w = m.add_param(u, "w", {std::int64_t(n)});
  m.finalize();
  m.set_param(w, std::vector<float>(n, 1.0f));
  std::span<const float> kept;
  {
    auto s = m.gather(u);
    kept = s.weights();
  }
  int out[2];
  BOOST_REQUIRE(::pipe(out) == 0);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    ::dup2(out[1], 2);
    volatile float x = kept[n / 2];  // the misuse
    (void)x;
    ::_exit(0);  // not reached when the guard works
  }
  ::close(out[1]);
  std::string said;
  char buf[256];
  for (ssize_t k; (k = ::read(out[0], buf, sizeof buf)) > 0;) said.append(buf, std::size_t(k));
  ::close(out[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  BOOST_TEST_CONTEXT("child said: " << said) {
    BOOST_TEST(WIFEXITED(status));
    BOOST_TEST(WEXITSTATUS(status) == 86);
    BOOST_TEST(said.rfind("tessera: the gathered weights of unit 'big.unit' were read or written after", 0) == 0u);
  }
  auto s = m.gather(u);  // the guard is lifted: gathered again and readable
  BOOST_TEST(s.weights()[n / 2] == 1.0f);
}

BOOST_AUTO_TEST_CASE(gradients_written_after_reduce_grads) {
  comm::mpi c;
  if (c.size() == 1) return;  // one rank: reduce_grads communicates nothing
  data_parallel_t<ZG> m(c, wrapper_options{.poison_released = true});
  auto u = m.add_unit("u");
  auto w = m.add_param(u, "w", {10});
  m.finalize();
  ShardedOptimizer opt(m, sgd{.lr = 0.1});
  std::span<float> g;
  m.begin_micro_batch(0, 1);
  {
    auto s = m.gather(u);
    g = s.grad(w);
    for (auto& x : g) x = 1.0f;
  }
  m.reduce_grads(u);
  g[0] = 5.0f;  // while the reduction is in flight
  expect_error([&] { m.finish_grad_sync(); }, "were written after reduce_grads('u'), while its reduction was in flight");
  m.zero_grad();
  // A correct step works again; a write after the reduction completed is found when the buffer is reused.
  m.begin_micro_batch(0, 1);
  {
    auto s = m.gather(u);
    g = s.grad(w);
    for (auto& x : g) x = 1.0f;
  }
  BOOST_TEST(!opt.step().get().skipped);
  BOOST_TEST(std::isnan(g[1]));
  g[1] = 2.0f;
  m.begin_micro_batch(0, 1);
  expect_error([&] {
    auto s = m.gather(u);
    (void)s.grad(w);
  }, "was written after its reduction completed");
  m.zero_grad();
}

// Where gradients stay in full (no_shard, optim; any strategy at one rank) a
// span kept past reduce_grads writes into the buffer the reduction read or
// landed in: half-applied (no_shard: this rank only) or dropped (optim).
// poison_released finds it at the landing or at finish_grad_sync.
using full_grad_configs =
    std::tuple<config<no_shard, ddp>, config<optim, ddp>, config<optim, fsdp>, config<no_shard, fsdp>,
               config<no_shard, ddp, full_precision<float>, sum, exact_reduction>,
               config<optim, ddp, mixed_precision<bf16, float>, pre_divide>, config<optim_grads_params, fsdp>>;
BOOST_AUTO_TEST_CASE_TEMPLATE(gradients_written_after_reduce_grads_where_they_stay_in_full, Cfg, full_grad_configs) {
  comm::mpi c;
  using G = typename Cfg::precision::grad_type;
  // optim_grads_params keeps full gradients at one rank only (the slot poisoning covers it elsewhere)
  if (Cfg::strategy::shards_grads && c.size() > 1) return;
  // one reduction slot: reducing v completes u's reduction first, so the write below lands after it
  data_parallel_t<Cfg> m(c, wrapper_options{.grad_buffers = 1, .poison_released = true});
  auto u = m.add_unit("u");
  auto w = m.add_param(u, "w", {10});
  auto v = m.add_unit("v");
  auto x = m.add_param(v, "x", {7});
  m.finalize();
  ShardedOptimizer opt(m, sgd{.lr = 0.1});
  for (int late : {1, 0, 1}) {  // a late write, a clean step, a late write again: the wrapper stays usable
    std::span<G> g;
    m.begin_micro_batch(0, 1);
    {
      auto s = m.gather(u);
      g = s.grad(w);
      for (auto& e : g) e = convert<G>(1.0f);
    }
    m.reduce_grads(u);
    {
      auto s = m.gather(v);
      for (auto& e : s.grad(x)) e = convert<G>(0.5f);
    }
    m.reduce_grads(v);
    if (!late) {
      BOOST_TEST(!opt.step().get().skipped);
      continue;
    }
    g[3] = convert<G>(5.0f);
    BOOST_TEST_CONTEXT(tessera_test::type_name<Cfg>()) {
      expect_error([&] { (void)opt.step(); }, "gradients of unit 'u' were written after reduce_grads('u')");
    }
    m.zero_grad();
  }
}
