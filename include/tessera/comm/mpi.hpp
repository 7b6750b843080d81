#pragma once
//! \file comm::mpi: a communicator over MPI for host memory (mpi_session, the
//! RAII owner of MPI_Init / MPI_Finalize, is in comm/mpi_session.hpp).
//!
//! Every communicator it creates is a duplicate with MPI_ERRORS_RETURN, so a
//! failed call becomes a tessera::error instead of MPI's default abort. MPI has
//! no bf16 / fp16 types: they travel as 16-bit words and are reduced by user
//! ops that add in float and round once per step of the reduction.
//!
//! Every collective is recorded (comm/trace.hpp) and held to a deadline by the
//! watchdog (mpi_options::timeout_s, default 600 s or TESSERA_TIMEOUT_S): a
//! rank still inside a collective when it passes prints the collective, writes
//! its trace file and ends the job with MPI_Abort. With
//! mpi_options::order_check (the default) every collective first checks that
//! all ranks issue the same one (comm/order_check.hpp).
#include "tessera/comm/mpi_session.hpp"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <exception>
#include <cstring>
#include <vector>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/mpi_half.hpp"
#include "tessera/comm/order_check.hpp"
#include "tessera/comm/trace.hpp"
#include "tessera/comm/watchdog.hpp"

namespace tessera::comm {


//! Asks the other ranks on this host for their trace files and gives them a
//! moment (TESSERA_ABORT_GRACE_S, default 1 s) before the job ends.
inline void end_job_after_peers_dump() noexcept {
  if (trace::global().ask_peers_to_dump() == 0) return;
  double grace = 1;
  if (const char* e = std::getenv("TESSERA_ABORT_GRACE_S")) grace = std::atof(e);
  if (grace > 0) ::usleep(useconds_t(std::min(grace, 60.0) * 1e6));
}

struct mpi_options {
  //! Seconds a rank may wait in one collective before the watchdog ends the
  //! job (message, trace file, MPI_Abort); 0 = no deadline; < 0 = the default:
  //! TESSERA_TIMEOUT_S, else 600.
  double timeout_s = -1;
  //! Check before every collective that all ranks issue the same one (one
  //! 16-byte all-reduce more per collective).
  bool order_check = true;
};

//! Host-memory communicator over an MPI communicator it duplicates and owns.
//! Requests it returns refer to it: keep it in place (do not move it) while
//! any of them is pending.
class mpi {
public:
  using backend_type = backend::host;

