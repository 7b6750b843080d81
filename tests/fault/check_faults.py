#!/usr/bin/env python3
"""Never hang: faults injected into a running multi-rank job end it within
the timeout, with the collective named, trace files written, and
tessera-doctor naming the cause; a rank that returns from main while the
others train on is named by them at once.

usage: check_faults.py MPIEXEC TRAINER DOCTOR DIVERGENT [NP]
"""
import json
import os
import subprocess
import sys
import tempfile
import time

mpiexec = sys.argv[1]
trainer, doctor, divergent = (os.path.abspath(p) for p in sys.argv[2:5])
np_ = sys.argv[5] if len(sys.argv) > 5 else "3"
MPI = [mpiexec, "--oversubscribe", "-np", np_]
# TESSERA_FAULT_ARGS: the trainer's model and backend (gpu-check runs the CUDA trainer over NCCL).
MODEL = os.environ.get("TESSERA_FAULT_ARGS", "--layers 2 --d 32 --ctx 4 --tokens 510").split()
SMALL = MODEL + ["--steps", "1000000", "--log-every", "100000", "--timeout", "10"]
failures = []


def run(name, cmd, env_extra, limit):
    d = tempfile.mkdtemp(prefix="tessera-fault-" + name + "-")
    env = dict(os.environ, TESSERA_TRACE_DIR=d, **env_extra)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit + 60)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, e.stdout or "", e.stderr or ""
        if isinstance(out, bytes):
            out, err = out.decode(errors="replace"), (err or b"").decode(errors="replace")
    dt = time.time() - t0
    print(f"--- {name}: exit {rc} after {dt:.1f} s", flush=True)
    for line in (err or "").splitlines():
        if "tessera" in line:
            print("   ", line[:400])
    return rc, out or "", err or "", dt, d


def doctor_says(d):
    p = subprocess.run([doctor, d, "--json"], capture_output=True, text=True)
    print("    doctor:", p.stdout.strip()[:600], p.stderr.strip()[:200])
    try:
        return p.returncode, json.loads(p.stdout)
    except json.JSONDecodeError:
        return p.returncode, {}


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("    FAIL:", what)


def traces(d):
    return sorted(f for f in os.listdir(d) if f.startswith("tessera-trace-rank"))


# 1. A rank stopped (SIGSTOP) inside training: the others' watchdog ends the job.
rc, out, err, dt, d = run("stop", MPI + [trainer] + SMALL, {"TESSERA_TEST_FAULT": "stop:1:3"}, 30)
expect(rc not in (0, None), "stop: the job must end non-zero")
expect(dt < 30, f"stop: ended after {dt:.1f} s, want < 30")
expect("did not complete within 10 s" in err, "stop: the watchdog message names the timeout")
expect("tessera: watchdog:" in err, "stop: a tessera: watchdog line")
expect(any(t != "tessera-trace-rank1.json" for t in traces(d)), "stop: the other ranks wrote trace files")
code, v = doctor_says(d)
expect(code == 3 and v.get("verdict") == "stopped_rank" and v.get("culprits") == [1],
       "stop: the doctor names rank 1 as the stopped rank")

# 1b. The same, stopped from another thread 30 ms into the step: wherever it
# stopped (most often inside a wait, where its trace looks like a waiting
# rank's), its heartbeat's gap names it: never "network", never another rank.
for attempt in range(3):
    rc, out, err, dt, d = run("stopwait", MPI + [trainer] + SMALL, {"TESSERA_TEST_FAULT": "stopwait:1:3"}, 30)
    code, v = doctor_says(d)
    expect(rc not in (0, None) and dt < 30, "stopwait: the job must end non-zero within 30 s")
    expect(code == 3 and v.get("verdict") == "stopped_rank" and v.get("culprits") == [1],
           f"stopwait (try {attempt + 1}): the doctor names rank 1 as the stopped rank")

# 2. A rank killed (SIGKILL): the job ends within the timeout.
# Open MPI gives the survivors 1 s between SIGTERM and SIGKILL (odls_base_sigkill_timeout); on a loaded
# 2-core CI machine a survivor sometimes missed it and wrote no trace, so the doctor saw two silent ranks.
rc, out, err, dt, d = run("kill", MPI + [trainer] + SMALL,
                          {"TESSERA_TEST_FAULT": "kill:1:3", "OMPI_MCA_odls_base_sigkill_timeout": "5"}, 30)
