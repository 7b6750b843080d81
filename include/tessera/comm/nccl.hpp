#pragma once
//! \file comm::nccl: a communicator over NCCL for device memory.
//!
//! Collectives run on the communicator's own stream. Before each, that stream
//! waits for an event recorded on the caller's compute stream
//! (cuda::current_stream()), so the inputs are ready; the returned request's
//! wait() makes the stream current at the call (the compute stream, or a side
//! stream of backend_ops::after) wait for the collective's completion event.
//! No host synchronisation anywhere: "blocking" forms are ordered on the
//! device the same way and return at once.
//!
//! Every collective is recorded (comm/trace.hpp) and, with a deadline
//! (nccl_options::timeout_s, default 600 s or TESSERA_TIMEOUT_S), held to it
//! by the watchdog thread (comm/watchdog.hpp), which polls the completion
//! events and ncclCommGetAsyncError: the calling thread never waits on the
//! host for a collective. On a deadline or an asynchronous NCCL error the
//! watchdog aborts the communicator (ncclCommAbort, which also ends the
//! kernels waiting for the lost peer), and the next call on it throws a
//! tessera::error naming the collective, its label, size, sequence number and
//! rank.
//!
//! nccl_options::order_check (communicators bootstrapped over MPI) checks
//! before every collective, over a duplicate of the MPI bootstrap, that all
//! ranks issue the same one (comm/order_check.hpp): a host all-reduce per
//! collective, off by default here.
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unistd.h>

#include "tessera/backend/cuda/stream.hpp"
#include "tessera/backend/memory.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/comm/mpi.hpp"
#include "tessera/comm/order_check.hpp"
#include "tessera/comm/trace.hpp"
#include "tessera/comm/watchdog.hpp"

namespace tessera::detail {
[[noreturn]] inline void throw_nccl_error(ncclComm_t comm, ncclResult_t rc, const char* call,
                                          ::tessera::source_location where) {
  std::string msg = std::string("NCCL call failed: ") + ncclGetErrorString(rc);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) msg += std::string(" (") + last + ")";
  }
  throw error(msg, call, static_cast<long long>(rc), where);
}
}  // namespace tessera::detail

namespace tessera::comm {

struct nccl_options {
  //! Seconds a collective may take (from its issue) before the watchdog aborts
  //! the communicator; 0 = no deadline; < 0 = TESSERA_TIMEOUT_S, else 600.
  double timeout_s = -1;
  //! Check that all ranks issue the same collective first (needs the MPI bootstrap).
  bool order_check = false;
  //! How long non-zero ranks wait for a rendezvous file to appear.
  double rendezvous_timeout_s = 120;
  //! Most CTAs (SMs) a collective may occupy (NCCL's config.maxCTAs); 0 = NCCL's
  //! choice. Fewer leaves more SMs to compute that overlaps the collective.
  int max_ctas = 0;
  //! All-gathers between buffers from alloc_symmetric() run on the copy
  //! engines (NCCL's zero-CTA policy over symmetric windows, NCCL 2.28 and
  //! later): they take no SMs from the compute they overlap. The wrappers put
  //! their gather buffers and parameter shards (optim_grads_params) there.
  bool copy_engine_gathers = false;
};

class nccl {
public:
  using backend_type = backend::cuda;

