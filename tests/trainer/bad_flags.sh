#!/usr/bin/env bash
# Every bad flag or value makes tessera-mlp-lm exit non-zero with one line that
# starts with "tessera:", before it starts MPI; a --dump-weights path that
# cannot take the file, before the first step.
trainer=$1
fail=0
check() {
  local out rc
  out=$("$trainer" "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -eq 0 ] || [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] || [[ "$out" != tessera:* ]]; then
    echo "FAIL: $* -> exit $rc, stderr: $out"; fail=1
  else
    echo "ok: $* -> $out"
  fi
}
check --strategy zero4
check --wrapper ddp --strategy optim_grads_params
check --wrapper fsdp2 --strategy optim
check --wrapper fsdp3
check --d 30 --ctx 8
check --tokens 100 --accum 3
check --precision fp8
check --layers -1
check --lr 0
check --no-such-flag
check --steps many
check --steps 0
check --steps -3
check --shard-group 0
check --shard-group two
check --outer optim
check --timeout nan
check --cuda-graphs maybe
check --cuda-graphs on  # the host backend has none
check --deterministic
check --micro-tokens 64
check --deterministic --micro-tokens 7
check --deterministic --micro-tokens 64 --accum 2
check --shard-group 2 --outer optim --wrapper ddp --strategy optim_grads
check --shard-group 2 --outer replicate
check --plan manual
check --plan auto --strategy optim
check --plan auto --shard-group 2
check --topology t.json
check --gpu-memory 80
check --plan auto --gpu-memory -1
# --dump-weights is written after the run: a path that cannot take the file is
# refused before the first step (after MPI starts, so the job ends through it).
out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$trainer" --steps 3 --dump-weights / 2>&1); rc=$?
if [ "$rc" -eq 0 ] || [[ "$out" != *"tessera: --dump-weights / is a directory"* ]] || [[ "$out" == *"step "* ]]; then
  echo "FAIL: --dump-weights / -> exit $rc, output: $out"; fail=1
else
  echo "ok: --dump-weights / -> refused before the first step"
fi
exit $fail