expect(rc not in (0, None), "kill: the job must end non-zero")
expect(dt < 30, f"kill: ended after {dt:.1f} s, want < 30")
# The launcher ends the others with SIGTERM: each says so and writes its trace,
# and the doctor names the rank that wrote none as the one that died.
expect("ended by SIGTERM" in err, "kill: the others say the launcher ended them")
code, v = doctor_says(d)
expect(code == 3 and v.get("verdict") == "died" and v.get("culprits") == [1], "kill: the doctor names rank 1 as dead")

# 3. An error on one rank only: every rank ends within seconds, with its message.
rc, out, err, dt, d = run("error", MPI + [trainer] + SMALL[:-1] + ["60"], {"TESSERA_TEST_FAULT": "error:1:3"}, 20)
expect(rc not in (0, None), "error: the job must end non-zero")
expect(dt < 20, f"error: ended after {dt:.1f} s, want < 20 (well before the 60 s timeout)")
expect("TESSERA_TEST_FAULT: an error on rank 1 only" in err and "[rank 1 of" in err,
       "error: the failing rank's tessera: line, with its rank")
expect("tessera-trace-rank1.json" in traces(d), "error: the failing rank wrote its trace")
code, v = doctor_says(d)
expect(code == 5 and v.get("verdict") == "error" and v.get("culprits") == [1]
       and "TESSERA_TEST_FAULT: an error on rank 1 only" in v.get("summary", ""),
       "error: the doctor reports rank 1's recorded error as the cause")

# 4. Options given to one rank only: one tessera: error before training.
rc, out, err, dt, d = run("options", [mpiexec, "--oversubscribe", "-np", "1", trainer] + SMALL + ["--steps", "2", ":",
                          "--oversubscribe", "-np", str(int(np_) - 1), trainer] + SMALL + ["--steps", "2", "--lr", "0.01"],
                          {}, 20)
expect(rc not in (0, None) and dt < 20, "options: the job must end non-zero, quickly")
expect("--lr=0.01" in err and "rank 0 with --lr=0.003" in err, "options: names the differing option on both sides")

# 5. Divergent program, with the order check: one clear error on every rank.
rc, out, err, dt, d = run("divergent-checked", MPI + [divergent, "on"], {"TESSERA_TIMEOUT_S": "10"}, 20)
expect(rc == 0, "divergent with the order check: every rank names both units (exit 0)")
expect(out.count("collective order differs") == int(np_), "divergent: the error on every rank")

# 6. Divergent program without the order check: MPI reduces mismatched
# buffers without a word (Open MPI, shared memory); the trace files written
# at exit show the doctor the first divergent call.
rc, out, err, dt, d = run("divergent-unchecked", MPI + [divergent, "off"],
                          {"TESSERA_TIMEOUT_S": "10", "TESSERA_TRACE_AT_EXIT": "1"}, 30)
expect(rc is not None and dt < 30, "divergent without the check: the job ends within 30 s")
code, v = doctor_says(d)
expect(code == 2 and v.get("verdict") == "divergent", "divergent: the doctor reports a divergent program")

# 7. A rank that catches its own error and returns from main (no mpi_main), the others training on:
# its communicator's end check makes their next collective fail at once, naming it (not the watchdog's 60 s).
rc, out, err, dt, d = run("leave", MPI + [divergent, "leave"], {"TESSERA_TIMEOUT_S": "60"}, 30)
expect(rc == 0 and dt < 20, f"leave: every rank ends within seconds, the others naming rank 1 (exit {rc}, {dt:.1f} s)")
expect(out.count("rank 1 issued end") >= int(np_) - 1, "leave: the others' error names rank 1 leaving")

# A rank stopped before MPI starts: the others' MPI_Init is under the start-up
# deadline, so the job ends with a tessera: line instead of hanging silently.
rc, out, err, dt, d = run("startup", MPI + [divergent, "startup"], {"TESSERA_TIMEOUT_S": "5"}, 30)
expect(rc not in (0, None) and dt < 30, f"startup: the job ends (exit {rc}, {dt:.1f} s, want < 30)")
expect("MPI start-up (MPI_Init) did not finish within 5 s" in err, "startup: a tessera: line names the start-up deadline")

if failures:
    print(f"{len(failures)} check(s) failed:", *failures, sep="\n  ")
    sys.exit(1)
print("all fault checks passed")
