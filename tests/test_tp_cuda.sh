#!/usr/bin/env bash
# Tensor parallelism on real GPUs: tp_memory --backend cuda with one memsim process per rank
# (NCCL loaded at run time), Qwen2.5-32B at TP 2 on two GPUs of the kind its GPU file names:
# per rank, NCCL's and the custom all-reduce's memory within 2% of the model and the graph
# strategies' bytes identical to the simulation. Exits 77 (skipped) without 2 GPUs of a known kind.
# Usage: test_tp_cuda.sh /path/to/memsim   (MEMSIM_SOURCE_ROOT: the source tree)
set -u
MEMSIM=$1
ROOT=${MEMSIM_SOURCE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
command -v nvidia-smi >/dev/null 2>&1 || { echo "no nvidia-smi: skipped"; exit 77; }
NAMES=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)
COUNT=$(printf '%s\n' "$NAMES" | grep -c .)
[ "$COUNT" -ge 2 ] || { echo "fewer than 2 GPUs: skipped"; exit 77; }
case "$NAMES" in *H200*) GPU=h200 ;; *H100*) GPU=h100 ;; *) echo "no H100/H200: skipped"; exit 77 ;; esac
TMP=$(mktemp -d "${TMPDIR:-/tmp}/memsim_tp_cuda.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
failures=0
for cumem in false true; do
  "$MEMSIM" --config "$ROOT/experiments/tp_memory.yaml" --backend cuda --out "$TMP/$cumem" \
    --set models=[qwen2.5-32b] --set gpus=[$GPU] --set 'tensor_parallel_sizes=[2]' \
    --set 'graph_memory=[none, vmm_alias]' --set parallel.nccl_cumem=$cumem \
    > "$TMP/$cumem.out" 2>&1
  rc=$?
  rows=$(grep -cE "^qwen2.5-32b +2 (none|vmm_alias) +[01] .* ok$" "$TMP/$cumem.out")
  if [ "$rc" -ne 0 ] || [ "$rows" -ne 4 ]; then
    echo "FAIL: nccl_cumem=$cumem: exit $rc, $rows of 4 rank rows ok" >&2
    sed 's/^/    | /' "$TMP/$cumem.out" >&2
    failures=$((failures + 1))
  fi
  test -s "$TMP/$cumem/tp_memory/tp_validation.csv" || {
    echo "FAIL: nccl_cumem=$cumem: no tp_validation.csv" >&2
    failures=$((failures + 1))
  }
done
echo "test_tp_cuda: $failures failed"
[ "$failures" -eq 0 ]
