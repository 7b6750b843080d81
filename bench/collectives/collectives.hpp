#pragma once
// tessera-collectives: Tessera's collectives beside the raw transport, in the
// manner of nccl-tests. Written once over the backend; main.cpp instantiates
// it for the host (MPI) and, compiled by nvcc, for CUDA (NCCL or staged MPI).
//
// Implementations, each checked for correctness at every size (#wrong) before
// it is timed:
//   raw      the communicator on a plain buffer (NCCL, or MPI on the host):
//            the baseline, out-of-place and in-place
//   sharded  ShardedTensor: gather / reduce-scatter of a tensor whose size does
//            not divide the world (padded flat range)
//   unit     a FullyShardedDataParallel unit of transformer-shaped tensors in
//            one flat buffer: gather(unit) (ZeRO-3 all-gather into the pool),
//            reduce_grads + finish_grad_sync (reduce-scatter into the shard,
//            ZeRO-2/3; all-reduce, no_shard). Each run is set up and timed
//            alone, so raw out-of-place also has an "alone" row timed the
//            same way: unit / raw-alone is what the wrapper adds, raw-alone /
//            raw what a lone collective costs over back-to-back ones
//   units    all-gather only: four such units gathered one after another, as a
//            forward pass gathers them (prefetching the next), timed as one
//            batch per run: what a unit costs when gathers follow each other
//   mixed    all-gather: the bf16 compute shard written from fp32 main weights,
//            then gathered in bf16; reduce-scatter: bf16 gradients reduced in
//            fp32 (cast to the fp32 wire, then reduce-scattered)
//   fp8      all-gather only: the same fp32 main shard as mixed's, gathered as
//            e4m3 codes by fp8_gather (one amax all-reduce, the cast, the
//            all-gather of half mixed's bytes), at mixed's element count per
//            size, so the two rows of a size are the same tensor
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "support.hpp"
#include "tessera/tessera.hpp"

namespace collectives {
using namespace tessera;

// ---- the benchmark ------------------------------------------------------------------

template <class B, class T, class Comm>
class bench {
  using ops = backend_ops<B>;
  template <class U> using buf = typename ops::template buffer<U>;

public:
  bench(Comm& c, const options& o) : c_(c), h_(c), o_(o), N_(c.size()), r_(c.rank()) {}

  std::vector<row> run() {
    std::vector<row> rows;
    for (std::size_t bytes = o_.min_bytes; bytes <= o_.max_bytes;
         bytes = std::max(bytes + 1, std::size_t(double(bytes) * o_.factor))) {
      for (const auto& op : o_.ops)
        for (const auto& impl : o_.impls) measure(op, impl, bytes, rows);
    }
    return rows;
  }

private:
  // Elements per rank for an operation whose nccl-tests "size" is `bytes`.
  std::size_t per_rank(const std::string& op, std::size_t bytes) const {
    const std::size_t total = std::max<std::size_t>(bytes / sizeof(T), 1);
    return (op == "all_gather" || op == "reduce_scatter") ? std::max<std::size_t>(total / std::size_t(N_), 1) : total;
  }

  template <class U> std::vector<U> host_copy(std::span<const U> d) {
    std::vector<U> h(d.size());
    ops::copy_to_host(std::span<U>(h), d);
    return h;
  }

  void emit(std::vector<row>& rows, const std::string& op, const std::string& impl, const std::string& place,
            const std::string& type, std::size_t bytes, std::size_t count, double sec, long wrong) {
    // The slowest rank's time is the collective's time; wrong counts add up.
    double t = sec;
    reduce_host(&t, comm::reduce_op::max);
    std::int64_t w = wrong;
    reduce_host(&w, comm::reduce_op::sum);
    const double algbw = double(bytes) / t / 1e9;
    const double busbw = algbw * bus_factor(op, N_);
    rows.push_back({op, impl, place, type, bytes, count, t * 1e6, algbw, busbw, long(w)});
    if (r_ == 0)
      std::printf("%12zu %12zu %8s %6s %-14s %-8s %-7s | %10.1f %8.2f %8.2f %6ld\n", bytes, count, type.c_str(),
                  op == "all_reduce" || op == "reduce_scatter" ? "sum" : "none", op.c_str(), impl.c_str(),
                  place.c_str(), t * 1e6, algbw, busbw, long(w));
  }

