#!/usr/bin/env bash
# Serving experiments on the GPU machine (--backend cuda), each on a slice of its requests so a
# validation run takes minutes: prints each experiment's GPU table and gathers every
# validation.csv into OUT_DIR/validation_all.csv. Usage: tools/gpu_serving.sh MEMSIM OUT_DIR NAME...
# with NAME among strategies, vattention, block_size, prefix_sharing, cow, preemption.
set -u
memsim=${1:?usage: tools/gpu_serving.sh MEMSIM OUT_DIR NAME...}
out=${2:?}
shift 2
mkdir -p "$out" /tmp/memsim-serving
# The GPU file of this machine's GPU (memsim refuses --backend cuda with another GPU's file).
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE 'h[0-9]00' |
  tr 'A-Z' 'a-z')
status=0
for name in "$@"; do
  case $name in
    strategies) args=(--config experiments/kv_strategies.yaml --set requests.trace.limit=100) ;;
    vattention) args=(--config experiments/kv_vattention.yaml --set requests.trace.limit=150) ;;
    block_size) args=(--config experiments/kv_block_size.yaml --set requests.count=80) ;;
    prefix_sharing) args=(--config experiments/kv_prefix_sharing.yaml --set requests.count=100) ;;
    cow)
      sed 's/count: 1500/count: 80/' experiments/kv_cow.yaml > /tmp/memsim-serving/kv_cow.yaml
      args=(--config /tmp/memsim-serving/kv_cow.yaml) ;;
    preemption) args=(--config experiments/kv_preemption.yaml --set requests.count=200) ;;
    *) echo "unknown experiment $name"; exit 2 ;;
  esac
  t0=$SECONDS
  timeout 560 "$memsim" "${args[@]}" --backend cuda --set "gpu=${gpu:-h200}" \
    --out /tmp/memsim-serving/r ${EXTRA:-} \
    > "$out/$name.log" 2>&1
  rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  [ $rc -ne 0 ] && status=1
  sed -n '/^--backend cuda:/,$p' "$out/$name.log" | grep -Ev "^(strategy =|GPU =|attention output|attn =)"
  grep -E "error:" "$out/$name.log" | head -3
  exp=$(ls -t /tmp/memsim-serving/r | head -1)
  csv=/tmp/memsim-serving/r/$exp/validation.csv
  if [ -f "$csv" ]; then
    [ -f "$out/validation_all.csv" ] || head -1 "$csv" | sed 's/^/experiment,/' > "$out/validation_all.csv"
    tail -n +2 "$csv" | sed "s/^/$exp,/" >> "$out/validation_all.csv"
  fi
done
exit $status
