#!/usr/bin/env bash
# End-to-end test of --process-per-run: serving runs each in a process of its own (this command
# again with --serving-run), their outcomes handed back as JSON, give the same outputs as the runs
# in one process; the option's refusals.
# Usage: test_run_processes.sh /path/to/memsim   (MEMSIM_SOURCE_ROOT: the source tree)
# Exits 0 when every check passes, 1 otherwise (each failure is printed).
set -u

if [ $# -lt 1 ]; then
  echo "usage: $0 /path/to/memsim" >&2
  exit 1
fi
MEMSIM=$1
case $MEMSIM in /*) ;; *) MEMSIM=$PWD/$MEMSIM ;; esac
ROOT=${MEMSIM_SOURCE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}

CLI_TEST_NAME=test_run_processes
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh"

# --process-per-run on: each serving run in a process of its own, which hands its outcome back as
# JSON; every output but the wall times is the same as the runs' in one process (a preemption run
# with samples, and data-parallel replicas, cover every kind of field).
mkdir -p "$TMP/runs_tmp"
export TMPDIR=$TMP/runs_tmp  # where the launcher keeps the runs' outcomes
for exp in kv_preemption dp_serving; do
  run "ppr_off_$exp" --config "$ROOT/experiments/$exp.yaml" --out "$TMP/ppr_off" --no-plots \
    --process-per-run off
  expect_rc "ppr_off_$exp" 0
  run "ppr_on_$exp" --config "$ROOT/experiments/$exp.yaml" --out "$TMP/ppr_on" --no-plots \
    --process-per-run on
  expect_rc "ppr_on_$exp" 0
  for f in "$TMP/ppr_off/$exp/"*; do
    case $f in */timing.json) continue ;; esac
    check "--process-per-run on: $exp/$(basename "$f") as in one process" \
      cmp -s "$f" "$TMP/ppr_on/$exp/$(basename "$f")"
  done
  expect_in "$TMP/ppr_on_$exp.out" "each run in a process of its own" \
    "--process-per-run on: the runs ran in processes of their own"
  check "--process-per-run on: $exp printed the same table" \
    cmp -s <(grep -v "wall\|^wrote" "$TMP/ppr_off_$exp.out") <(grep -v "wall\|^wrote" "$TMP/ppr_on_$exp.out")
done
check "--process-per-run on: the outcomes' folder removed" test -z "$(ls -A "$TMP/runs_tmp")"
run ppr_shapes --config "$ROOT/experiments/shapes.yaml" --process-per-run on --out "$TMP/out_ppr_shapes"
expect_rc ppr_shapes 2
expect_in "$TMP/ppr_shapes.err" "only serving experiments run in processes of their own" \
  "--process-per-run on refused for a shapes experiment"
run ppr_bad --config "$ROOT/experiments/kv_preemption.yaml" --process-per-run always
expect_rc ppr_bad 2
expect_in "$TMP/ppr_bad.err" "--process-per-run: always not in {auto,on,off}" \
  "--process-per-run takes auto, on or off"
# A run's process started by hand: its launcher must be its parent, its inputs the launcher's.
# child NAME ARGS...: memsim with ARGS and --serving-launcher set to its parent's pid.
child() {
  local name=$1
  shift
  (cd "$TMP" && bash -c 'exec "$@" --serving-launcher $PPID' child "$MEMSIM" "$@") \
    >"$TMP/$name.out" 2>"$TMP/$name.err"
  rc=$?
}
child ppr_child --config "$ROOT/experiments/kv_preemption.yaml" --serving-run 99 \
  --serving-result "$TMP/x.json" --serving-digest 0 --out "$TMP/out_ppr_child"
expect_rc ppr_child 2
expect_in "$TMP/ppr_child.err" "--serving-run 99 names no run of the config's" \
  "a run process for no run"
expect_absent "$TMP/out_ppr_child" "a run process writes no results folder"
child ppr_digest --config "$ROOT/experiments/kv_preemption.yaml" --serving-run 0 \
  --serving-result "$TMP/x.json" --serving-digest 0123456789abcdef --out "$TMP/out_ppr_child"
expect_rc ppr_digest 2
expect_in "$TMP/ppr_digest.err" "changed since the launcher read it" \
  "a run process whose inputs are not the launcher's runs nothing"
expect_absent "$TMP/x.json" "a run process whose inputs changed writes no outcome"
run ppr_orphan --config "$ROOT/experiments/kv_preemption.yaml" --serving-run 0 \
  --serving-result "$TMP/x.json" --serving-launcher 1 --serving-digest 0
expect_rc ppr_orphan 1
expect_in "$TMP/ppr_orphan.err" "the launcher is not this process's parent" \
  "a run process whose launcher is gone runs nothing"

echo "test_run_processes: $checks checks passed, $failures failed"
[ "$failures" -eq 0 ]
