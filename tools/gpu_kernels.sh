#!/usr/bin/env bash
# The kernel validation and benchmark on the GPU machine, in one go: the C++ kernel tests
# (float64 reference), the PyTorch correctness matrix, memsim-attn-bench, and compute-sanitizer
# memcheck / racecheck / synccheck over the kernel tests (fp8 and sliding-window cases included)
# and over the matrix's fp8 and window cases through the C API.
#   tools/gpu_kernels.sh BIN_DIR [OUT_DIR]      (on the GPU machine, from the repository root)
# BIN_DIR holds test_attention_kernels, test_attention_fp8, test_block_kernels,
# libmemsim_kernels.so and memsim-attn-bench from a portable CUDA build (steps whose binary is
# missing fail). Logs go to OUT_DIR (default $OUT or /tmp/memsim-gpu), one per run, with
# summary.txt. Environment: STEPS picks steps (default "kernels matrix bench memcheck racecheck
# synccheck"); MATRIX_ARGS go to attention_check.py; PARALLEL=1 starts every run at once (the
# sanitizers are CPU-bound, so on a 16-core machine they overlap well; timings from the bench
# are then not to be reported); CAP (seconds) caps every run's time limit. Exit 1 when any run
# failed or timed out.
set -u
bin=${1:?usage: tools/gpu_kernels.sh BIN_DIR [OUT_DIR]}
out=${2:-${OUT:-/tmp/memsim-gpu}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
steps=" ${STEPS:-kernels matrix bench memcheck racecheck synccheck} "
CS=${COMPUTE_SANITIZER:-compute-sanitizer}
here=$(dirname "$0")  # attention_check.py beside this script
want() { [[ $steps == *" $1 "* ]]; }
# run NAME LIMIT CMD...: CMD under a time limit, logged to NAME.log; passes when its exit status
# is $EXPECT (default 0; a negative control expects the sanitizer's 9). NAME.fail marks a failure.
run() {
  local name=$1 limit=$2 expect=${EXPECT:-0}
  [ -n "${CAP:-}" ] && [ "$CAP" -lt "$limit" ] && limit=$CAP
  shift 2
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$? verdict=pass
  [ "$rc" -ne "$expect" ] && verdict=FAIL && touch "$out/$name.fail"
  local keys='ERROR SUMMARY|RACECHECK SUMMARY|test cases:|All tests passed|attention_check:'
  keys+='|no CUDA|^worst (bf16|fp16)|^planted'
  echo "[$verdict] $name: exit $rc (want $expect) after $((SECONDS - t0)) s; $(grep -hE "$keys" \
    "$out/$name.log" | sed 's/^=* *//' | tr '\n' ' ')" | tee -a "$out/summary.txt"
}
launch() {  # launch NAME LIMIT CMD...: run, in the background when PARALLEL=1
  if [ "${PARALLEL:-0}" = 1 ]; then run "$@" & else run "$@"; fi
}
# The matrix's sanitizer cases: fp8, window and split through the C API. PyTorch's caching
# allocator off, so every tensor is an allocation of its own and an access past one is reported;
# only memsim's kernels are instrumented where the tool can filter (PyTorch's are not under test).
filter=()
"$CS" --help 2>&1 | grep -q -- '--kernel-name' && filter=(--kernel-name kns=memsim)
capi_small=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$CS" --error-exitcode 9 "${filter[@]}")
small=(python3 "$here/attention_check.py" "$bin/libmemsim_kernels.so" --cases small)

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
: >"$out/summary.txt"
rm -f "$out"/*.fail
if want kernels; then
  for t in test_attention_kernels test_attention_fp8 test_block_kernels; do
    launch "$t" 200 "$bin/$t"
  done
  # fp8 decode with TMA off: the cp.async path at the block sizes TMA takes otherwise.
  launch test_attention_fp8-no-tma 200 env MEMSIM_DECODE_TMA=0 "$bin/test_attention_fp8" \
    "fp8 decode*"
fi
want matrix && launch matrix 300 python3 "$here/attention_check.py" "$bin/libmemsim_kernels.so" \
  ${MATRIX_ARGS:-}
want bench && launch bench 200 "$bin/memsim-attn-bench" --csv "$out/attn_bench.csv"
if want memcheck; then
  for t in test_attention_kernels test_attention_fp8 test_block_kernels; do
    launch "memcheck-$t" 280 "$CS" --tool memcheck --error-exitcode 9 "$bin/$t"
  done
  launch memcheck-capi 200 "${capi_small[@]}" --tool memcheck "${small[@]}"
  # The negative control: a decode that reads one block past its pool must be reported (so the
  # kernel filter and the allocator setting above do let memcheck see memsim's accesses).
  EXPECT=9 launch memcheck-capi-control 120 "${capi_small[@]}" --tool memcheck \
    python3 "$here/attention_check.py" "$bin/libmemsim_kernels.so" --cases planted
fi
if want racecheck; then
  # racecheck is the slowest tool: the shared-memory kernels' fp8 and window cases, one run per
  # Catch2 test (PARALLEL spreads them over the cores), the copy kernels use no shared memory.
  launch racecheck-window-decode 280 "$CS" --tool racecheck --error-exitcode 9 \
    "$bin/test_attention_kernels" "sliding-window decode*"
  launch racecheck-window-prefill 280 "$CS" --tool racecheck --error-exitcode 9 \
    "$bin/test_attention_kernels" "sliding-window prefill*"
  for spec in "fp8 decode matches*" "fp8 decode over long*" "fp8 decode by TMA*" "fp8 prefill*" \
    "fp8 sliding-window*" "fp8 paged_kv_write*"; do
    name=$(echo "$spec" | tr -c 'a-z0-9\n' '-' | sed 's/-*$//')
    launch "racecheck-$name" 280 "$CS" --tool racecheck --error-exitcode 9 \
      "$bin/test_attention_fp8" "$spec"
  done
  launch racecheck-capi 200 "${capi_small[@]}" --tool racecheck "${small[@]}"
fi
if want synccheck; then
  for t in test_attention_kernels test_attention_fp8; do
    launch "synccheck-$t" 280 "$CS" --tool synccheck --error-exitcode 9 "$bin/$t"
  done
fi
wait
grep -E "^FAIL|^worst|attention_check:" "$out/matrix.log" 2>/dev/null | tail -40
echo "gpu_kernels: $(grep -c '^\[pass\]' "$out/summary.txt") runs passed," \
  "$(grep -c '^\[FAIL\]' "$out/summary.txt") failed"
ls "$out"/*.fail >/dev/null 2>&1 && exit 1
exit 0