  void measure(const std::string& op, const std::string& impl, std::size_t bytes, std::vector<row>& rows);

  void barrier() {
    c_.barrier();
    ops::synchronize();
  }
  template <class F> double time_batch(F&& f) {
    return timer<B>::run(o_.warmup, o_.iters, [] {}, f, [&] { barrier(); }, false);
  }
  template <class S, class F> double time_each(S&& setup, F&& f) {
    return timer<B>::run(o_.warmup, o_.iters, setup, f, [&] { barrier(); }, true);
  }

  // ---- raw: the transport on a plain buffer, out-of-place and in-place ----
  void raw(const std::string& op, std::size_t bytes, std::vector<row>& rows) {
    const std::size_t n = per_rank(op, bytes), N = std::size_t(N_);
    const bool gather = op == "all_gather", scatter = op == "reduce_scatter";
    const std::size_t in_n = scatter ? n * N : n, out_n = gather ? n * N : n;
    buf<T> in(in_n), out(std::max(in_n, out_n));
    for (int inplace = 0; inplace < 2; ++inplace) {
      if (inplace && scatter) continue;          // the communicators take reduce-scatter out of place only
      if (!inplace && op == "broadcast") continue;  // and broadcast in place only
      auto fill = [&] {
        if (gather && inplace) ops::for_each(n, iota_fn<T>{out.data() + std::size_t(r_) * n, r_, 0});
        else if (inplace) ops::for_each(in_n, iota_fn<T>{out.data(), r_, 0});
        else ops::for_each(in_n, iota_fn<T>{in.data(), r_, 0});
      };
      const T* src = inplace ? (gather ? out.data() + std::size_t(r_) * n : out.data()) : in.data();
      auto call = [&] {
        if (gather) c_.all_gather(src, out.data(), n, dtype_of_v<T>);
        else if (scatter) c_.reduce_scatter(src, out.data(), n, dtype_of_v<T>, comm::reduce_op::sum);
        else if (op == "all_reduce") c_.all_reduce(src, out.data(), n, dtype_of_v<T>, comm::reduce_op::sum);
        else c_.broadcast(out.data(), n, dtype_of_v<T>, 0);
      };
      fill();
      call();
      const auto got = host_copy(std::span<const T>(out.span().first(out_n)));
      long wrong = 0;
      for (std::size_t i = 0; i < out_n; ++i) {
        double want;
        if (gather) want = iota_value<T>(int(i / n), i % n);
        else if (scatter || op == "all_reduce") {
          const std::size_t gi = scatter ? std::size_t(r_) * n + i : i;
          want = 0;
          for (int q = 0; q < N_; ++q) want += iota_value<T>(q, gi);
        } else want = iota_value<T>(0, i);
        wrong += convert<double>(got[i]) != want;
      }
      // Timed back to back like nccl-tests; in place, later runs see the
      // previous output as input, which changes no timing.
      const double sec = time_batch(call);
      emit(rows, op, "raw", inplace ? "inplace" : "outplace", name(), bytes, n, sec, wrong);
      // Timed one run at a time after a barrier, as the unit rows are.
      if (!inplace || op == "all_reduce")
        emit(rows, op, "raw", inplace ? "alone-in" : "alone", name(), bytes, n, time_each([] {}, call), wrong);
    }
  }

