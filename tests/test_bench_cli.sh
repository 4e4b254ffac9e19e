#!/usr/bin/env bash
# The bench executables' command lines: --help prints usage (exit 0), a bad argument is one
# message (exit 2), a config that cannot be read names the file (exit 2); never an abort.
# Usage: test_bench_cli.sh MEMSIM_BENCH MEMSIM_KV_BENCH MEMSIM_PROGRAM_DUMP MEMSIM_COW_BENCH
# (MEMSIM_SOURCE_ROOT: the source tree). Exits 0 when every check passes, 1 otherwise.
set -u

if [ $# -ne 4 ]; then
  echo "usage: $0 MEMSIM_BENCH MEMSIM_KV_BENCH MEMSIM_PROGRAM_DUMP MEMSIM_COW_BENCH" >&2
  exit 1
fi
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
BENCH=$(abs "$1")
KV_BENCH=$(abs "$2")
DUMP=$(abs "$3")
COW_BENCH=$(abs "$4")
ROOT=${MEMSIM_SOURCE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/memsim_test_bench_cli.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
failures=0
checks=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run NAME EXE ARGS...: runs EXE in the empty folder $TMP/run (no configs there) without
# MEMSIM_ROOT; output to $TMP/NAME.out/.err, exit status to $rc.
mkdir -p "$TMP/run"
run() {
  local name=$1
  shift
  (cd "$TMP/run" && env -u MEMSIM_ROOT timeout 60 "$@") >"$TMP/$name.out" 2>"$TMP/$name.err"
  rc=$?
}

# expect NAME RC FILE TEXT: the last run exited RC and FILE (out or err) holds TEXT.
expect() {
  checks=$((checks + 1))
  if [ "$rc" -ne "$2" ]; then
    fail "$1: exit code $rc, expected $2"
    sed 's/^/    | /' "$TMP/$1.err" >&2
  elif ! grep -qF -- "$4" "$TMP/$1.$3"; then
    fail "$1: '$4' not in its std$3"
    sed 's/^/    | /' "$TMP/$1.$3" >&2
  fi
}

for exe in "$BENCH" "$KV_BENCH" "$DUMP" "$COW_BENCH"; do
  name=$(basename "$exe")
  run "$name-help" "$exe" --help
  expect "$name-help" 0 out "usage: $name"
done

run kv-count "$KV_BENCH" lots
expect kv-count 2 err "memsim-kv-bench: COUNT must be a whole number in [1, 18446744073709551615], got 'lots'"
run kv-zero "$KV_BENCH" 0
expect kv-zero 2 err "COUNT must be a whole number"
run kv-rate "$KV_BENCH" 10 -5
expect kv-rate 2 err "RATE must be a number > 0, got '-5'"
run kv-root env MEMSIM_ROOT="$TMP/nowhere" "$KV_BENCH" 10
expect kv-root 2 err "memsim-kv-bench: config error: $TMP/nowhere/configs/models/llama-3.1-8b.yaml"
# Outside the repository without MEMSIM_ROOT: the configs of the binary's own source tree.
if [ -f "$(dirname "$KV_BENCH")/../../configs/gpus/h200.yaml" ]; then
  run kv-tree "$KV_BENCH" 20 50
  expect kv-tree 0 out "memsim-kv-bench: 20 requests"
fi

run bench-arg "$BENCH" extra
expect bench-arg 2 err "memsim-bench: takes no arguments"

run dump-none "$DUMP"
expect dump-none 2 err "memsim-program-dump: expects MODEL.yaml BATCH [full|piecewise]"
run dump-batch "$DUMP" "$ROOT/configs/models/llama-3.1-8b.yaml" many
expect dump-batch 2 err "BATCH must be a whole number in [1, 1048576], got 'many'"
run dump-mode "$DUMP" "$ROOT/configs/models/llama-3.1-8b.yaml" 1 partial
expect dump-mode 2 err "mode must be full or piecewise, got 'partial'"
run dump-model "$DUMP" "$TMP/none.yaml" 1
expect dump-model 2 err "memsim-program-dump: config error: $TMP/none.yaml"
run dump-ok "$DUMP" "$ROOT/configs/models/llama-3.1-8b.yaml" 1
expect dump-ok 0 out '"batch":1'

run cow-args "$COW_BENCH" h200 qwen3-8b extra
expect cow-args 2 err "memsim-cow-bench: at most two arguments: GPU and MODEL"
run cow-gpu env MEMSIM_ROOT="$ROOT" "$COW_BENCH" nogpu
expect cow-gpu 2 err "memsim-cow-bench: config error: $ROOT/configs/gpus/nogpu.yaml"
# Qwen3-8B, block 16: 36 layers x K and V x 16 tokens x 1,024 values x 2 bytes copied.
run cow-ok env MEMSIM_ROOT="$ROOT" "$COW_BENCH" h200 qwen3-8b
expect cow-ok 0 out "        16            32 KiB       2304 KiB"

echo "test_bench_cli: $((checks - failures)) of $checks checks passed"
[ "$failures" -eq 0 ]