  //! Duplicates parent (MPI_COMM_WORLD by default). Collective over parent.
  explicit mpi(MPI_Comm parent = MPI_COMM_WORLD, mpi_options o = {}) : opt_(o) {
    {  // a rank stopped before it gets here would leave the others inside MPI_Comm_dup
      const detail::startup_deadline deadline(default_timeout_s(opt_.timeout_s),
                                              "creating the communicator (MPI_Comm_dup)");
      TESSERA_MPI(MPI_Comm_dup(parent, &comm_));
    }
    init(parent == MPI_COMM_WORLD);
  }
  explicit mpi(mpi_options o) : mpi(MPI_COMM_WORLD, o) {}
  mpi(mpi&& o) noexcept
      : opt_(o.opt_), comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_),
        channel_(std::exchange(o.channel_, -1)), diverged_(o.diverged_) {}
  mpi& operator=(mpi&& o) noexcept {
    if (this != &o) {
      free();
      opt_ = o.opt_;
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      size_ = o.size_;
      channel_ = std::exchange(o.channel_, -1);
      diverged_ = o.diverged_;
    }
    return *this;
  }
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  ~mpi() { free(); }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] MPI_Comm native() const noexcept { return comm_; }
  [[nodiscard]] const mpi_options& options() const noexcept { return opt_; }
  //! This communicator's number in the flight recorder (comm/trace.hpp).
  [[nodiscard]] int channel() const noexcept { return channel_; }

  //! Ranks with the same color form a new communicator, ordered by key. Collective.
  [[nodiscard]] mpi split(int color, int key) const {
    MPI_Comm c = MPI_COMM_NULL;
    {
      const detail::startup_deadline deadline(default_timeout_s(opt_.timeout_s),
                                              "splitting the communicator (MPI_Comm_split)");
      TESSERA_MPI(MPI_Comm_split(comm_, color, key, &c));
    }
    return mpi(c, opt_, adopt_tag{});
  }

  void all_gather(const void* s, void* r, std::size_t n, dtype t) {
    const int cnt = count(n, "all_gather");
    const void* src = in_place_gather(s, r, n, t) ? MPI_IN_PLACE : s;
    const auto tk = begin("all_gather", n, t, true);
    done(tk, MPI_Allgather(src, cnt, type(t), r, cnt, type(t), comm_), "MPI_Allgather", n, t);
  }
  void reduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    check_reducible(t, op, "comm::mpi");  // before the trace records a call
    const int cnt = count(n, "reduce_scatter");
    const auto tk = begin("reduce_scatter", n, t, true);
    done(tk, MPI_Reduce_scatter_block(s, r, cnt, type(t), mpi_op(t, op), comm_), "MPI_Reduce_scatter_block", n, t);
    if (op == reduce_op::avg) scale(r, n, t);
  }
  void all_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    check_reducible(t, op, "comm::mpi");  // before the trace records a call
    const int cnt = count(n, "all_reduce");
    const auto tk = begin("all_reduce", n, t, true);
    done(tk, MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, cnt, type(t), mpi_op(t, op), comm_), "MPI_Allreduce", n, t);
    if (op == reduce_op::avg) scale(r, n, t);
  }
  void broadcast(void* b, std::size_t n, dtype t, int root) {
    const int cnt = count(n, "broadcast");
    const auto tk = begin("broadcast", n, t, true);
    done(tk, MPI_Bcast(b, cnt, type(t), root, comm_), "MPI_Bcast", n, t);
  }
  void barrier() {
    const auto tk = begin("barrier", 0, dtype::u8, true);
    done(tk, MPI_Barrier(comm_), "MPI_Barrier", 0, dtype::u8);
  }

  request iall_gather(const void* s, void* r, std::size_t n, dtype t) {
    const int cnt = count(n, "iall_gather");
    MPI_Request q;
    const void* src = in_place_gather(s, r, n, t) ? MPI_IN_PLACE : s;
    const auto tk = begin("all_gather", n, t, false);
    started(tk, MPI_Iallgather(src, cnt, type(t), r, cnt, type(t), comm_, &q), "MPI_Iallgather", n, t);
    return finish(q, tk, "MPI_Iallgather", nullptr, 0, t);
  }
  request ireduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    check_reducible(t, op, "comm::mpi");  // before the trace records a call
    const int cnt = count(n, "ireduce_scatter");
    MPI_Request q;
    const auto tk = begin("reduce_scatter", n, t, false);
    started(tk, MPI_Ireduce_scatter_block(s, r, cnt, type(t), mpi_op(t, op), comm_, &q), "MPI_Ireduce_scatter_block", n, t);
    return finish(q, tk, "MPI_Ireduce_scatter_block", op == reduce_op::avg ? r : nullptr, n, t);
  }
  request iall_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    check_reducible(t, op, "comm::mpi");  // before the trace records a call
    const int cnt = count(n, "iall_reduce");
    MPI_Request q;
    const auto tk = begin("all_reduce", n, t, false);
    started(tk, MPI_Iallreduce(s == r ? MPI_IN_PLACE : s, r, cnt, type(t), mpi_op(t, op), comm_, &q), "MPI_Iallreduce", n, t);
    return finish(q, tk, "MPI_Iallreduce", op == reduce_op::avg ? r : nullptr, n, t);
  }

