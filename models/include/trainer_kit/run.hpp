#pragma once
// The trainer kit: what the reference trainers (tessera-mlp-lm, tessera-gpt)
// share outside their models: memory accounting, the test hooks (checkpoint
// crashes, injected faults), the command-line agreement across ranks, the
// final weights as one file, and eager steps where a net offers no step graph.
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tessera/checkpoint/consolidate.hpp"
#include "tessera/tessera.hpp"
#include "trainer_kit/paths.hpp"
#include "trainer_kit/report.hpp"

namespace trainer_kit {

//! The program's name in the hooks' messages (each trainer sets it in main).
inline const char* program_name = "tessera";

//! Bytes the device holds beyond what was there at `baseline` (the CUDA
//! context, NCCL, cuBLAS); for the host backend, the library's own count.
struct device_usage {
  virtual ~device_usage() = default;
  [[nodiscard]] virtual std::size_t used() const = 0;
};
//! The host backend's: the library's own count (its peak).
struct host_usage final : device_usage {
  [[nodiscard]] std::size_t used() const override { return tessera::memory_of<tessera::backend::host>().peak(); }
};

//! The crash test hook (tests/checkpoint/check_checkpoints.py):
//! TESSERA_CHECKPOINT_CRASH=<point>[:<n>] ends the process the n-th time
//! (default the first) a save reaches <point>, as a kill would. The library
//! only calls save_options::at_point; exiting is this program's choice.
inline std::function<void(std::string_view)> crash_hook_from_env() {
  const char* e = std::getenv("TESSERA_CHECKPOINT_CRASH");
  if (!e) return {};
  const std::string spec = e, point = spec.substr(0, spec.find(':'));
  const int nth = spec.find(':') == std::string::npos ? 1 : std::atoi(spec.c_str() + spec.find(':') + 1);
  return [point, nth, seen = std::make_shared<int>(0)](std::string_view where) {
    if (where == point && ++*seen == nth) {
      std::fprintf(stderr, "%s: TESSERA_CHECKPOINT_CRASH=%s: exiting in the middle of a save\n", program_name, point.c_str());
      std::_Exit(86);
    }
  };
}

//! Every rank runs rank 0's command line: `described` is this rank's
//! options as "name=value" lines; a differing option (given to one rank only,
//! or an environment that expands differently) is one clear error on every
//! rank, naming the first option that differs. Collective.
inline void agree_on_text(tessera::comm::mpi& world, const std::string& mine) {
  std::vector<std::uint8_t> text(8192, 0);
  std::exception_ptr err;
  try {
    TESSERA_CHECK(mine.size() < text.size(), "the command line is too long to compare (", mine.size(), " bytes)");
  } catch (...) {
    err = std::current_exception();
  }
  tessera::comm::agree_or_throw(world, err, "the command-line check");
  std::memcpy(text.data(), mine.data(), mine.size());
  tessera::comm::broadcast_host(world, std::span<std::uint8_t>(text), 0);
  const std::string root(reinterpret_cast<const char*>(text.data()));
  try {
    if (root != mine) {
      std::istringstream a(mine), b(root);
      for (std::string x, y; std::getline(a, x) && std::getline(b, y);)
        if (x != y)
          throw tessera::error("rank " + std::to_string(world.rank()) + " was started with --" + x + ", rank 0 with --" + y +
                               "; every rank must get the same options");
    }
  } catch (...) {
    err = std::current_exception();
  }
  tessera::comm::agree_or_throw(world, err, "the command-line check");
}

//! Every rank reads what rank 0 reads: the same option text can name other
//! files on another rank (a relative path from another working directory, a
//! node's own copy). A difference is one error on every rank naming the
//! option. Collective.
inline void agree_on_data(tessera::comm::mpi& world, const std::vector<data_digest>& mine) {
  for (const data_digest& d : mine) {
    tessera::comm::label lbl("the data check");
    // Every rank learns the answer from the same all-reduce: all throw, none waits.
    if (!tessera::comm::all_same(world, d.value))
      throw tessera::error("the ranks read different " + d.flag + " files (the same names, other contents: a relative "
                           "path from another working directory, or a copy that differs); every rank must read the "
                           "same data");
  }
}

//! The fault-injection hook of the never-hang tests (tests/fault):
//! TESSERA_TEST_FAULT=<kind>:<rank>:<step> makes that rank, at the start of
//! that step, stop (SIGSTOP), die (SIGKILL), throw a tessera::error, or spin
//! outside the library (busy) forever; stopwait stops it 30 ms later from
//! another thread, wherever the step then is (most often inside a wait).
inline void fault_hook(int rank, long step) {
  static const char* spec = std::getenv("TESSERA_TEST_FAULT");
  if (!spec) return;
  char kind[16] = {};
  int r = -1;
  long s = -1;
  if (std::sscanf(spec, "%15[a-z]:%d:%ld", kind, &r, &s) != 3 || r != rank || s != step) return;
  const std::string k = kind;
  std::fprintf(stderr, "%s: TESSERA_TEST_FAULT=%s: rank %d at step %ld\n", program_name, spec, rank, step);
  std::fflush(stderr);
  if (k == "stop") std::raise(SIGSTOP);
  else if (k == "kill") std::raise(SIGKILL);
  else if (k == "error") throw tessera::error("TESSERA_TEST_FAULT: an error on rank " + std::to_string(rank) + " only");
  else if (k == "busy") for (volatile bool forever = true; forever;) {}
  else if (k == "stopwait") std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      std::raise(SIGSTOP);
    }).detach();
}

