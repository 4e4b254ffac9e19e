#!/usr/bin/env bash
# Runs memsim's GPU tests and GPU validations under compute-sanitizer memcheck, racecheck and
# synccheck, plus the graph-memory-node memcheck reproducer (docs/sanitizers.md), and prints one
# summary line per run.
#   tools/sanitize.sh BIN_DIR [OUT_DIR]     (on the GPU machine, from the repository root)
# BIN_DIR holds memsim, test_cuda_backend, test_saver_cuda and test_attention_kernels from a CUDA
# build; the reproducer is built there with nvcc when missing. Exit 1 when any run failed.
set -u
bin=${1:?usage: tools/sanitize.sh BIN_DIR [OUT_DIR]}
out=${2:-${OUT:-/tmp/memsim-sanitize}}
mkdir -p "$out"
export MEMSIM_SOURCE_ROOT=$PWD MEMSIM_ROOT=$PWD MEMSIM_SANITIZER=1
CS=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
status=0
"$CS" --version | tail -1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# run NAME LIMIT EXPECT CMD...: EXPECT is the exit status that counts as a pass.
run() {
  local name=$1 limit=$2 expect=$3
  shift 3
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  pkill -9 -f "$bin/memsim" 2>/dev/null  # nothing left holding GPU memory after a timeout
  [ "$rc" -ne "$expect" ] && status=1
  echo "$name: exit $rc (want $expect) after $((SECONDS - t0)) s;" \
    "$(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|All tests passed|test cases:' \
      "$out/$name.log" | sed 's/^=* *//' | tr '\n' ' ')"
}

# The reproducer: memcheck reports the false positive (exit 1) on the minimal program, not when
# the second allocation is freed in the graph; the program itself runs clean without the tool.
[ -x "$bin/repro_gmn" ] || "$NVCC" -O2 -arch=sm_90 -o "$bin/repro_gmn" \
  tools/repro/graph_mem_nodes_memcheck.cu || status=1
run repro.plain 60 0 "$bin/repro_gmn" minimal 3072 2048
run repro.memcheck 60 1 "$CS" --tool memcheck --error-exitcode 1 "$bin/repro_gmn" minimal 3072 2048
run repro.memcheck-freed 60 0 "$CS" --tool memcheck --error-exitcode 1 "$bin/repro_gmn" \
  minimal 3072 2048 --free-second

# The GPU tests under each tool ([graph-mem-reuse] only outside memcheck: the false positive).
for t in test_cuda_backend test_saver_cuda test_attention_kernels; do
  filter=()
  [ $t = test_cuda_backend ] && filter=('~[graph-mem-reuse]')
  run $t.memcheck 300 0 "$CS" --tool memcheck --leak-check full --error-exitcode 1 \
    "$bin/$t" "${filter[@]}"
  run $t.racecheck 300 0 "$CS" --tool racecheck --error-exitcode 1 "$bin/$t"
  run $t.synccheck 300 0 "$CS" --tool synccheck --error-exitcode 1 "$bin/$t"
done

# The validations, trimmed: the graph-memory strategies on real captures (graph_mem_nodes left
# out under memcheck) and the KV strategies serving a short trace with the attention kernels.
# The GPU file of this machine's GPU (memsim refuses --backend cuda with another GPU's file).
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE 'h[0-9]00' |
  tr 'A-Z' 'a-z')
shapes=(--config experiments/shapes.yaml --backend cuda --no-plots --set max_num_seqs=16
  --set "gpu=${gpu:-h200}"
  --set 'sweep.outputs=[strong, weak]' --set 'sweep.arrival=[fixed]')
no_gmn='strategies=[{impl: private_pools}, {impl: shared_pool, order: arrival}, {impl: shared_pool, order: large_first}, {impl: global_pool, order: large_first}, {impl: vmm_alias, handle_bytes: 2MiB}, {impl: vmm_alias, label: vmm_alias/fast, order: large_first, handles: per_extension}]'
kv=(--config experiments/kv_strategies.yaml --backend cuda --no-plots --set requests.trace.limit=20
  --set "gpu=${gpu:-h200}")
run shapes.memcheck 300 0 "$CS" --tool memcheck --leak-check full --error-exitcode 1 \
  "$bin/memsim" "${shapes[@]}" --set "$no_gmn" --out "$out/runs"
run shapes.racecheck 300 0 "$CS" --tool racecheck --error-exitcode 1 "$bin/memsim" \
  "${shapes[@]}" --set validation_rounds=3 --out "$out/runs"
run shapes.synccheck 300 0 "$CS" --tool synccheck --error-exitcode 1 "$bin/memsim" \
  "${shapes[@]}" --out "$out/runs"
run kv.memcheck 300 0 "$CS" --tool memcheck --leak-check full --error-exitcode 1 \
  "$bin/memsim" "${kv[@]}" --out "$out/runs"
run kv.synccheck 300 0 "$CS" --tool synccheck --error-exitcode 1 "$bin/memsim" "${kv[@]}" \
  --out "$out/runs"
exit $status