  //! A world of one rank on the current device: no bootstrap needed.
  explicit nccl(nccl_options o = {}) : opt_(o) {
    ncclUniqueId id;
    TESSERA_NCCL(nullptr, ncclGetUniqueId(&id));
    init(0, 1, id);
  }
  //! Ranks of `bootstrap` (MPI, launched by mpirun or srun); the unique id is
  //! broadcast from its rank 0. Each rank uses its current CUDA device.
  explicit nccl(mpi& bootstrap, nccl_options o = {}) : opt_(o) {
    ncclUniqueId id{};
    if (bootstrap.rank() == 0) TESSERA_NCCL(nullptr, ncclGetUniqueId(&id));
    bootstrap.broadcast(&id, sizeof id, dtype::u8, 0);
    if (opt_.order_check && bootstrap.size() > 1)
      checker_ = std::make_shared<mpi>(bootstrap.split(0, bootstrap.rank()));
    init(bootstrap.rank(), bootstrap.size(), id);
  }
  //! Without MPI: rank 0 writes the unique id to `path` (atomically: a
  //! temporary file renamed into place), the others wait for it to appear.
  nccl(int rank, int size, const std::string& path, nccl_options o = {}) : opt_(o) {
    TESSERA_CHECK(size >= 1 && rank >= 0 && rank < size, "nccl: rank ", rank, " of ", size);
    TESSERA_CHECK(!o.order_check || size == 1, "nccl_options::order_check needs an MPI bootstrap (nccl(mpi&, options))");
    ncclUniqueId id{};
    if (rank == 0) {
      TESSERA_NCCL(nullptr, ncclGetUniqueId(&id));
      const std::string tmp = path + ".tmp." + std::to_string(::getpid());
      {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f.write(reinterpret_cast<const char*>(&id), sizeof id);
        f.flush();
        TESSERA_CHECK(f.good(), "nccl rendezvous: cannot write '", tmp, "'");
      }
      std::filesystem::rename(tmp, path);
    } else {
      const auto deadline = clock::now() + std::chrono::duration<double>(o.rendezvous_timeout_s);
      for (;;) {
        std::error_code ec;
        if (std::filesystem::file_size(path, ec) == sizeof id && !ec) break;
        TESSERA_CHECK(clock::now() < deadline, "nccl rendezvous: '", path, "' did not appear within ",
                      o.rendezvous_timeout_s, " s (rank ", rank, " of ", size, ")");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      std::ifstream f(path, std::ios::binary);
      f.read(reinterpret_cast<char*>(&id), sizeof id);
      TESSERA_CHECK(f.good(), "nccl rendezvous: cannot read '", path, "'");
    }
    init(rank, size, id);
  }
  nccl(nccl&& o) noexcept
      : opt_(o.opt_), comm_(std::exchange(o.comm_, nullptr)), state_(std::move(o.state_)), stream_(std::move(o.stream_)),
        ready_(std::move(o.ready_)), done_pool_(std::move(o.done_pool_)), rank_(o.rank_), size_(o.size_),
        channel_(std::exchange(o.channel_, -1)), checker_(std::move(o.checker_)),
        barrier_(std::exchange(o.barrier_, nullptr)), windows_(std::move(o.windows_)) {}
  nccl& operator=(nccl&&) = delete;
  nccl(const nccl&) = delete;
  nccl& operator=(const nccl&) = delete;
  ~nccl() {
    if (barrier_) cudaFree(barrier_);
    for (auto& [p, w] : windows_) {  // what the owner did not return: dropped without deregistering
      ncclMemFree(p);
      memory_of<backend::cuda>().sub(w.second);
    }
    if (channel_ >= 0) trace::global().close(channel_);  // the watchdog lets go first
    if (!comm_) return;
    std::lock_guard lock(state_->mu);
    if (state_->aborted.load()) return;
    state_->aborted = true;
    // Unwinding from an error: ncclCommDestroy can wait for peers that are
    // themselves waiting for this rank, so the error would never reach the
    // launcher. Abort instead (local, immediate).
    if (std::uncaught_exceptions() > 0) ncclCommAbort(comm_);
    else ncclCommDestroy(comm_);
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] ncclComm_t native() const noexcept { return comm_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_.get(); }
  [[nodiscard]] const nccl_options& options() const noexcept { return opt_; }
  //! This communicator's number in the flight recorder (comm/trace.hpp).
  [[nodiscard]] int channel() const noexcept { return channel_; }

  //! Ranks with the same color form a new communicator, ordered by key. Collective.
  [[nodiscard]] nccl split(int color, int key) {
    ncclConfig_t cfg = config();
    ncclComm_t c = nullptr;
    issue("split", 0, dtype::u8, [&] { return ncclCommSplit(comm_, color, key, &c, &cfg); });
    nccl out(c, opt_);
    if (checker_) out.checker_ = std::make_shared<mpi>(checker_->split(color, key));
    return out;
  }

  //! With copy_engine_gathers: `bytes` of device memory (ncclMemAlloc)
  //! registered as a symmetric window. Collective: every rank allocates the
  //! same sizes in the same order, and uses the same offsets into them in a
  //! collective. Null without copy_engine_gathers (the caller allocates itself).
  [[nodiscard]] void* alloc_symmetric(std::size_t bytes) {
    if (!opt_.copy_engine_gathers || bytes == 0) return nullptr;
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 28, 0)
    ::tessera::detail::fail("nccl_options::copy_engine_gathers needs NCCL 2.28 or later (built with " +
                 std::to_string(NCCL_VERSION_CODE) + ")");
#else
    void* p = nullptr;
    const ncclResult_t got = ncclMemAlloc(&p, bytes);
    // Registration is collective: every rank learns whether all could
    // allocate first, so one rank out of memory fails them all instead of
    // leaving the others waiting in ncclCommWindowRegister.
    if (!all_agree(got == ncclSuccess, "alloc_symmetric")) {
      if (got == ncclSuccess) ncclMemFree(p);
      ::tessera::detail::fail("alloc_symmetric(" + std::to_string(bytes) + " bytes): ncclMemAlloc failed on " +
                   (got == ncclSuccess ? std::string("another rank") : "this rank (" + std::string(ncclGetErrorString(got)) + ")") +
                   "; rank " + std::to_string(rank_) + " of " + std::to_string(size_));
    }
    ncclWindow_t w{};
    const ncclResult_t rc = ncclCommWindowRegister(comm_, p, bytes, &w, NCCL_WIN_COLL_SYMMETRIC);
    if (rc != ncclSuccess) {
      ncclMemFree(p);
      TESSERA_NCCL(comm_, rc);
    }
    windows_.emplace(p, std::pair{w, bytes});
    memory_of<backend::cuda>().add(bytes);
    return p;
#endif
  }
  //! Deregisters and frees memory from alloc_symmetric (collective, like it).
  void free_symmetric(void* p) noexcept {
    const auto it = windows_.find(p);
    if (it == windows_.end()) return;
    cudaDeviceSynchronize();  // no collective or kernel still uses it
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    if (!state_->aborted.load()) ncclCommWindowDeregister(comm_, it->second.first);
#endif
    ncclMemFree(p);
    memory_of<backend::cuda>().sub(it->second.second);
    windows_.erase(it);
  }

