// tessera-doctor DIR: reads the trace files a stopped job left
// (tessera-trace-rank*.json, comm/trace.hpp) and says in one paragraph what
// happened. Exit code by verdict:
//   0 nothing in flight (no fault visible), 1 unreadable input,
//   2 divergent program (ranks issued different collectives as #k),
//   3 stopped, slow or dead rank (a rank's heartbeat stopped while others waited,
//     or some ranks never issued #k, or issued it and never waited for it
//     while waiting nowhere else, while others wait in it),
//   4 network (every rank issued #k and waited in it, none completed it),
//   5 a rank ended with an error of its own (recorded before the first
//     timeout): the cause, whoever waited for it.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct call {
  std::string op, label, dtype, state;
  std::uint64_t count = 0;
  std::int64_t issued_us = 0, waiting_us = 0, completed_us = 0;
  [[nodiscard]] std::string show(std::uint64_t seq) const {
    std::string s = op + " #" + std::to_string(seq) + " (" + std::to_string(count) + " x " + dtype;
    if (!label.empty()) s += ", " + label;
    return s + ")";
  }
  [[nodiscard]] bool same_call(const call& o) const {
    return op == o.op && count == o.count && dtype == o.dtype && label == o.label;
  }
};

struct rank_trace {
  int rank = -1, world = 0;
  std::string reason, message, host;
  std::int64_t time_us = 0;
  std::map<int, std::uint64_t> next_seq;                       // communicator -> collectives issued
  std::map<int, std::string> kind;                             // communicator -> "mpi", "nccl"
  std::map<int, std::map<std::uint64_t, call>> calls;          // communicator -> seq -> call
  std::vector<std::pair<std::int64_t, std::int64_t>> stalls;   // heartbeat gaps: the process did not run
};

std::string ranks_text(const std::vector<int>& r) {
  std::string s = r.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < r.size(); ++i) s += (i ? (i + 1 == r.size() ? " and " : ", ") : "") + std::to_string(r[i]);
  return s;
}

std::optional<rank_trace> read_trace(const fs::path& p, std::string& why) {
  std::ifstream f(p);
  json j;
  try {
    j = json::parse(f);
    rank_trace t;
    if (j.value("format", "") != "tessera-trace") return why = "not a tessera trace", std::nullopt;
    t.rank = j.at("rank").get<int>();
    t.world = j.at("world").get<int>();
    t.reason = j.value("reason", "");
    t.message = j.value("message", "");
    t.host = j.value("host", "");
    t.time_us = j.value("time_us", std::int64_t(0));
    for (const auto& c : j.at("comms")) {
      t.next_seq[c.at("id").get<int>()] = c.at("next_seq").get<std::uint64_t>();
      t.kind[c.at("id").get<int>()] = c.value("kind", "");
    }
    if (j.contains("stalls"))  // traces of older versions have none
      for (const auto& g : j.at("stalls"))
        t.stalls.emplace_back(g.at("from_us").get<std::int64_t>(), g.at("to_us").get<std::int64_t>());
    for (const auto& e : j.at("entries")) {
      call c{e.at("op").get<std::string>(), e.value("label", ""), e.value("dtype", ""), e.value("state", ""),
             e.value("count", std::uint64_t(0)), e.value("issued_us", std::int64_t(0)),
             e.value("waiting_us", std::int64_t(0)), e.value("completed_us", std::int64_t(0))};
      t.calls[e.at("comm").get<int>()][e.at("seq").get<std::uint64_t>()] = c;
    }
    return t;
  } catch (const std::exception& e) {
    why = e.what();
    return std::nullopt;
  }
}

struct verdict {
  int code = 0;
  std::string kind = "healthy", text;
  int comm = -1;
  long long seq = -1;
  std::vector<int> culprits, waiting;
};

bool ended_with_error(const rank_trace& t) { return t.reason == "error" || t.reason == "terminate"; }

// Rank r's own recorded error as the cause; `after` follows its message (what the others did).
verdict error_verdict(verdict v, int r, const rank_trace& t, const std::string& after) {
  v.code = 5;
  v.kind = "error";
  v.culprits = {r};
  v.text = "Rank " + std::to_string(r) + " ended with an error: " + t.message + after;
  return v;
}

// The longest time rank t's process did not run (its watchdog's heartbeat
// stopped) within [from, to]: a stop of 2 s or more in the time others
// waited marks a stopped rank, wherever it stopped (inside a wait too).
std::int64_t stalled_us(const rank_trace& t, std::int64_t from, std::int64_t to) {
  std::int64_t most = 0;
  for (const auto& [a, b] : t.stalls)
    if (b > from && a < to) most = std::max(most, std::min(b, to) - std::max(a, from));
  return most;
}