//! Whether `path` can take the file `flag` writes at the end of the run,
//! checked before training (a bad path found only then loses the run): it is
//! not a directory and its folder takes a file (the writer's `path.tmp`,
//! created and removed here), probed by rank 0, the writer. A tessera: error
//! naming the flag on every rank where not. Collective.
inline void check_output_file(tessera::comm::mpi& world, std::string_view flag, const std::string& path,
                              const std::vector<input_path>& inputs = {}) {
  namespace fs = std::filesystem;
  std::exception_ptr err;
  if (world.rank() == 0) try {
      std::error_code ec;
      if (fs::is_directory(path, ec))
        throw tessera::error(std::string(flag) + " " + path + " is a directory; give the file to write");
      for (const input_path& in : inputs)
        if (overwrites(path, in.path))
          throw tessera::error(std::string(flag) + " " + path + " would overwrite " + in.flag + " '" + in.path +
                               "'" + (fs::is_directory(in.path, ec) ? " (a file inside it)" : "") +
                               ": this run reads it; give another file");
      const fs::path probe = path + ".tmp";
      std::FILE* f = std::fopen(probe.c_str(), "wb");
      if (!f)
        throw tessera::error(std::string(flag) + " " + path + ": cannot create a file in '" +
                             fs::absolute(probe, ec).parent_path().string() + "': " + std::strerror(errno));
      std::fclose(f);
      fs::remove(probe, ec);
    } catch (...) {
      err = std::current_exception();
    }
  tessera::comm::agree_or_throw(world, err, std::string("checking ") + std::string(flag));
}

//! The final weights, gathered, as one safetensors file written by rank 0
//! (collective); `metadata` goes into its header (the step and the model's flags).
template <class Wrapper>
void dump_weights(Wrapper& model, const std::string& path, const std::map<std::string, std::string>& metadata) {
  using M = typename Wrapper::main_type;
  std::vector<tessera::checkpoint::tensor_out> outs;
  std::vector<std::vector<M>> values;
  for (std::size_t u = 0; u < model.num_units(); ++u) {
    const auto& L = model.layout(tessera::unit_id{int(u)});  // the wrapper's own: no temporary view
    for (std::size_t t = 0; t < L.tensors().size(); ++t) {
      values.push_back(model.get_param({int(u), int(t)}));
      outs.push_back({L.name() + "." + L.tensors()[t].spec.name, std::string(tessera::checkpoint::dtype_name<M>()),
                      L.tensors()[t].spec.shape.extents()});
    }
  }
  if (model.rank() == 0 && model.replica_rank() == 0)  // one writer on a mesh too
    tessera::checkpoint::write_safetensors(path, outs, [&](std::size_t i, std::vector<unsigned char>& dst) {
      std::memcpy(dst.data(), values[i].data(), dst.size());
    }, metadata);
}

// The trainer's steps without a step graph (the host backend, or graphs off).
template <class Opt>
struct eager_runner {
  Opt& opt;
  template <class FB> auto step(FB&& fb) {
    fb();
    return opt.step();
  }
  void finish() {}
  [[nodiscard]] bool captured() const noexcept { return false; }
  [[nodiscard]] std::size_t nodes() const noexcept { return 0; }
};
// Whether a net offers step graphs (the CUDA nets name tessera::step_graph as graph_runner).
template <class Net, class Opt>
inline constexpr bool has_step_graph = requires { typename Net::template graph_runner<Opt>; };

// A step graph where the net offers one, else eager steps.
template <class Net, class Opt>
auto make_step_runner(Opt& opt, bool graphs) {
  if constexpr (has_step_graph<Net, Opt>) return typename Net::template graph_runner<Opt>(opt, graphs);
  else return eager_runner<Opt>{opt};
}

// --cuda-graphs auto|on|off, decided once for both trainers. `refusal` is why
// this run's step cannot be one graph (nullptr where it can): the reasons every
// trainer shares first, then the trainer's own (`extra`, e.g. an offloaded
// optimizer). "on" where it cannot is an error before anything is allocated;
// auto falls back to eager steps and the done line says why.
struct step_graph_choice {
  bool graphs = false;
  const char* refusal = nullptr;
  bool asked = false;  // auto on a backend that has graphs: worth naming the refusal

  // The done line's note: the graph's size where one ran, else the refusal where auto asked for one.
  template <class Runner>
  [[nodiscard]] std::string note(const Runner& runner) const {
    if (runner.captured())
      return " (steps as one CUDA graph of " + std::to_string(runner.nodes()) + " nodes after the first two)";
    return refusal && asked ? std::string(" (no step graphs: ") + refusal + ")" : std::string();
  }
};
inline step_graph_choice choose_step_graphs(const std::string& mode, bool graphable, int ranks, bool deterministic,
                                            int micro_batches, const char* extra = nullptr) {
  const char* refusal = !graphable                             ? "the host backend"
                        : ranks > 1                            ? "several ranks"
                        : deterministic && micro_batches > 1   ? "--deterministic with several micro-batches per rank"
                                                               : extra;
  if (mode == "on" && refusal)
    throw tessera::error(std::string("--cuda-graphs on: step graphs do not run with ") + refusal + " (use auto or off)");
  return {mode != "off" && !refusal, refusal, mode == "auto" && graphable};
}

}  // namespace trainer_kit
