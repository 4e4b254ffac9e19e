#!/usr/bin/env bash
# Long check (minutes; `memory_5m` in the long suite): 5,000,000 requests, from a trace and from the
# synthetic generator, run to the end under a 2 GiB address-space limit within 1 GiB of RSS.
# Usage: tests/long/memory_5m.sh /path/to/memsim   (run from anywhere; needs python3). Prints each run's wall time and peak RSS; exits 0 when both pass, 1 otherwise.
set -u
if [ $# -ne 1 ]; then
  echo "usage: $0 /path/to/memsim" >&2
  exit 1
fi
MEMSIM=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIMIT_KIB=2097152
MAX_RSS_KIB=1048576
TMP=$(mktemp -d "${TMPDIR:-/tmp}/memsim_long_5m.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

# The trace of the reliability review (F11): Poisson 20/s, 99 MB.
python3 - "$TMP/rows5m.csv" <<'PY'
import random, sys
random.seed(1)
with open(sys.argv[1], 'w') as f:
    f.write('arrival_s,prompt_tokens,output_tokens\n')
    t = 0.0
    for i in range(5000000):
        t += random.expovariate(20)
        f.write(f'{t:.4f},{random.randint(16,2048)},{random.randint(4,512)}\n')
PY
cat >"$TMP/trace5m.yaml" <<YAML
experiment: trace5m
gpu: h200
model: llama-3.1-8b
engine: {gpu_memory_utilization: 0.9, max_model_len: 16384}
scheduler: {impl: continuous_batching, max_num_seqs: 256, max_num_batched_tokens: 8192}
kv: {impl: paged_block_pool, block_size: 16}
requests:
  source: trace
  trace: {path: $TMP/rows5m.csv}
YAML

failures=0
# check NAME ARGS...: memsim ARGS under the limit; exit 0 and peak RSS within MAX_RSS_KIB.
check() {
  local name=$1
  shift
  # python3 runs memsim and reads its peak RSS (getrusage of the children), wall time.
  (cd "$ROOT" && ulimit -v $LIMIT_KIB && exec python3 -c '
import resource, subprocess, sys, time
t = time.monotonic()
rc = subprocess.call(sys.argv[1:])
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(f"peak_rss_kib {rss} wall_s {time.monotonic() - t:.1f}", file=sys.stderr)
sys.exit(rc)' "$MEMSIM" "$@" --out "$TMP/out_$name" --no-plots) \
    >"$TMP/$name.out" 2>"$TMP/$name.err"
  local rc=$?
  local rss wall
  rss=$(awk '/^peak_rss_kib/ {print $2}' "$TMP/$name.err")
  wall=$(awk '/^peak_rss_kib/ {print $4 " s"}' "$TMP/$name.err")
  echo "$name: exit $rc, wall $wall, peak RSS $((${rss:-0} / 1024)) MiB"
  if [ "$rc" -ne 0 ] || [ "${rss:-0}" -gt $MAX_RSS_KIB ]; then
    echo "FAIL: $name" >&2
    tail -5 "$TMP/$name.err" >&2
    failures=$((failures + 1))
  fi
  rm -rf "$TMP/out_$name"
}
check trace --config "$TMP/trace5m.yaml"
check synthetic --config "$ROOT/experiments/sweep_grid.yaml" --set requests.count=5000000
[ "$failures" -eq 0 ]
