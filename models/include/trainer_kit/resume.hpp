#pragma once
// What a reference trainer writes into a checkpoint besides the weights and
// the optimizer (checkpoint::save_options::extra), and what it checks when it
// resumes: where the data stream is (next_step, seed), which model wrote it
// (the program and the model's own configuration: identity), and what the
// data stream depends on (the model's position fields, checked by the model).
// A checkpoint of another model, or of another configuration of this one that
// happens to have the same tensor shapes (GPT-2 with another head count), is
// refused with the flag that differs, not resumed into a different network.
// And whose run a --save root holds: a fresh run never saves (or retires
// with --keep) among another run's checkpoints.
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "tessera/checkpoint/directory.hpp"
#include "tessera/comm/staged.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/hash.hpp"

namespace trainer_kit {

//! x[k] as an integer in [lo, hi], or a tessera error naming the checkpoint
//! and the field (not a json exception, not a run that resumes at step -5).
inline long long resume_field(const nlohmann::json& x, const std::string& path, const char* k, long long lo, long long hi,
                              const char* program) {
  if (!x.contains(k) || !x[k].is_number_integer() || x[k].get<long long>() < lo || x[k].get<long long>() > hi)
    throw tessera::error("checkpoint '" + path + "': field '" + k + "' is " +
                         (!x.contains(k) ? std::string("missing")
                          : x[k].is_number_integer() ? std::to_string(x[k].get<long long>())
                                                     : std::string(x[k].type_name())) +
                         ", expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         "] (not written by " + program + "?)");
  return x[k].get<long long>();
}

//! The fields every trainer's checkpoints carry: the next step, the seed, the
//! program that wrote it and the model's identity (its configuration, as the
//! flags name it), then the model's position fields.
inline nlohmann::json checkpoint_extra(const char* program, long next_step, std::uint64_t seed, const std::string& data,
                                       const nlohmann::json& identity, const nlohmann::json& position) {
  nlohmann::json x{{"next_step", next_step}, {"seed", seed}, {"data", data}, {"model", program}};
  for (const auto& [k, v] : identity.items()) x[k] = v;
  for (const auto& [k, v] : position.items()) x[k] = v;
  return x;
}

//! Checks what every trainer's checkpoint must hold to be resumed by
//! `program` with this identity: next_step and seed in range, the program
//! that wrote it (where it says), and each identity field it records equal to
//! this run's (a field it does not record is not compared: checkpoints
//! written before the field existed still load). Returns next_step.
inline long check_resume_common(const nlohmann::json& x, const std::string& path, const char* program,
                                const nlohmann::json& identity) {
  const long next = long(resume_field(x, path, "next_step", 0, 1LL << 40, program));
  if (!x.contains("seed") || !x["seed"].is_number_unsigned())
    throw tessera::error("checkpoint '" + path + "': field 'seed' is missing or not a non-negative integer");
  if (x.contains("model") && (!x["model"].is_string() || x["model"].get<std::string>() != program))
    throw tessera::error("checkpoint '" + path + "' was written by " +
                         (x["model"].is_string() ? x["model"].get<std::string>() : std::string("another program")) +
                         ", not " + program + ": it holds another model");
  for (const auto& [k, v] : identity.items())
    if (x.contains(k) && x[k] != v) {
      std::string flag = "--" + k;  // the field's flag: max_seq is --max-seq
      for (char& c : flag) c = c == '_' ? '-' : c;
      throw tessera::error("checkpoint '" + path + "' holds a model with " + flag + " " + x[k].dump() + "; this run has " +
                           flag + " " + v.dump() + ": resume with " + flag + " " + x[k].dump() + " (its tensors would "
                           "load, into another network)");
    }
  return next;
}

//! A new run's lineage (checkpoint::save_options::lineage): 16 hex digits
//! from the clock, the pid and the host, unlike any other run's in practice.
inline std::string new_lineage() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::uint64_t h = tessera::splitmix64(std::uint64_t(std::chrono::system_clock::now().time_since_epoch().count()));
  h = tessera::splitmix64(h ^ std::uint64_t(::getpid()));
  for (const char* c = host; *c; ++c) h = tessera::splitmix64(h ^ std::uint64_t(static_cast<unsigned char>(*c)));
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

//! Refuses (on every rank, collective) a --save root that holds a complete
//! checkpoint of another lineage than `lineage` (rank 0's; "" on a run
//! resumed from a checkpoint written before lineages, which is not checked):
//! its steps would mix with this run's, a later --load would resume the
//! wrong one, and --keep would count them.
template <class Comm>
void check_save_root(Comm& world, const std::string& root, const std::string& lineage) {
  std::exception_ptr err;
  if (world.rank() == 0 && !lineage.empty()) try {
      for (const auto& [step, dir] : tessera::checkpoint::complete_checkpoints(root)) {
        const auto other = tessera::checkpoint::lineage_of(dir);
        if (other == lineage) continue;
        throw tessera::error("--save " + root + " holds " + dir.filename().string() + " of another run (" +
                             (!other ? std::string("its index unreadable")
                              : other->empty() ? std::string("written before runs had lineages")
                                               : "lineage " + *other) +
                             "): resume that run with --load " + root + ", or save this one into a new directory");
      }
    } catch (...) {
      err = std::current_exception();
    }
  tessera::comm::agree_or_throw(world, err, "checking --save");
}

}  // namespace trainer_kit