// Ranks ended by SIGTERM (the launcher's way of ending a job when a rank dies).
std::vector<int> ended_by_sigterm(const std::map<int, rank_trace>& traces) {
  std::vector<int> out;
  for (const auto& [r, t] : traces)
    if (t.reason == "signal" && t.message == "SIGTERM") out.push_back(r);
  return out;
}

// The silent ranks died: no trace of their own, while the launcher ended the
// others; `where` says what those others were doing.
verdict died_verdict(verdict v, const std::vector<int>& silent, const std::vector<int>& ended, const std::string& where) {
  v.code = 3;
  v.kind = "died";
  v.culprits = silent;
  std::string who = ranks_text(silent);
  who[0] = char(std::toupper(static_cast<unsigned char>(who[0])));
  v.text = who + " died (killed, or crashed) without writing a trace, and the launcher then ended " + ranks_text(ended) +
           " with SIGTERM" + where + ". Look at that rank first: the launcher's message names the signal that ended "
           "it (9: SIGKILL, the OOM killer among others; 11: a crash), then its last log lines and dmesg.";
  return v;
}

verdict diagnose(const std::map<int, rank_trace>& traces, int world) {
  verdict v;
  std::vector<int> missing;
  for (int r = 0; r < world; ++r)
    if (!traces.contains(r)) missing.push_back(r);
  std::set<int> comms;
  for (const auto& [r, t] : traces)
    for (const auto& [c, n] : t.next_seq) comms.insert(c);

  // 1. Divergence: the lowest sequence number ranks recorded differently.
  for (int c : comms) {
    std::set<std::uint64_t> seqs;
    for (const auto& [r, t] : traces)
      if (auto it = t.calls.find(c); it != t.calls.end())
        for (const auto& [s, x] : it->second) seqs.insert(s);
    for (std::uint64_t s : seqs) {
      std::map<std::string, std::vector<int>> by;
      for (const auto& [r, t] : traces)
        if (auto it = t.calls.find(c); it != t.calls.end())
          if (auto x = it->second.find(s); x != it->second.end()) by[x->second.show(s)].push_back(r);
      if (by.size() < 2) continue;
      // A rank whose communicator ended there ("end", comm::mpi's end check) left the job: its own
      // recorded error is the cause where it has one, else it returned or exited early.
      std::vector<int> left;
      std::string others;
      for (const auto& [what, rs] : by) {
        if (what.rfind("end #", 0) == 0) left.insert(left.end(), rs.begin(), rs.end());
        else others += (others.empty() ? "" : "; ") + ranks_text(rs) + " issued " + what;
      }
      if (!left.empty()) {
        v.comm = c;
        v.seq = (long long)s;
        v.culprits = left;
        for (int r : left)
          if (ended_with_error(traces.at(r)))
            return error_verdict(v, r, traces.at(r), ". It left the job (its communicator ended) while " + others +
                                                         " on communicator " + std::to_string(c) + ".");
        v.code = 3;
        v.kind = "stopped_rank";
        v.text = "A rank left early: " + ranks_text(left) + " ended its communicator " + std::to_string(c) +
                 " (returned, threw or exited) as its collective #" + std::to_string(s) + ", while " + others +
                 ". Look at how that rank's program ended (its last log lines).";
        return v;
      }
      v.code = 2;
      v.kind = "divergent";
      v.comm = c;
      v.seq = (long long)s;
      v.text = "Divergent program: on communicator " + std::to_string(c) + " the ranks issued different collectives as #" +
               std::to_string(s) + ": ";
      bool first = true;
      for (const auto& [what, rs] : by) {
        v.text += (first ? "" : "; ") + ranks_text(rs) + " issued " + what;
        first = false;
        if (v.culprits.empty() || rs.size() < v.waiting.size()) v.culprits = rs;
        if (rs.size() > v.waiting.size()) v.waiting = rs;
      }
      v.text += ". Every rank must issue the same collectives in the same order; the first difference is where the "
                "program took another path (a unit reduced out of order, a micro-batch or a get_param on some ranks only).";
      return v;
    }
  }

  // 2. A collective some ranks wait in: who never issued it? Judged as of the
  // first timeout (the earliest trace written for one): what a stopped rank
  // did after the launcher woke it to end the job (continue, complete the
  // collective, answer SIGUSR1) happened after the fault and does not count.
  std::int64_t cut = std::numeric_limits<std::int64_t>::max();
  for (const auto& [r, t] : traces)
    if (t.reason == "timeout") cut = std::min(cut, t.time_us);
  auto issued_by_cut = [&](const call& x) { return x.issued_us <= cut; };
  // A wait that began after the cut began when a stopped rank was woken to
  // end the job: not a wait by then.
  auto waited_by_cut = [&](const call& x) { return x.waiting_us != 0 && x.waiting_us <= cut; };
  auto pending_at_cut = [&](const call& x) {
    return issued_by_cut(x) && (x.state == "issued" || x.completed_us == 0 || x.completed_us > cut);
  };
  for (int c : comms) {
    long long k = -1;
    for (const auto& [r, t] : traces)
      if (auto it = t.calls.find(c); it != t.calls.end())
        for (const auto& [s, x] : it->second)
          if (pending_at_cut(x) && (k < 0 || (long long)s < k)) k = (long long)s;
    if (k < 0) continue;
    std::vector<int> absent = missing, waiting, done;
    const call* what = nullptr;
    std::int64_t since = 0;
    for (const auto& [r, t] : traces) {
      const auto n = t.next_seq.contains(c) ? t.next_seq.at(c) : 0;
      const auto it = t.calls.find(c);
      const bool in_ring = it != t.calls.end() && it->second.contains(std::uint64_t(k));
      if (n <= std::uint64_t(k) || (in_ring && !issued_by_cut(it->second.at(std::uint64_t(k))))) {
        absent.push_back(r);
        continue;
      }
      if (!in_ring) continue;  // fell out of the ring: issued long before
      const auto x = it->second.find(std::uint64_t(k));
      what = &x->second;
      if (pending_at_cut(x->second)) {
        waiting.push_back(r);
        const std::int64_t t0 = waited_by_cut(x->second) ? x->second.waiting_us : x->second.issued_us;
        since = since ? std::min(since, t0) : t0;
      } else {
        done.push_back(r);
      }
    }
    std::sort(absent.begin(), absent.end());
    // Ranks that issued #k and never began to wait for it (a non-blocking
    // collective issued, then the rank stopped or went on working outside
    // the library): not the network's fault.
    // A rank waiting in another collective pending at the cut (a later one,
    // or one on another communicator) is waiting, not stopped.
    auto waits_elsewhere = [&](const rank_trace& t) {
      for (const auto& [cc, m] : t.calls)
        for (const auto& [s, x] : m)
          if (waited_by_cut(x) && pending_at_cut(x) && !(cc == c && (long long)s == k)) return true;
      return false;
    };
    std::vector<int> never_waited;
    for (int r : waiting)
      if (!waited_by_cut(traces.at(r).calls.at(c).at(std::uint64_t(k))) && !waits_elsewhere(traces.at(r)))
        never_waited.push_back(r);
    if (never_waited.size() < waiting.size())
      for (int r : never_waited) absent.push_back(r), std::erase(waiting, r);
    v.comm = c;
    v.seq = k;
    v.waiting = waiting;
    const std::string name = what ? what->show(std::uint64_t(k)) : "collective #" + std::to_string(k);
    std::int64_t stop_us = 0;
    for (const auto& [r, t] : traces) stop_us = std::max(stop_us, t.time_us);
    if (cut != std::numeric_limits<std::int64_t>::max()) stop_us = cut;
    char secs[64] = "";
    if (since && stop_us > since) std::snprintf(secs, sizeof secs, " for %.1f s", double(stop_us - since) / 1e6);
    // A rank that recorded an error of its own (before the first timeout) is the cause.
    for (const auto& [r, t] : traces)
      if (ended_with_error(t) && t.time_us <= cut)
        return error_verdict(v, r, t,
                             "." + (waiting.empty() ? std::string()
                                                    : " " + ranks_text(waiting) + (waiting.size() == 1 ? " was" : " were") +
                                                          " waiting in " + name + " on communicator " + std::to_string(c) +
                                                          secs + " when the job ended."));
    // A rank whose process did not run (its heartbeat stopped) for 2 s or
    // more while the others waited is the stopped one, wherever it stopped:
    // inside a wait its trace looks like any waiting rank's.
    if (since) {
      std::vector<int> stalled;
      std::int64_t longest = 0;
      for (const auto& [r, t] : traces)
        if (const std::int64_t g = stalled_us(t, since, stop_us); g >= 2'000'000) {
          stalled.push_back(r);
          longest = std::max(longest, g);
        }
      if (!stalled.empty() && stalled.size() < traces.size()) {
        std::vector<int> others;
        for (const auto& [r, t] : traces)
          if (std::find(stalled.begin(), stalled.end(), r) == stalled.end()) others.push_back(r);
        char g[64];
        std::snprintf(g, sizeof g, "%.1f s", double(longest) / 1e6);
        v.code = 3;
        v.kind = "stopped_rank";
        v.culprits = stalled;
        v.waiting = others;
        v.text = "Stopped rank: " + ranks_text(stalled) + (stalled.size() == 1 ? " was" : " were") +
                 " not running for " + g + " (its heartbeat stopped: SIGSTOP, a debugger, a suspended or overloaded "
                 "host) while " + ranks_text(others) + " waited" + (waiting.empty() ? "" : " in " + name) +
                 " on communicator " + std::to_string(c) + secs + ". Look at that rank's process first.";
        return v;
      }
    }
    if (!absent.empty()) {
      v.code = 3;
      v.kind = "stopped_rank";
      v.culprits = absent;
      std::vector<int> silent_issuers = never_waited, never_issued;
      for (int r : absent)
        if (std::find(never_waited.begin(), never_waited.end(), r) == never_waited.end()) never_issued.push_back(r);
      v.text = "Stopped or slow rank: " +
               (never_issued.empty() ? std::string() : ranks_text(never_issued) + " never issued " + name) +
               (never_issued.empty() || silent_issuers.empty() ? "" : "; ") +
               (silent_issuers.empty() ? std::string()
                                       : ranks_text(silent_issuers) + " issued " + name + " but never waited for it") +
               " on communicator " + std::to_string(c) + ", while " + ranks_text(waiting) + " waited in it" + secs + ".";
      std::vector<int> silent;
      for (int r : absent)
        if (!traces.contains(r)) silent.push_back(r);
      if (const auto ended = ended_by_sigterm(traces); !silent.empty() && !ended.empty() && cut == std::numeric_limits<std::int64_t>::max())
        return died_verdict(v, silent, ended, ", while " + ranks_text(waiting) + " waited in " + name + " on communicator " +
                                                  std::to_string(c) + secs);
      if (!silent.empty())
        v.text += " " + ranks_text(silent) + " wrote no trace: stopped (SIGSTOP), killed, or stuck outside the library "
                  "where it could not answer; look at that rank first (its last log lines, dmesg, a debugger).";
      else
        v.text += " It had not reached that collective when the others gave up: stopped, or working outside the "
                  "library (a slow or stuck computation, I/O, a different code path).";
      return v;
    }
    v.code = 4;
    v.kind = "network";
    v.culprits = {};
    v.text = "Network or transport: every rank issued " + name + " on communicator " + std::to_string(c) + " and " +
             (done.empty() ? std::string("none") : ranks_text(done) + " only") + " completed it" + secs +
             ". Suspect the interconnect (link down, NCCL transport, a GPU hung in a kernel), not the program.";
    return v;
  }

  // 3. An error on some rank, with nothing in flight; or a rank that died.
  for (const auto& [r, t] : traces)
    if (ended_with_error(t)) return error_verdict(v, r, t, "");
  if (const auto ended = ended_by_sigterm(traces); !missing.empty() && !ended.empty())
    return died_verdict(v, missing, ended, " (none of them was in a collective)");
  v.text = "No collective in flight: every collective the ranks recorded completed";
  if (!missing.empty()) v.text += " (" + ranks_text(missing) + " wrote no trace)";
  v.text += ".";
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera-doctor: what a stopped Tessera job was doing, from its trace files"};
  std::string dir;
  bool as_json = false;
  app.add_option("dir", dir, "directory holding tessera-trace-rank*.json (TESSERA_TRACE_DIR of the job)")->required();
  app.add_flag("--json", as_json, "print the verdict as one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::map<int, rank_trace> traces;
  int world = 0;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    std::fprintf(stderr, "tessera: '%s' is not a directory\n", dir.c_str());
    return 1;
  }
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const std::string n = f.path().filename().string();
    if (!n.starts_with("tessera-trace-rank") || !n.ends_with(".json")) continue;
    std::string why;
    auto t = read_trace(f.path(), why);
    if (!t) {
      std::fprintf(stderr, "tessera: skipping '%s': %s\n", f.path().c_str(), why.c_str());
      continue;
    }
    world = std::max(world, t->world);
    traces[t->rank] = std::move(*t);
  }
  if (traces.empty()) {
    std::fprintf(stderr, "tessera: no readable tessera-trace-rank*.json in '%s'\n", dir.c_str());
    return 1;
  }
  const verdict v = diagnose(traces, world);
  std::vector<int> have;
  for (const auto& [r, t] : traces) have.push_back(r);
  if (as_json) {
    json j{{"verdict", v.kind}, {"exit_code", v.code}, {"summary", v.text}, {"world", world}, {"traces", have},
           {"culprits", v.culprits}, {"waiting", v.waiting}};
    if (v.comm >= 0) j["communicator"] = v.comm;
    if (v.seq >= 0) j["sequence"] = v.seq;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("tessera-doctor: %zu trace file%s of %d rank%s. %s\n", traces.size(), traces.size() == 1 ? "" : "s",
                world, world == 1 ? "" : "s", v.text.c_str());
  }
  return v.code;
}