  void all_gather(const void* s, void* r, std::size_t n, dtype t) { iall_gather(s, r, n, t).wait(); }
  void reduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    ireduce_scatter(s, r, n, t, op).wait();
  }
  void all_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op op) { iall_reduce(s, r, n, t, op).wait(); }
  void broadcast(void* b, std::size_t n, dtype t, int root) {
    run("broadcast", n, t, [&] { return ncclBroadcast(b, b, n, type(t), root, comm_, stream_.get()); }).wait();
  }
  void barrier() { (void)all_agree(true, "barrier"); }
  //! Whether `mine` holds on every rank (a one-byte min all-reduce, waited for on the host). Collective.
  [[nodiscard]] bool all_agree(bool mine, const char* what = "all_agree") {
    if (!barrier_) TESSERA_CUDA(cudaMalloc(&barrier_, 1));
    const cudaStream_t s = cuda::current_stream();
    std::uint8_t v = mine ? 1 : 0;
    TESSERA_CUDA(cudaMemcpyAsync(barrier_, &v, 1, cudaMemcpyHostToDevice, s));
    run(what, 1, dtype::u8, [&] { return ncclAllReduce(barrier_, barrier_, 1, ncclUint8, ncclMin, comm_, stream_.get()); })
        .wait();
    TESSERA_CUDA(cudaMemcpyAsync(&v, barrier_, 1, cudaMemcpyDeviceToHost, s));
    TESSERA_CUDA(cudaStreamSynchronize(s));
    throw_if_aborted(what, 1, dtype::u8);  // the watchdog may have ended the wait
    return v != 0;
  }

  [[nodiscard]] request iall_gather(const void* s, void* r, std::size_t n, dtype t) {
    return run("all_gather", n, t, [&] { return ncclAllGather(s, r, n, type(t), comm_, stream_.get()); });
  }
  [[nodiscard]] request ireduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    check_reducible(t, op, "comm::nccl");
    return run("reduce_scatter", n, t,
               [&] { return ncclReduceScatter(s, r, n, type(t), nccl_op(op), comm_, stream_.get()); });
  }
  [[nodiscard]] request iall_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    check_reducible(t, op, "comm::nccl");
    return run("all_reduce", n, t, [&] { return ncclAllReduce(s, r, n, type(t), nccl_op(op), comm_, stream_.get()); });
  }