private:
  struct adopt_tag {};
  mpi(MPI_Comm c, mpi_options o, adopt_tag) : opt_(o), comm_(c) { init(false); }

  void init(bool world) {
    TESSERA_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    TESSERA_MPI(MPI_Comm_rank(comm_, &rank_));
    TESSERA_MPI(MPI_Comm_size(comm_, &size_));
    opt_.timeout_s = default_timeout_s(opt_.timeout_s);
    auto& rec = trace::global();
    if (world) {
      rec.set_process_rank(rank_, size_);
      learn_peers(rec);
    }
    // A rank blocked inside MPI cannot be woken: past the deadline the
    // watchdog (which already printed and wrote the trace) asks the other
    // ranks on this host to write theirs, then ends the job.
    channel_ = rec.open({"mpi", rank_, size_, opt_.timeout_s,
                         [](const std::string&) {
                           end_job_after_peers_dump();
                           MPI_Abort(MPI_COMM_WORLD, 1);
                         },
                         nullptr});
    (void)watchdog::start();
  }
  // Every rank's process id and host, so that a fault can ask the ranks on
  // this host for their trace files (one all-gather, at construction); and
  // every rank's order_check, which must agree: a rank checking the order
  // sends a 16-byte all-reduce before each collective that a rank not
  // checking never posts (MPI_ERR_TRUNCATE, or a hang, far from the cause).
  void learn_peers(trace::recorder& rec) {
    struct who {
      std::int64_t pid;
      std::int32_t order_check, pad;
      char host[48];
    } me{std::int64_t(::getpid()), opt_.order_check ? 1 : 0, 0, {}};
    ::gethostname(me.host, sizeof me.host - 1);
    std::vector<who> all(static_cast<std::size_t>(size_));
    TESSERA_MPI(MPI_Allgather(&me, int(sizeof me), MPI_BYTE, all.data(), int(sizeof me), MPI_BYTE, comm_));
    for (int r = 0; r < size_; ++r)  // every rank sees the same table: all throw, none waits
      if (all[std::size_t(r)].order_check != all[0].order_check) {
        MPI_Comm_free(&comm_);
        throw error("comm::mpi: rank " + std::to_string(r) + " has the order check " +
                    (all[std::size_t(r)].order_check ? "on" : "off") + " and rank 0 has it " +
                    (all[0].order_check ? "on" : "off") +
                    " (mpi_options::order_check, a trainer's --order-check): every rank must set the same");
      }
    std::vector<int> pids;
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && std::strncmp(all[std::size_t(r)].host, me.host, sizeof me.host) == 0)
        pids.push_back(int(all[std::size_t(r)].pid));
    rec.set_peers(std::move(pids));
  }
  void free() noexcept {
    end_check();
    if (channel_ >= 0) trace::global().close(channel_);
    channel_ = -1;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  // A rank that leaves (returns, throws or exits, destroying its
  // communicator) while the others still expect collectives: with the order
  // check, a communicator's end is a collective too ("end", a barrier), so a
  // peer still issuing collectives fails at its next one, this rank named,
  // instead of waiting for the watchdog (and a peer that left early is named
  // here). Every rank ends its communicators in the same order in a program
  // that runs the same collectives, so a normal end costs one barrier. After
  // a mismatch on this communicator every rank was told: no end check.
  void end_check() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ == MPI_COMM_NULL || finalized || size_ <= 1 || !opt_.order_check || diverged_ || channel_ < 0 ||
        trace::global().faulted())
      return;
    try {
      label l("leaving:", "its communicator was destroyed (returned, threw or exited)");
      const auto tk = begin("end", 0, dtype::u8, true);
      done(tk, MPI_Barrier(comm_), "MPI_Barrier (end)", 0, dtype::u8);
    } catch (const std::exception& e) {
      // While an exception unwinds this rank, that exception is the cause, and
      // whoever catches it reports it; the peers report this rank leaving.
      if (std::uncaught_exceptions() == 0)
        std::fprintf(stderr, "%s%s\n", std::string_view(e.what()).starts_with("tessera:") ? "" : "tessera: ", e.what());
    }
  }

  // Records the collective (its deadline starts now where the call blocks)
  // and, with the order check, agrees with the other ranks that they issue
  // the same one. Throws the mismatch on every rank.
  trace::recorder::ticket begin(const char* op, std::size_t n, dtype t, bool blocking) {
    auto& rec = trace::global();
    rec.throw_if_faulted(op);
    const bool check_order = opt_.order_check && size_ > 1;
    const auto tk = rec.issue(channel_, op, n, t, blocking || check_order);
    if (check_order) try {
      const auto mine = detail::describe_call(tk.seq, op, n, t);
      const std::string bad = detail::order_mismatch(
          mine, size_, channel_,
          [&](std::int64_t* v) {
            check(MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_MAX, comm_), "MPI_Allreduce (order check)", 2,
                  dtype::i64);
          },
          [&](const detail::call_desc& d, detail::call_desc* all) {
            check(MPI_Allgather(&d, int(sizeof d), MPI_BYTE, all, int(sizeof d), MPI_BYTE, comm_),
                  "MPI_Allgather (order check)", sizeof d, dtype::u8);
          });
      if (!bad.empty()) {
        diverged_ = true;  // every rank saw it: the communicator's end is not checked (end_check)
        ::tessera::detail::fail(bad + " (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")");
      }
      if (!blocking) rec.idle(tk);  // the deadline of a request starts when it is waited for
    } catch (...) {
      rec.complete(tk, false);
      throw;
    }
    return tk;
  }
  // Ends a blocking collective: recorded as completed or failed, thrown if failed.
  void done(const trace::recorder::ticket& tk, int rc, const char* what, std::size_t n, dtype t) {
    trace::global().complete(tk, rc == MPI_SUCCESS);
    check(rc, what, n, t);
  }
  // A non-blocking collective that failed to start is recorded as failed.
  void started(const trace::recorder::ticket& tk, int rc, const char* what, std::size_t n, dtype t) {
    if (rc != MPI_SUCCESS) done(tk, rc, what, n, t);
  }

  // Names the operation, rank, world size and payload, so a failure on one of
  // many ranks can be told apart in a merged log.
  void check(int rc, const char* what, std::size_t n, dtype t,
             ::tessera::source_location where = ::tessera::source_location::current()) const {
    if (rc == MPI_SUCCESS) [[likely]] return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(rc, text, &len);
    int cls = rc;
    MPI_Error_class(rc, &cls);
    throw error(tessera::detail::concat(what, " failed on rank ", rank_, " of ", size_, " (", n, " x ",
                                        name_of(t), "): ", std::string(text, std::size_t(len))),
                what, cls, where);
  }
  static int count(std::size_t n, const char* op) {
    TESSERA_CHECK(n <= std::size_t(INT_MAX), "comm::mpi ", op, " of ", n,
                  " elements exceeds MPI's int count; split the buffer");
    return int(n);
  }
  bool in_place_gather(const void* s, const void* r, std::size_t n, dtype t) const noexcept {
    return s == static_cast<const char*>(r) + std::size_t(rank_) * n * size_of(t);
  }
  static MPI_Datatype type(dtype t) {
    switch (t) {
      case dtype::f32: return MPI_FLOAT;
      case dtype::f64: return MPI_DOUBLE;
      case dtype::bf16: case dtype::f16: return MPI_UINT16_T;
      case dtype::i32: return MPI_INT32_T;
      case dtype::i64: return MPI_INT64_T;
      case dtype::u8: case dtype::f8e4m3: case dtype::f8e5m2: return MPI_UINT8_T;
    }
    return MPI_DATATYPE_NULL;
  }
  static MPI_Op mpi_op(dtype t, reduce_op op) {
    if (t == dtype::bf16) return detail::half_op<bf16>(op);
    if (t == dtype::f16) return detail::half_op<fp16>(op);
    switch (op) {
      case reduce_op::max: return MPI_MAX;
      case reduce_op::min: return MPI_MIN;
      default: return MPI_SUM;  // avg = sum, then scale()
    }
  }
  // MPI has no average: divide the sum by the world size.
  void scale(void* r, std::size_t n, dtype t) const {
    const double inv = 1.0 / size_;
    auto each = [&]<class T>(T*) {
      T* p = static_cast<T*>(r);
      for (std::size_t i = 0; i < n; ++i) p[i] = convert<T>(convert<double>(p[i]) * inv);
    };
    switch (t) {
      case dtype::f32: each((float*)nullptr); break;
      case dtype::f64: each((double*)nullptr); break;
      case dtype::bf16: each((bf16*)nullptr); break;
      case dtype::f16: each((fp16*)nullptr); break;
      default: TESSERA_CHECK(false, "average of an integer dtype ", name_of(t));
    }
  }
  request finish(MPI_Request q, trace::recorder::ticket tk, const char* what, void* avg_out, std::size_t n, dtype t) {
    return request([this, q, tk, what, avg_out, n, t]() mutable {
      trace::global().waiting(tk);
      done(tk, MPI_Wait(&q, MPI_STATUS_IGNORE), what, n, t);
      if (avg_out) scale(avg_out, n, t);
    });
  }

  mpi_options opt_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  int channel_ = -1;
  bool diverged_ = false;  // an order mismatch was reported on this communicator
};

