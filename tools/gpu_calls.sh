#!/bin/bash
# The per-call calibration data of a GPU: N shapes runs (--backend cuda) with the GPU file, each
# run's calls.csv kept (its features do not depend on the cost model, so fits and held-out checks
# run afterwards, anywhere: memsim calibrate --in-context / --check).
# Usage (repo root, on the GPU machine): tools/gpu_calls.sh MEMSIM GPU N OUTDIR
#   e.g. tools/gpu_calls.sh build-cuda/memsim h200 6 calls-h200
set -u
if [ $# -ne 4 ]; then
  echo "usage: $0 MEMSIM GPU N OUTDIR" >&2
  exit 2
fi
MEMSIM=$1; GPU=$2; N=$3; OUTDIR=$4
export MEMSIM_ROOT=${MEMSIM_ROOT:-$PWD}
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
for i in $(seq 1 "$N"); do
  timeout 600 "$MEMSIM" --config experiments/shapes.yaml --backend cuda --set gpu="$GPU" \
    --out "$OUTDIR/run$i" > "$OUTDIR/run$i.log" 2>&1
  echo "[$(( $(date +%s) - T0 ))s] run $i rc=$?"
  grep -E "warm-up|primitive classes|FAIL" "$OUTDIR/run$i.log"
  cp "$OUTDIR/run$i/shapes/calls.csv" "$OUTDIR/calls$i.csv"
done
echo "fit:   $MEMSIM calibrate --in-context $OUTDIR/calls1.csv ... --gpu configs/gpus/$GPU.yaml --out FILE"
echo "check: $MEMSIM calibrate --check $OUTDIR/callsK.csv --gpu FILE"