  // ---- sharded: ShardedTensor of a size that does not divide the world ----
  void sharded(const std::string& op, std::size_t bytes, std::vector<row>& rows) {
    if (op != "all_gather" && op != "reduce_scatter") return;
    const std::size_t total = std::max<std::size_t>(bytes / sizeof(T), std::size_t(N_)) - (N_ > 1 ? 1 : 0);
    ShardedTensor<T, B> t(c_, shape({std::int64_t(total)}));
    buf<T> full(t.padded_numel());
    long wrong = 0;
    if (op == "all_gather") {
      std::vector<T> init(total);
      for (std::size_t i = 0; i < total; ++i) init[i] = convert<T>(iota_value<T>(0, i));
      buf<T> d_init(total);
      ops::copy_from_host(d_init.span(), std::span<const T>(init));
      t.scatter_from(std::span<const T>(d_init.span()));
      t.gather_padded(full.span());
      const auto got = host_copy(std::span<const T>(full.span().first(total)));
      for (std::size_t i = 0; i < total; ++i) wrong += convert<double>(got[i]) != iota_value<T>(0, i);
      const double sec = time_batch([&] { t.gather_padded(full.span()); });
      emit(rows, op, "sharded", "outplace", name(), bytes, total, sec, wrong);
    } else {
      ops::for_each(full.size(), iota_fn<T>{full.data(), r_, 0});
      t.reduce_scatter_padded(std::span<const T>(full.span()));
      const auto got = host_copy(std::span<const T>(t.shard()));
      for (std::size_t i = 0; i < got.size(); ++i) {
        double want = 0;
        for (int q = 0; q < N_; ++q) want += iota_value<T>(q, t.global_offset() + i);
        wrong += convert<double>(got[i]) != want;
      }
      const double sec = time_batch([&] { t.reduce_scatter_padded(std::span<const T>(full.span())); });
      emit(rows, op, "sharded", "outplace", name(), bytes, total, sec, wrong);
    }
  }

  // ---- unit: a wrapper unit of transformer-shaped tensors ----
  // Hidden width h with 12 h^2 + 13 h elements near the requested size.
  static std::vector<tensor_spec> transformer_unit(std::size_t elements) {
    std::int64_t h = 1;
    while (12 * (h + 1) * (h + 1) + 13 * (h + 1) <= std::int64_t(elements)) ++h;
    return {{"ln1", shape({h}), false},        {"qkv", shape({3 * h, h})}, {"qkv_b", shape({3 * h}), false},
            {"proj", shape({h, h})},           {"proj_b", shape({h}), false}, {"ln2", shape({h}), false},
            {"fc1", shape({4 * h, h})},        {"fc1_b", shape({4 * h}), false}, {"fc2", shape({h, 4 * h})},
            {"fc2_b", shape({h}), false}};
  }
  // Adds transformer_unit's tensors for `bytes` of T to unit u; returns their elements.
  template <class Model>
  static std::size_t add_transformer_params(Model& model, unit_id u, std::size_t bytes) {
    std::size_t numel = 0;
    for (auto& s : transformer_unit(std::max<std::size_t>(bytes / sizeof(T), 25))) {
      numel += s.shape.numel();
      model.add_param(u, s.name, s.shape, s.weight_decay);
    }
    return numel;
  }
  // Every element of unit u set to rank `pattern`'s flat index pattern (main weights).
  template <class Model, class View>
  static void set_pattern(Model& model, const View& e, int u, int pattern) {
    using M = typename Model::main_type;
    const auto& L = e.layout(std::size_t(u));
    for (std::size_t t = 0; t < L.tensors().size(); ++t) {
      const auto& ts = L.tensors()[t];
      std::vector<M> v(ts.numel);
      for (std::size_t i = 0; i < ts.numel; ++i) v[i] = M(iota_value<T>(pattern, ts.offset + i));
      model.set_param({u, int(t)}, std::span<const M>(v));
    }
  }
  // Elements of unit u, gathered, that differ from rank `pattern`'s flat index pattern.
  template <class Model, class View>
  long wrong_gathered(Model& model, const View& e, unit_id u, int pattern) {
    auto s = model.gather(u);
    const auto got = host_copy(s.weights());
    long wrong = 0;
    for (const auto& ts : e.layout(std::size_t(u.index)).tensors())
      for (std::size_t i = 0; i < ts.numel; ++i) wrong += convert<double>(got[ts.offset + i]) != iota_value<T>(pattern, ts.offset + i);
    return wrong;
  }