//! Prints `what` with this process's rank, writes the trace file, and ends
//! every rank of the job (MPI_Abort). For a program's last resort: an error
//! on one rank must not leave the others waiting in a collective.
[[noreturn]] inline void abort_job(std::string_view what, int code = 1) noexcept {
  int inited = 0, finalized = 0, rank = 0, size = 1;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  const std::string msg(what);
  const auto path = trace::global().dump("error", msg);
  std::fprintf(stderr, "%s%s [rank %d of %d]%s%s\n", msg.starts_with("tessera:") ? "" : "tessera: ", msg.c_str(), rank,
               size, path.empty() ? "" : "; trace written to ", path.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  end_job_after_peers_dump();
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

//! The number of ranks on this rank's node (MPI_COMM_TYPE_SHARED): the
//! default shard group of a mesh (comm/mesh.hpp). Collective. Every node
//! must hold the same number of ranks, numbered contiguously (what srun and
//! mpirun's default by-slot mapping do); else a tessera: error on every rank
//! that names the layout found, and a mesh needs an explicit S.
[[nodiscard]] inline int node_size(const mpi& world) {
  MPI_Comm node = MPI_COMM_NULL;
  TESSERA_MPI(MPI_Comm_split_type(world.native(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &node));
  int local = 0, n = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  // Uniform and contiguous on every rank: the min and max of n agree, and
  // every rank sits at position rank % n of its node.
  int v[3] = {n, -n, local == world.rank() % n ? 1 : 0};
  int got[3];
  TESSERA_MPI(MPI_Allreduce(v, got, 3, MPI_INT, MPI_MIN, world.native()));
  TESSERA_CHECK(got[0] == -got[1] && got[2] == 1, "node_size: nodes hold between ", got[0], " and ", -got[1],
                " ranks", got[2] ? "" : ", not numbered contiguously per node",
                "; a mesh's default shard group is one node, so give the shard group size explicitly "
                "(--shard-group S)");
  return n;
}

//! The main of an MPI program that uses Tessera: initialises MPI
//! (mpi_session), runs body() and returns its exit code. An exception on any
//! rank prints its message with the rank, writes the trace file and ends
//! every rank of the job within seconds (abort_job), instead of finalising
//! MPI during unwinding while the other ranks wait in a collective.
//!   int main(int argc, char** argv) {
//!     return tessera::comm::mpi_main(argc, argv, [&] { ...; return 0; });
//!   }
//! startup_timeout_s bounds MPI's start-up (mpi_session; < 0: the default).
template <class F>
int mpi_main(int& argc, char**& argv, F&& body, double startup_timeout_s = -1) noexcept {
  std::optional<mpi_session> session;
  try {
    session.emplace(&argc, &argv, startup_timeout_s);
  } catch (const std::exception& e) {
    abort_job(e.what());
  }
  try {
    return std::forward<F>(body)();
  } catch (const std::exception& e) {
    abort_job(e.what());
  } catch (...) {
    abort_job("an exception that is not a std::exception");
  }
}

}  // namespace tessera::comm
