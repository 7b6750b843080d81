#pragma once
//! \file Where the flight recorder's files go, and the JSON string escaping
//! they are written with (comm/trace.hpp).
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include <unistd.h>

namespace tessera::comm::trace {

//! $TMPDIR (or /tmp)/tessera-traces-<uid>-<job>: not the working
//! directory, which an error must not litter. <job> is the launcher's job
//! id (Slurm, PMIx, Open MPI), so the ranks of one job on one node share
//! the folder; without a launcher, the parent's pid. A job over several
//! nodes sets TESSERA_TRACE_DIR to a shared folder for tessera-doctor.
[[nodiscard]] inline std::filesystem::path default_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string job;
  for (const char* k : {"SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "PMI_JOBID"})
    if (const char* v = std::getenv(k); v && *v) {
      job = v;
      break;
    }
  if (job.empty()) job = "pid" + std::to_string(::getppid());
  for (auto& c : job)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
         ("tessera-traces-" + std::to_string(::getuid()) + "-" + job.substr(0, 64));
}

//! Appends s as a JSON string (ASCII only: a label or host name never needs more).
inline void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += char(c);
    else if (c < 0x20 || c >= 0x7f) {  // ASCII only: a label never needs more
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else out += char(c);
  }
  out += '"';
}

}  // namespace tessera::comm::trace