  // impl "unit": fsdp's flat layout; "unit2": fsdp2's row shards (plus the
  // copy-out after the all-gather and the copy-in before the reduce-scatter).
  template <class Cfg>
  void unit_case(const std::string& op, std::size_t bytes, std::vector<row>& rows, const std::string& impl) {
    data_parallel_t<Cfg> model(c_, wrapper_options{.prefetch = false});
    auto u = model.add_unit("block");
    const std::size_t numel = add_transformer_params(model, u, bytes);
    model.finalize();
    auto e = model.shards();
    const auto& L = e.layout(0);
    long wrong = 0;
    if (op == "all_gather") {
      // Every element of the unit set to its flat index pattern, then gathered.
      set_pattern(model, e, 0, 0);
      wrong = wrong_gathered(model, e, u, 0);
      const double sec = time_each([&] { model.release_gathered(); }, [&] { auto s = model.gather(u); });
      emit(rows, op, impl, "outplace", name(), L.padded_numel() * sizeof(T), numel, sec, wrong);
    } else {
      auto fill = [&] {
        model.zero_grad();
        model.begin_micro_batch(0, 1);
        auto s = model.gather(u);
        ops::for_each(L.padded_numel(), iota_fn<T>{s.grads().data(), r_, 0});
      };
      auto reduce = [&] {
        model.reduce_grads(u);
        model.finish_grad_sync();
      };
      fill();
      reduce();
      // Each tensor's piece of this rank's shard holds the sum over ranks of its gradients.
      const auto got = host_copy(std::span<const T>(e.opt_grads(0)));
      for (std::size_t t = 0; t < L.tensors().size(); ++t) {
        const piece p = e.range_piece(0, t);
        for (std::size_t k = 0; k < p.count; ++k) {
          double want = 0;
          for (int q = 0; q < N_; ++q) want += iota_value<T>(q, L.tensors()[t].offset + p.tensor_begin + k);
          wrong += convert<double>(got[p.shard_begin + k]) != want;
        }
      }
      const double sec = time_each(fill, reduce);
      emit(rows, op, impl, "outplace", name(), L.padded_numel() * sizeof(T), numel, sec, wrong);
    }
  }

  // ---- units: four units gathered one after another, as a forward pass does ----
  template <class Cfg>
  void units_case(std::size_t bytes, std::vector<row>& rows) {
    constexpr int K = 4;
    if (bytes > (std::size_t(256) << 20)) return;  // four units of it: small units are the question here
    data_parallel_t<Cfg> model(c_, wrapper_options{.prefetch = true});
    std::vector<unit_id> us;
    std::size_t numel = 0;
    for (int k = 0; k < K; ++k) {
      us.push_back(model.add_unit("block" + std::to_string(k)));
      numel = add_transformer_params(model, us.back(), bytes);  // the same tensors in each
    }
    model.finalize();
    auto e = model.shards();
    long wrong = 0;
    for (int k = 0; k < K; ++k) set_pattern(model, e, k, k);  // unit k: the flat index pattern of rank k
    for (int k = 0; k < K; ++k) wrong += wrong_gathered(model, e, us[std::size_t(k)], k);
    auto pass = [&] {
      for (const auto u : us) {
        auto s = model.gather(u);
      }
    };
    const double sec = time_each([&] { model.release_gathered(); }, pass) / K;
    emit(rows, "all_gather", "units", "outplace", name(), e.layout(0).padded_numel() * sizeof(T), numel, sec, wrong);
  }

  // ---- mixed precision forms ----
  void mixed(const std::string& op, std::size_t bytes, std::vector<row>& rows) {
    const std::size_t N = std::size_t(N_);
    if (op == "all_gather") {
      // fp32 main shard -> bf16 compute shard (the cast) -> bf16 all-gather.
      const std::size_t n = std::max<std::size_t>(bytes / sizeof(bf16) / N, 1);
      buf<float> main(n);
      buf<bf16> full(n * N);
      ops::for_each(n, iota_fn<float>{main.data(), r_, 0});
      bf16* mine = full.data() + std::size_t(r_) * n;
      auto call = [&] {
        ops::for_each(n, cast_fn<bf16, float>{main.data(), mine});
        c_.all_gather(mine, full.data(), n, dtype::bf16);
      };
      call();
      const auto got = host_copy(std::span<const bf16>(full.span()));
      long wrong = 0;
      for (std::size_t i = 0; i < got.size(); ++i) wrong += float(got[i]) != iota_value<float>(int(i / n), i % n);
      emit(rows, op, "mixed", "inplace", "f32>bf16", n * N * sizeof(bf16), n,
           time_batch(call), wrong);
    } else if (op == "reduce_scatter") {
      // bf16 gradients -> fp32 wire (the cast) -> fp32 reduce-scatter.
      const std::size_t n = std::max<std::size_t>(bytes / sizeof(float) / N, 1);
      buf<bf16> grads(n * N);
      buf<float> wire(n * N), shard(n);
      ops::for_each(n * N, iota_fn<bf16>{grads.data(), r_, 0});
      auto call = [&] {
        ops::for_each(n * N, cast_fn<float, bf16>{grads.data(), wire.data()});
        c_.reduce_scatter(wire.data(), shard.data(), n, dtype::f32, comm::reduce_op::sum);
      };
      call();
      const auto got = host_copy(std::span<const float>(shard.span()));
      long wrong = 0;
      for (std::size_t i = 0; i < n; ++i) {
        double want = 0;
        for (int q = 0; q < N_; ++q) want += iota_value<float>(q, std::size_t(r_) * n + i);
        wrong += got[i] != want;
      }
      emit(rows, op, "mixed", "outplace", "bf16>f32", n * N * sizeof(float), n,
           time_batch(call), wrong);
    }
  }

