#!/usr/bin/env bash
# The reliability guarantees, one check (or a few) per finding of the hostile-user review
# (shared/reviews/reliability-2026-11-26.md, F-numbers below): no shell, checked and atomic
# outputs, locks, sweeps keyed by their resolved config, no aborts, no quiet traps.
# Usage: test_reliability.sh /path/to/memsim   (MEMSIM_SOURCE_ROOT: the source tree)
set -u

MEMSIM=$1
case $MEMSIM in /*) ;; *) MEMSIM=$PWD/$MEMSIM ;; esac
ROOT=${MEMSIM_SOURCE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
export MEMSIM_ROOT=$ROOT
CLI_TEST_NAME=test_reliability
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh"

SERVING=$ROOT/experiments/sweep_grid.yaml
SMALL=(--config "$SERVING" --set requests.count=20 --no-plots)

# No file or folder left under DIR that looks like results or like a run's leftovers.
expect_empty_dir() {
  if [ -z "$(ls -A "$1" 2>/dev/null)" ]; then pass; else fail "$2: $1 holds $(ls -A "$1")"; fi
}
# The process did not abort (no SIGABRT, SIGSEGV: exit codes 134, 139).
expect_no_abort() {
  if [ "$rc" -lt 128 ]; then pass; else fail "$1: killed by a signal (exit $rc)"; show "$TMP/$1.err"; fi
}

# --- F22: no shell: a quote in the experiment name or the --out path runs nothing -------------
run inj_name "${SMALL[@]}" --set "experiment=x'; touch $TMP/INJECTED; echo '" --out "$TMP/o_inj"
expect_rc inj_name 2
expect_absent "$TMP/INJECTED" "F22: experiment name with a quote runs no command"
mkdir -p "$TMP/q'; touch $TMP/INJECTED2; echo 'b"
run inj_out --config "$SERVING" --set requests.count=20 --out "$TMP/q'; touch $TMP/INJECTED2; echo 'b"
expect_rc inj_out 0
expect_absent "$TMP/INJECTED2" "F22: an --out path with a quote runs no command (plots on)"
check "F22: the quoted --out holds the results" test -s "$TMP/q'; touch $TMP/INJECTED2; echo 'b/sweep_grid/summary.json"
# Plot scripts come from this installation, not from beside the config.
mkdir -p "$TMP/evil/experiments" "$TMP/evil/tools"
printf 'import pathlib, sys\npathlib.Path(sys.argv[1], "..", "..", "EVIL_PLOT").touch()\n' \
  > "$TMP/evil/tools/plot_kv.py"
sed -e '/^grid:/,$d' -e "s#^gpu: .*#gpu: $ROOT/configs/gpus/h200.yaml#" \
  -e "s#^model: .*#model: $ROOT/configs/models/llama-3.1-8b.yaml#" "$SERVING" \
  > "$TMP/evil/experiments/exp.yaml"
(cd "$TMP/evil" && exec env -u MEMSIM_ROOT "$MEMSIM" --config "$TMP/evil/experiments/exp.yaml" \
  --set requests.count=20 --out "$TMP/o_evil") > "$TMP/evil_plot.out" 2> "$TMP/evil_plot.err"
rc=$?
expect_rc evil_plot 0
expect_absent "$TMP/EVIL_PLOT" "F22: a tools/ folder beside a config is not run"

# --- F17: experiment: is a plain file name ------------------------------------------------------
for bad in "$TMP/abs_escaped" ".." ".hidden" "a/b"; do
  run esc "${SMALL[@]}" --set "experiment=$bad" --out "$TMP/o_esc"
  expect_rc esc 2
  expect_in "$TMP/esc.err" "(--set experiment)" "F17: experiment=$bad is a located config error"
done
expect_absent "$TMP/abs_escaped" "F17: nothing written outside --out"
expect_absent "$TMP/o_esc" "F17: nothing written at all"

# --- F2, F3: a write that fails (a file size limit: EFBIG, as a full disk gives ENOSPC) ----------
# Exit 1 naming the full path and the OS's reason; no results folder, no leftovers.
(cd "$TMP" && trap '' XFSZ && ulimit -f 200 &&
  exec "$MEMSIM" --config "$ROOT/experiments/shapes.yaml" --out "$TMP/o_full" --no-plots) \
  > "$TMP/full.out" 2> "$TMP/full.err"
rc=$?
expect_rc full 1
expect_re "$TMP/full.err" "cannot write $TMP/o_full/shapes/[a-z]+\.(csv|json): File too large" \
  "F2/F3: the failed write names the file and the reason"
expect_empty_dir "$TMP/o_full" "F2/F3: a failed write leaves no results and no staging folder"
if [ -w /dev/full ]; then
  # A whole file to a device that is always full: the error comes at the final flush (F2).
  run devfull --no-plots replay "$ROOT/tests/data/snapshots/steps_gc.pickle" --no-min-capacity \
    --export /dev/full --out "$TMP/o_devfull"
  expect_rc devfull 1
  expect_in "$TMP/devfull.err" "No space left on device" "F2: ENOSPC at the final flush is reported"
fi
# Previous results stay whole when a rerun fails to write.
run prev "${SMALL[@]}" --out "$TMP/o_prev"
expect_rc prev 0
cp "$TMP/o_prev/sweep_grid/summary.json" "$TMP/prev_summary.json"
(cd "$TMP" && trap '' XFSZ && ulimit -f 8 &&
  exec "$MEMSIM" --config "$SERVING" --set requests.count=400 --out "$TMP/o_prev" --no-plots) \
  > /dev/null 2> "$TMP/prev2.err"
rc=$?
expect_rc prev2 1
check "F3: the previous results are untouched by a failed rerun" \
  cmp -s "$TMP/o_prev/sweep_grid/summary.json" "$TMP/prev_summary.json"

# --- F5: the output folder is checked before the simulation runs --------------------------------
echo hi > "$TMP/afile"
run outfile "${SMALL[@]}" --out "$TMP/afile"
expect_rc outfile 1
check "F5: nothing simulated when --out cannot be written" test ! -s "$TMP/outfile.out"

# --- F6: a second run into a folder being written is refused -------------------------------------
mkdir -p "$TMP/o_lock"
exec 9> "$TMP/o_lock/.sweep_grid.lock"
flock -n 9
run locked "${SMALL[@]}" --out "$TMP/o_lock"
exec 9>&-
expect_rc locked 1
expect_in "$TMP/locked.err" "is being written by another memsim run" "F6: the lock refuses"
expect_absent "$TMP/o_lock/sweep_grid" "F6: the refused run wrote nothing"
run unlocked "${SMALL[@]}" --out "$TMP/o_lock"
expect_rc unlocked 0
expect_absent "$TMP/o_lock/.sweep_grid.lock" "F6: the lock file goes when the run ends"

# --- F12: a run killed mid-way leaves nothing that looks complete --------------------------------
(cd "$TMP" && exec "$MEMSIM" --config "$SERVING" --set requests.count=200000 --out "$TMP/o_kill" \
  --no-plots) > /dev/null 2>&1 &
victim=$!
for _ in $(seq 50); do [ -n "$(ls -A "$TMP/o_kill" 2>/dev/null)" ] && break; sleep 0.1; done
kill -9 "$victim" 2>/dev/null
wait "$victim" 2>/dev/null
expect_absent "$TMP/o_kill/sweep_grid" "F12: a killed run leaves no results folder"
run after_kill "${SMALL[@]}" --out "$TMP/o_kill"
expect_rc after_kill 0
check "F12: the next run removes the killed run's staging folder" \
  test -z "$(ls -A "$TMP/o_kill" | grep -v '^sweep_grid$')"

# --- F18: labels with quotes, commas and newlines stay one CSV cell -------------------------------
sed '/^grid:/,$d' "$SERVING" | sed '/^runs:/,$d' > "$TMP/labels.yaml"
cat >> "$TMP/labels.yaml" <<'EOF'
runs:
  - {label: 'has "quotes", and commas'}
  - {label: "two\nlines"}
  - {label: plain}
EOF
run labels --config "$TMP/labels.yaml" --set requests.count=20 --out "$TMP/o_lab" --no-plots
expect_rc labels 0
for f in curves timeseries; do
  check "F18: $f.csv rows all have the header's width" python3 - "$TMP/o_lab/sweep_grid/$f.csv" <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], newline="")))
sys.exit(0 if len({len(r) for r in rows}) == 1 and len(rows) > 1 else 1)
EOF
done

# --- F7, F21, F24: sweeps are keyed by their resolved config ---------------------------------------
sed '/^grid:/,$d' "$SERVING" > "$TMP/g.yaml"
sw() {  # sw NAME ARGS...: a sweep of $TMP/g.yaml into $TMP/o_sw
  local name=$1
  shift
  run "$name" sweep --config "$TMP/g.yaml" --out "$TMP/o_sw" -j 2 --no-progress \
    --set requests.count=20 "$@"
}
SWDIR=$TMP/o_sw/sweep_grid-sweep
sw sw1 --sweep kv.block_size=8,16
expect_rc sw1 0
# F21: every point runs from its own resolved config, not from the YAML re-read.
expect_re "$SWDIR/points/p00000/sweep_grid/summary.json" "\"source\": \".*points/p00000/config.yaml\"" \
  "F21: a point runs from its resolved config"
sed -i 's/count: 300/count: 7/' "$TMP/g.yaml"  # edited after the sweep: no effect on its points
check "F21: the point's config holds the values it ran" grep -q "count: 20" \
  "$SWDIR/points/p00000/config.yaml"
sed -i 's/count: 7/count: 300/' "$TMP/g.yaml"
# F7a: another grid into the same folder re-runs the points whose config changed.
sw sw2 --sweep kv.block_size=64,16
expect_rc sw2 0
expect_in "$TMP/sw2.out" "1 of 2 points already complete" "F7: the unchanged point is reused"
expect_in "$TMP/sw2.out" "1 points run again: 1 config changed" "F7: the changed point re-runs"
check "F7: sweep.csv's swept value is what the point ran" python3 - "$SWDIR/sweep.csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
ok = len(rows) == 2 and all(r["kv.block_size"] in r["label"] for r in rows)
sys.exit(0 if ok else 1)
EOF
sw sw3 --sweep kv.block_size=64,16 --set requests.count=21
expect_in "$TMP/sw3.out" "2 points run again: 2 config changed" "F7: a changed --set re-runs every point"
# F24: a done point whose outputs are gone or empty is run again.
rm -rf "$SWDIR/points/p00001/sweep_grid"
: > "$SWDIR/points/p00000/sweep_grid/summary.json"
sw sw4 --sweep kv.block_size=64,16 --set requests.count=21
expect_rc sw4 0
expect_in "$TMP/sw4.out" "2 points run again: 1 outputs missing, 1 summary.json does not parse" \
  "F24: missing or empty outputs are not done"
expect_in "$TMP/sw4.out" "(2 of 2 points complete)" "F24: sweep.csv is complete again"
# F7b: a sweep of another grid is refused while one runs, before it writes anything.
cp "$SWDIR/grid.json" "$TMP/grid_before.json"
exec 9> "$SWDIR/.sweep.lock"
flock -s -n 9
sw sw5 --sweep kv.block_size=32,128
exec 9>&-
expect_rc sw5 1
expect_in "$TMP/sw5.err" "another sweep with a different grid or config is running" \
  "F7b: a second grid is refused"
check "F7b: the refused sweep left grid.json alone" cmp -s "$SWDIR/grid.json" "$TMP/grid_before.json"
# F4: points that cannot write (a file size limit, as on a full disk) fail with the reason, the
# sweep exits 1 and says sweep.csv is short; their status says failed.
(cd "$TMP" && trap '' XFSZ && ulimit -f 1 && exec "$MEMSIM" sweep --config "$TMP/g.yaml" \
  --out "$TMP/o_fullsw" -j 2 --no-progress --set requests.count=20 --sweep kv.block_size=8,16) \
  > "$TMP/fullsw.out" 2> "$TMP/fullsw.err"
rc=$?
expect_rc fullsw 1
expect_in "$TMP/fullsw.err" "File too large" "F4: a point's failed write gives its reason"
expect_in "$TMP/fullsw.err" "sweep.csv lacks 2 of 2 points" "F4: a short sweep.csv is said"
check "F4: a failed point's status says failed" \
  grep -q "^failed 1 " "$TMP/o_fullsw/sweep_grid-sweep/points/p00000/status"
# F25: a closed stdout does not kill the sweep.
rm -rf "$TMP/o_pipe"
(cd "$TMP" && "$MEMSIM" sweep --config "$TMP/g.yaml" --out "$TMP/o_pipe" -j 1 \
  --set requests.count=20 --sweep kv.block_size=8,16,32,64 2> "$TMP/pipe.err" | head -1 > /dev/null
  echo "${PIPESTATUS[0]}" > "$TMP/pipe.rc")
check "F25: the sweep finished (exit 0) after its reader went away" test "$(cat "$TMP/pipe.rc")" = 0
check "F25: ... and wrote its sweep.csv" test -s "$TMP/o_pipe/sweep_grid-sweep/sweep.csv"
expect_in "$TMP/pipe.err" "standard output was closed" "F25: the sweep says stdout went away"
# F19: merge of a grid.json of the wrong shape is an error, not an abort.
mkdir -p "$TMP/o_merge"
echo '{"points": 5, "axes": 3}' > "$TMP/o_merge/grid.json"
run merge_bad merge "$TMP/o_merge"
expect_rc merge_bad 1
expect_in "$TMP/merge_bad.err" "grid.json" "F19: merge names the bad grid.json"
# F20: flags that were silently accepted.
sw shard_bad --sweep kv.block_size=8,16 --shard 1/2/3
expect_rc shard_bad 2
expect_in "$TMP/shard_bad.err" "--shard 1/2/3: expected K/N" "F20: --shard with trailing junk"
sw submit_bad --sweep kv.block_size=8,16 --submit
expect_rc submit_bad 2
expect_in "$TMP/submit_bad.err" "--submit" "F20: --submit without --slurm"
# F27: a sweep that cannot create its files reports it; it does not abort.
(cd "$TMP" && ulimit -n 4 && exec "$MEMSIM" sweep --config "$TMP/g.yaml" --out "$TMP/o_nofile" \
  -j 2 --no-progress --set requests.count=20 --sweep kv.block_size=8,16) \
  > "$TMP/nofile.out" 2> "$TMP/nofile.err"
rc=$?
expect_no_abort nofile
expect_rc nofile 1
expect_in "$TMP/nofile.err" "Too many open files" "F27: the sweep names the OS's reason"

# --- F11, F20: no aborts on host memory or special files -----------------------------------------
(cd "$TMP" && ulimit -v 400000 && exec "$MEMSIM" --config "$SERVING" \
  --set requests.count=50000000 --out "$TMP/o_mem" --no-plots) > "$TMP/mem.out" 2> "$TMP/mem.err"
rc=$?
expect_no_abort mem
expect_rc mem 1
expect_in "$TMP/mem.err" "of host memory" "F11: out of host memory is a message"
(cd "$TMP" && ulimit -v 1000000 && exec "$MEMSIM" replay /dev/zero --no-min-capacity \
  --out "$TMP/o_dz") > "$TMP/devzero.out" 2> "$TMP/devzero.err"
rc=$?
expect_no_abort devzero
expect_rc devzero 2
expect_in "$TMP/devzero.err" "/dev/zero is not a regular file (a character device)" \
  "F20: a special file is refused by its type"

# --- F13: a long run shows its progress on a terminal, and only there ----------------------------
if command -v script > /dev/null; then
  LONG=(--config "$SERVING" --set requests.count=600000 --out "$TMP/o_progress" --no-plots)
  (cd "$TMP" && script -q -e -c "$(printf '%q ' "$MEMSIM" "${LONG[@]}")" /dev/null) \
    > "$TMP/progress_tty.out" 2>&1
  expect_re "$TMP/progress_tty.out" "run 1/1 .*: [0-9,]+ of 600,000 requests finished, simulated .*ETA" \
    "F13: a long run on a terminal shows its progress"
  run progress_pipe "${LONG[@]}"
  check "F13: no progress line without a terminal" test ! -s "$TMP/progress_pipe.err"
fi

# --- F16: quiet traps in GPU files ----------------------------------------------------------------
python3 - "$ROOT/configs/gpus/h200.yaml" "$TMP/h200_nomap.yaml" <<'EOF'
import sys
lines = [l for l in open(sys.argv[1]) if not l.lstrip().startswith(("map:", "unmap:"))]
open(sys.argv[2], "w").writelines(lines)
EOF
run nocost "${SMALL[@]}" --set "gpu=$TMP/h200_nomap.yaml" --out "$TMP/o_nocost"
expect_rc nocost 2
expect_in "$TMP/nocost.err" "no cost for 2 of the 23 primitives: map, unmap" \
  "F16a: a GPU file without some costs names them"
mkdir -p "$TMP/gpucopy"
cp "$ROOT/configs/gpus/h200.yaml" "$TMP/gpucopy/h200.yaml"
run gpucopy "${SMALL[@]}" --set "gpu=$TMP/gpucopy/h200.yaml" --out "$TMP/o_gpucopy"
expect_rc gpucopy 0
expect_in "$TMP/gpucopy.out" "found by the GPU's name h200" \
  "F16b: a copied GPU file keeps its profile, and says why"
run default_gpu "${SMALL[@]}" --out "$TMP/o_default_gpu"
check "F16b: the copy's figures equal the original's" \
  cmp -s "$TMP/o_gpucopy/sweep_grid/curves.csv" "$TMP/o_default_gpu/sweep_grid/curves.csv"

# --- F23: calibrate in place never destroys the GPU file -----------------------------------------
{ echo "strategy,primitive,handles,bytes,nodes,mappings,measured_us"
  for _ in $(seq 40); do echo "vmm_alias,begin_capture,1,2097152,3,0,1e300"; done; } > "$TMP/huge.csv"
cp "$ROOT/configs/gpus/h200.yaml" "$TMP/inplace.yaml"
run inplace calibrate --in-context "$TMP/huge.csv" --gpu "$TMP/inplace.yaml" --out "$TMP/inplace.yaml"
expect_rc inplace 1
expect_in "$TMP/inplace.err" "what was there is unchanged" "F23: the refusal says the file is kept"
check "F23: the GPU file is unchanged" cmp -s "$TMP/inplace.yaml" "$ROOT/configs/gpus/h200.yaml"

# --- F26: --seed as typed --------------------------------------------------------------------------
for s in -1 18446744073709551616 0x10; do
  run seed "${SMALL[@]}" --seed "$s" --out "$TMP/o_seed"
  expect_rc seed 2
  expect_in "$TMP/seed.err" "--seed: must be a whole number in [0, 9223372036854775807], got '$s'" \
    "F26: --seed $s names what was typed"
done

echo "test_reliability: $checks checks passed, $failures failed"
[ "$failures" -eq 0 ]
