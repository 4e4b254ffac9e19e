#!/usr/bin/env bash
# The tensor-parallel model step on real GPUs: memsim-model-bench --tensor-parallel 2 (one process
# per rank, NCCL). First the custom all-reduce itself (--all-reduce-check: bit for bit against
# the host's sums, eager and replayed from a graph after its inputs changed, both kernels' sizes).
# Then Qwen2.5-32B's shape with 2 layers: a captured decode step (the custom all-reduces, their
# inputs registered with the peer, and the logits' NCCL all-gather inside the graph; and again
# with NCCL all-reduces) gives the eager step's tokens on every rank, and each rank's logits of a
# ragged run match PyTorch's fp32 model of the unsharded weights (tools/model_check.py).
# Exits 77 (skipped) without 2 GPUs or without PyTorch.
# Usage: test_tp_step_cuda.sh /path/to/memsim-model-bench /path/to/libmemsim_kernels.so
set -u
BENCH=$1
KERNELS=$2
ROOT=${MEMSIM_SOURCE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
command -v nvidia-smi >/dev/null 2>&1 || { echo "no nvidia-smi: skipped"; exit 77; }
COUNT=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -c .)
[ "$COUNT" -ge 2 ] || { echo "fewer than 2 GPUs: skipped"; exit 77; }
python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null ||
  { echo "no PyTorch with CUDA: skipped"; exit 77; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/memsim_tp_step.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
export MEMSIM_ROOT=$ROOT
failures=0
fail() { echo "FAIL: $1" >&2; sed 's/^/    | /' "$2" >&2; failures=$((failures + 1)); }
"$BENCH" --tensor-parallel 2 --all-reduce-check > "$TMP/arc.out" 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -q "^all-reduce check: passed" "$TMP/arc.out" ||
  fail "custom all-reduce check: exit $rc" "$TMP/arc.out"
for ar in custom nccl; do
  "$BENCH" --model qwen2.5-32b --layers 2 --tensor-parallel 2 --all-reduce $ar --graph-check \
    --pool-gib 2 > "$TMP/graph_$ar.out" 2>&1
  rc=$?
  same=$(grep -c "next tokens identical" "$TMP/graph_$ar.out")
  [ "$rc" -eq 0 ] && [ "$same" -eq 4 ] ||
    fail "graph check ($ar all-reduce): exit $rc, $same of 4 replays identical" "$TMP/graph_$ar.out"
done
"$BENCH" --model qwen2.5-32b --layers 2 --tensor-parallel 2 --check "$TMP/check" --pool-gib 2 \
  > "$TMP/check.out" 2>&1 || fail "check run" "$TMP/check.out"
for r in 0 1; do
  python3 "$ROOT/tools/model_check.py" "$KERNELS" "$TMP/check/rank$r" > "$TMP/ref$r.out" 2>&1 ||
    fail "rank $r against PyTorch" "$TMP/ref$r.out"
  tail -n 1 "$TMP/ref$r.out"
done
echo "test_tp_step_cuda: $failures failed"
[ "$failures" -eq 0 ]