  // ---- fp8 weight gathers: mixed's tensor in half the bytes ----
  void fp8(const std::string& op, std::size_t bytes, std::vector<row>& rows) {
    if (op != "all_gather") return;
    const std::size_t N = std::size_t(N_), n = std::max<std::size_t>(bytes / sizeof(bf16) / N, 1);
    buf<float> main(n);
    ops::for_each(n, iota_fn<float>{main.data(), r_, 0});
    fp8_gather<e4m3, B> g(c_, n);
    auto call = [&] { g.gather(std::span<const float>(main.span())); };
    call();
    const auto got = host_copy(g.full());
    long wrong = 0;
    float amax = 0;
    for (std::size_t i = 0; i < got.size(); ++i) amax = std::max(amax, std::fabs(iota_value<float>(int(i / n), i % n)));
    const float scale = fp8::scale_for<e4m3>(amax, 1.0f);
    for (std::size_t i = 0; i < got.size(); ++i)
      wrong += got[i].bits != fp8::cast<e4m3>(iota_value<float>(int(i / n), i % n), scale).bits;
    emit(rows, op, "fp8", "inplace", "f32>e4m3", n * N, n, time_batch(call), wrong);
  }

  static std::string name() {
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, bf16>) return "bf16";
    else if constexpr (std::is_same_v<T, double>) return "double";
    else return "half";
  }

  // All-reduce of one host scalar over the benchmark's communicator.
  template <class U>
  void reduce_host(U* v, comm::reduce_op op) {
    if constexpr (std::is_same_v<B, backend::host>) {
      h_.all_reduce(v, v, 1, dtype_of_v<U>, op);
    } else {
      buf<U> d(1);
      ops::copy_from_host(d.span(), std::span<const U>(v, 1));
      h_.all_reduce(d.data(), d.data(), 1, dtype_of_v<U>, op);
      ops::copy_to_host(std::span<U>(v, 1), std::span<const U>(d.span()));
    }
  }

  Comm& c_;
  comm::handle<B> h_;
  options o_;
  int N_, r_;
};

template <class B, class T, class Comm>
void bench<B, T, Comm>::measure(const std::string& op, const std::string& impl, std::size_t bytes,
                                std::vector<row>& rows) {
  if (impl == "raw") return raw(op, bytes, rows);
  if (impl == "sharded") return sharded(op, bytes, rows);
  if (impl == "mixed") return mixed(op, bytes, rows);
  if (impl == "fp8") return fp8(op, bytes, rows);
  if (impl == "unit" || impl == "unit2" || impl == "units") {
    // T everywhere; 16-bit types keep fp32 main weights (a config rule).
    using P = std::conditional_t<std::is_same_v<T, float> || std::is_same_v<T, double>, full_precision<T>,
                                 mixed_precision<T, float, T, T>>;
    if (impl == "units") {
      if (op == "all_gather") units_case<config<optim_grads_params, fsdp, P, sum, B>>(bytes, rows);
      return;
    }
    if (impl == "unit2") {
      if (op == "all_gather" || op == "reduce_scatter")
        return unit_case<config<optim_grads_params, fsdp2, P, sum, B>>(op, bytes, rows, impl);
      return;
    }
    if (op == "all_gather" || op == "reduce_scatter")
      return unit_case<config<optim_grads_params, fsdp, P, sum, B>>(op, bytes, rows, impl);
    if (op == "all_reduce") return unit_case<config<no_shard, ddp, P, sum, B>>(op, bytes, rows, impl);
  }
}

}  // namespace collectives