private:
  using clock = std::chrono::steady_clock;
  nccl(ncclComm_t c, nccl_options o) : opt_(o), comm_(c) {
    TESSERA_NCCL(comm_, ncclCommUserRank(comm_, &rank_));
    TESSERA_NCCL(comm_, ncclCommCount(comm_, &size_));
    watch();
  }
  // What the watchdog thread shares with this communicator; it outlives
  // either, so a fault handled while the communicator moves or dies is safe.
  struct shared_state {
    std::mutex mu;  // held around every NCCL call on the communicator and its abort
    std::atomic<bool> aborted{false};
    std::string why;  // set before aborted
    ncclComm_t comm = nullptr;
  };
  // Registers with the recorder and the watchdog.
  void watch() {
    opt_.timeout_s = default_timeout_s(opt_.timeout_s);
    state_->comm = comm_;
    auto st = state_;
    channel_ = trace::global().open(
        {"nccl", rank_, size_, opt_.timeout_s,
         [st](const std::string& why) {
           // Waits (a second at most) for a call in progress on the issuing
           // thread, then aborts: the kernels waiting for a lost peer end.
           std::unique_lock lock(st->mu, std::defer_lock);
           for (int i = 0; i < 100 && !lock.try_lock(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
           if (st->aborted.load()) return;
           st->why = why;
           st->aborted = true;
           ncclCommAbort(st->comm);
         },
         [st]() -> std::string {
           std::unique_lock lock(st->mu, std::try_to_lock);
           if (!lock || st->aborted.load()) return {};
           ncclResult_t a = ncclSuccess;
           if (ncclCommGetAsyncError(st->comm, &a) != ncclSuccess || a == ncclSuccess || a == ncclInProgress) return {};
           const char* last = ncclGetLastError(st->comm);
           return std::string("asynchronous NCCL error: ") + ncclGetErrorString(a) +
                  (last && *last ? std::string(" (") + last + ")" : std::string());
         }});
    (void)watchdog::start();
  }
  ncclConfig_t config() const {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 1;
    if (opt_.max_ctas > 0) {
      cfg.maxCTAs = opt_.max_ctas;
      cfg.minCTAs = std::min(cfg.minCTAs > 0 ? cfg.minCTAs : 1, opt_.max_ctas);
    }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    if (opt_.copy_engine_gathers) cfg.CTAPolicy = NCCL_CTA_POLICY_ZERO;
#endif
    return cfg;
  }
  void init(int rank, int size, const ncclUniqueId& id) {
    ncclConfig_t cfg = config();
    rank_ = rank;
    size_ = size;
    ncclUniqueId copy = id;
    issue("init", 0, dtype::u8, [&] { return ncclCommInitRankConfig(&comm_, size, copy, rank, &cfg); });
    watch();
  }
  static ncclDataType_t type(dtype t) {
    switch (t) {
      case dtype::f32: return ncclFloat32;
      case dtype::f64: return ncclFloat64;
      case dtype::bf16: return ncclBfloat16;
      case dtype::f16: return ncclFloat16;
      case dtype::i32: return ncclInt32;
      case dtype::i64: return ncclInt64;
      case dtype::u8: return ncclUint8;
      case dtype::f8e4m3: return ncclFloat8e4m3;
      case dtype::f8e5m2: return ncclFloat8e5m2;
    }
    return ncclFloat32;
  }
  static ncclRedOp_t nccl_op(reduce_op op) {
    switch (op) {
      case reduce_op::sum: return ncclSum;
      case reduce_op::avg: return ncclAvg;
      case reduce_op::max: return ncclMax;
      case reduce_op::min: return ncclMin;
    }
    return ncclSum;
  }
  [[noreturn]] void fail_op(const char* what, std::size_t n, dtype t, const std::string& why) {
    {
      std::lock_guard lock(state_->mu);
      if (comm_ && !state_->aborted.load()) {
        state_->aborted = true;
        ncclCommAbort(comm_);
      }
    }
    tessera::detail::fail(tessera::detail::concat("NCCL ", what, " (", n, " x ", name_of(t), ") on rank ", rank_, " of ",
                                                  size_, " ", why, "; the communicator was aborted and cannot be used again"));
  }
  // After the watchdog aborted the communicator, every call says why.
  void throw_if_aborted(const char* what, std::size_t n, dtype t) {
    if (!state_->aborted.load(std::memory_order_acquire)) [[likely]] return;
    std::lock_guard lock(state_->mu);
    tessera::detail::fail(tessera::detail::concat(
        "NCCL ", what, " (", n, " x ", name_of(t), ") on rank ", rank_, " of ", size_, ": the communicator was aborted",
        state_->why.empty() ? std::string(" and cannot be used again") : " by the watchdog (" + state_->why + ")"));
  }
  // Issues an NCCL call under the communicator's lock (the watchdog aborts under it).
  template <class F>
  void issue(const char* what, std::size_t n, dtype t, F&& call) {
    throw_if_aborted(what, n, t);
    ncclResult_t rc;
    {
      std::lock_guard lock(state_->mu);
      rc = call();
    }
    if (rc != ncclSuccess) {
      std::string why = std::string("failed: ") + ncclGetErrorString(rc);
      if (comm_) {
        const char* last = ncclGetLastError(comm_);
        if (last && *last) why += std::string(" (") + last + ")";
      }
      fail_op(what, n, t, why);
    }
  }
  // With the order check: every rank issues the same collective (over the MPI duplicate).
  void check_order(std::uint64_t seq, const char* what, std::size_t n, dtype t) {
    const auto mine = detail::describe_call(seq, what, n, t);
    const std::string bad = detail::order_mismatch(
        mine, size_, channel_,
        [&](std::int64_t* v) { checker_->all_reduce(v, v, 2, dtype::i64, reduce_op::max); },
        [&](const detail::call_desc& d, detail::call_desc* all) { checker_->all_gather(&d, all, sizeof d, dtype::u8); });
    if (!bad.empty()) ::tessera::detail::fail(bad + " (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")");
  }
  // The collective on the communicator's stream, ordered after the compute
  // stream's work so far; recorded, and watched through its completion event.
  template <class F>
  request run(const char* what, std::size_t n, dtype t, F&& call) {
    throw_if_aborted(what, n, t);
    trace::global().throw_if_faulted(what);
    const cudaStream_t compute = cuda::current_stream();
    // cudaStreamWaitEvent takes the event's state when called, so one event
    // serves every "inputs ready" edge; completion events are pooled.
    ready_.record(compute);
    ready_.wait_on(stream_.get());
    auto done = done_pool_.next();
    auto& rec = trace::global();
    // Captured into a CUDA graph (optim/step_graph.cuh), the collective runs
    // at each launch, not now: the recorder notes it as issued and complete,
    // and nothing polls its event (querying an event recorded in a capture
    // is an error). Captured steps run on one rank only, with no peer to wait for.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TESSERA_CUDA(cudaStreamIsCapturing(compute, &capture));
    const bool captured = capture == cudaStreamCaptureStatusActive;
    const auto tk = captured ? rec.issue(channel_, what, n, t, false)
                             : rec.issue(channel_, what, n, t, true,
                                         [done] { return cudaEventQuery(done->get()) != cudaErrorNotReady; });
    try {
      if (checker_ && !captured) check_order(tk.seq, what, n, t);
      issue(what, n, t, call);
      done->record(stream_.get());
      if (captured) rec.complete(tk);
    } catch (...) {
      rec.complete(tk, false);
      throw;
    }
    return request([this, done, what, n, t] {
      throw_if_aborted(what, n, t);
      done->wait_on(cuda::current_stream());  // the stream current at wait() (backend_ops::after waits on a side stream)
    });
  }

  nccl_options opt_;
  ncclComm_t comm_ = nullptr;
  std::shared_ptr<shared_state> state_ = std::make_shared<shared_state>();
  cuda::stream stream_;
  cuda::event ready_;
  cuda::event_pool done_pool_;  // completion events, one per request in flight
  int rank_ = 0, size_ = 1;
  int channel_ = -1;
  std::shared_ptr<mpi> checker_;  // the order check's MPI duplicate, if asked for
  void* barrier_ = nullptr;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
  using window_t = ncclWindow_t;
#else
  using window_t = void*;
#endif
  std::unordered_map<void*, std::pair<window_t, std::size_t>> windows_;  // alloc_symmetric's, with their bytes
};

}  // namespace tessera::comm
