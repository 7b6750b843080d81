// tessera-bench-init: where the time of a model's initial weights goes, on
// one GPU. It builds tessera-gpt's model (fsdp / optim_grads_params, one
// rank), then runs gpt::init_model through a wrapper that times every
// init_param call (wall clock: the call ends synchronised) and, after it, the
// same draws straight into scratch buffers with the backend's for_each (CUDA
// events): the ceiling the call should reach. Twice: a first pass pays what
// is paid once (kernel loading), the second is the steady cost. Prints each
// pass's totals and its slowest calls; --json writes every call.
//   tessera-bench-init [--model gpt2-xl] [--precision bf16|fp32] [--passes 2] [--json FILE]
// Why it exists: on an H200 tessera-gpt reported 2.8 s (124M) and 13-20 s
// (1.5B) for init_model while 2^24 device draws take 1.5 ms (RESULTS.md,
// 2026-12-04); this separates the library's path from the draws.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common.cuh"
#include "gpt/model.hpp"
#include "tessera/backend/cuda/ops.cuh"

using namespace tessera;
using namespace tessera_bench;
using ops = backend_ops<backend::cuda>;

namespace {

struct call {
  std::string name;
  std::size_t numel = 0;
  double call_ms = 0, draw_ms = 0;  // the init_param call; the same draws alone
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

//! The draws init_param makes, through the initializer's public value():
//! element i rounded to M (the main weights), then to T.
template <class T, class M, class I>
struct draw_into {
  T* out;
  I init;
  std::uint64_t key;
  __device__ void operator()(std::size_t i) const { out[i] = convert<T>(M(init.value(key, i))); }
};

//! What gpt::init_model calls, timed: init_param on the wrapper, then the
//! draws it makes (main weights in M, compute weights in C) into scratch.
template <class Wrapper>
struct timed_init {
  using C = typename Wrapper::compute_type;
  using M = typename Wrapper::main_type;
  Wrapper& m;
  dbuf<M>& main_scratch;
  dbuf<C>& compute_scratch;
  std::vector<call> calls;

  template <device_initializer I>
  void init_param(param_id p, const I& init) {
    const tensor_slot& s = m.slot(p);
    call c{m.layout(unit_id{p.unit}).name() + "." + s.spec.name, s.numel};
    const auto t0 = std::chrono::steady_clock::now();
    m.init_param(p, init);
    c.call_ms = 1e3 * seconds_since(t0);
    const std::uint64_t key = key_of(c.name);
    c.draw_ms = time_ms([&] {
      ops::for_each(c.numel, draw_into<M, M, I>{main_scratch.data(), init, key});
      if constexpr (!std::is_same_v<C, M>) ops::for_each(c.numel, draw_into<C, M, I>{compute_scratch.data(), init, key});
    }, 0, 1);
    calls.push_back(std::move(c));
  }
};

template <class P>
nlohmann::json run(const gpt::model_shape& shape, int passes) {
  using Cfg = config<optim_grads_params, fsdp, P, sum, backend::cuda>;
  using W = data_parallel_t<Cfg>;
  comm::mpi world;
  comm::nccl c(world);
  auto t0 = std::chrono::steady_clock::now();
  W m(c, wrapper_options{.gather_buffers = 3});
  const gpt::model_ids ids = gpt::register_model(m, shape);
  m.finalize();
  const double allocate_s = seconds_since(t0);
  std::size_t largest = 0;
  for (std::size_t u = 0; u < m.num_units(); ++u)
    for (const auto& t : m.layout(unit_id{int(u)}).tensors()) largest = std::max(largest, t.numel);
  dbuf<typename W::main_type> main_scratch(largest);
  dbuf<typename W::compute_type> compute_scratch(largest);
  std::printf("tessera-bench-init: %s, %zu parameters in %zu tensors; wrapper built in %.3f s (allocation, zero fill)\n",
              std::is_same_v<typename W::compute_type, float> ? "fp32" : "bf16 (fp32 main)", shape.params(),
              m.num_params(), allocate_s);
  nlohmann::json out{{"params", shape.params()}, {"tensors", m.num_params()}, {"allocate_s", allocate_s}};
  for (int pass = 1; pass <= passes; ++pass) {
    timed_init<W> t{m, main_scratch, compute_scratch, {}};
    t0 = std::chrono::steady_clock::now();
    gpt::init_model(t, ids, shape, 1);
    const double total_s = seconds_since(t0);
    double calls_ms = 0, draws_ms = 0;
    for (const call& k : t.calls) calls_ms += k.call_ms, draws_ms += k.draw_ms;
    std::printf("pass %d: init_model %.3f s; its init_param calls %.3f s, the same draws alone %.3f s (ratio %.1f)\n",
                pass, total_s - draws_ms * 1e-3, calls_ms * 1e-3, draws_ms * 1e-3, calls_ms / std::max(draws_ms, 1e-9));
    std::vector<call> slow = t.calls;
    std::sort(slow.begin(), slow.end(), [](const call& a, const call& b) { return a.call_ms - a.draw_ms > b.call_ms - b.draw_ms; });
    for (std::size_t k = 0; k < std::min<std::size_t>(5, slow.size()); ++k)
      std::printf("  %-22s %11zu elements: call %8.3f ms, draws %7.3f ms\n", slow[k].name.c_str(), slow[k].numel,
                  slow[k].call_ms, slow[k].draw_ms);
    nlohmann::json calls = nlohmann::json::array();
    for (const call& k : t.calls) calls.push_back({{"name", k.name}, {"numel", k.numel}, {"call_ms", k.call_ms}, {"draw_ms", k.draw_ms}});
    out["passes"].push_back({{"calls_s", calls_ms * 1e-3}, {"draws_s", draws_ms * 1e-3}, {"calls", calls}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera-bench-init: init_param's time against its draws alone, on one GPU"};
  std::string model = "gpt2-xl", precision = "bf16", json;
  int passes = 2;
  app.add_option("--model", model)->check(CLI::IsMember({"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}));
  app.add_option("--precision", precision)->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--passes", passes)->check(CLI::Range(1, 10));
  app.add_option("--json", json, "write every call's times here");
  CLI11_PARSE(app, argc, argv);
  gpt::model_shape shape;
  gpt::preset(model, shape);
  return comm::mpi_main(argc, argv, [&] {
    tessera::cuda::stream s;
    const tessera::cuda::scoped_stream on(s.get());  // a non-blocking stream, as tessera-gpt's
    nlohmann::json out = precision == "bf16" ? run<mixed_precision<bf16, float>>(shape, passes)
                                             : run<full_precision<float>>(shape, passes);
    out["model"] = model, out["precision"] = precision;
    if (!json.empty()) std::ofstream(json) << out.dump(1) << "\n";
    return 0;
  });
}
