#!/usr/bin/env bash
# The kernel validation and benchmark on the GPU machine, in one go: the C++ kernel tests
# (float64 reference), the PyTorch correctness matrix, memsim-attn-bench, and the C++ tests under
# compute-sanitizer memcheck and racecheck. Usage: tools/gpu_kernels.sh BIN_DIR [OUT_DIR]
# (BIN_DIR holds test_attention_kernels, test_attention_fp8, libmemsim_kernels.so and
# memsim-attn-bench from a
# portable CUDA build; logs go to OUT_DIR, default $OUT or /tmp/memsim-gpu). STEPS picks steps
# (default "kernels matrix bench memcheck racecheck synccheck").
set -u
bin=${1:?usage: tools/gpu_kernels.sh BIN_DIR [OUT_DIR]}
out=${2:-${OUT:-/tmp/memsim-gpu}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0
steps=" ${STEPS:-kernels matrix bench memcheck racecheck synccheck} "
want() { [[ $steps == *" $1 "* ]]; }
step() {  # step NAME TIMEOUT CMD...: runs CMD with a time limit, logs it, keeps going
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - t0)) s"
  [ $rc -ne 0 ] && status=1
  return 0
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if want kernels; then
  step kernels 150 "$bin/test_attention_kernels"
  grep -B3 -A12 "FAILED" "$out/kernels.log" | head -60
  tail -3 "$out/kernels.log"
  step kernels-fp8 150 "$bin/test_attention_fp8"
  grep -B3 -A12 "FAILED" "$out/kernels-fp8.log" | head -60
  tail -5 "$out/kernels-fp8.log"
fi
if want matrix; then
  step matrix 300 python3 tools/attention_check.py "$bin/libmemsim_kernels.so" ${MATRIX_ARGS:-}
  grep -E "^FAIL|attention_check:|Error|error" "$out/matrix.log" | tail -25
fi
if want bench; then
  step bench 200 "$bin/memsim-attn-bench" --csv "$out/attn_bench.csv"
  cat "$out/bench.log"
fi
for tool in memcheck racecheck synccheck; do
  want $tool || continue
  for t in test_attention_kernels test_attention_fp8; do
    step "sanitizer-$tool-$t" 280 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$bin/$t" ${SANITIZER_FILTER:-}
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|Barrier|test cases|All tests" \
      "$out/sanitizer-$tool-$t.log" | head -12
  done
done
exit $status
