#!/usr/bin/env bash
# Runs memsim's libFuzzer targets (fuzz/) over corpora seeded from experiments/, data/ and the
# recorded snapshots, and prints executions, coverage and findings per target.
#   tools/fuzz.sh [--runs N | --seconds S] [TARGET...]     (default: --runs 1000000, all three)
# Needs a fuzz build: CXX=clang++ meson setup build-fuzz -Dfuzz=true -Dtests=false \
#   -Dcuda=disabled -Db_sanitize=address,undefined -Db_lundef=false && ninja -C build-fuzz
# Findings (crashes, leaks, timeouts, out-of-memory) land in build-fuzz/fuzz-artifacts/; the exit
# code is 1 when there is any.
set -u
cd "$(dirname "$0")/.."
B=${MEMSIM_FUZZ_BUILD:-build-fuzz}
limit=(-runs=1000000)
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) limit=(-runs="$2"); shift 2 ;;
    --seconds) limit=(-max_total_time="$2"); shift 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(config trace snapshot)
for t in "${targets[@]}"; do
  [ -x "$B/fuzz/fuzz_$t" ] || { echo "fuzz.sh: $B/fuzz/fuzz_$t not built (see the header)"; exit 2; }
done

# Seed corpora.
S=$B/fuzz-seeds
rm -rf "$S"
mkdir -p "$S/config" "$S/trace" "$S/snapshot" "$B/fuzz-artifacts"
for f in experiments/*.yaml; do
  cp "$f" "$S/config/$(basename "$f")"
  { cat "$f"; printf '\n#--set\nseed=3\n'; } > "$S/config/set_$(basename "$f")"
done
i=0
for f in data/*/*.csv tests/data/*.csv; do
  [ -f "$f" ] || continue
  for knob in 0 1 2; do
    { printf "\\x$(printf %02x $knob)"; head -200 "$f"; } > "$S/trace/$i.csv"
    i=$((i + 1))
  done
done
cp tests/data/snapshots/*.pickle "$S/snapshot/" 2>/dev/null

status=0
for t in "${targets[@]}"; do
  C=$B/fuzz-corpus/$t
  mkdir -p "$C"
  log=$B/fuzz-$t.log
  "$B/fuzz/fuzz_$t" "${limit[@]}" -rss_limit_mb=2048 -timeout=20 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$B/fuzz-artifacts/$t-" "$C" "$S/$t" > "$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$')
  found=$(ls "$B/fuzz-artifacts/$t-"* 2>/dev/null | wc -l)
  echo "fuzz_$t: ${execs:-?} executions (${rate:-?}/s), $cov, corpus $(ls "$C" | wc -l) inputs, findings $found, exit $rc"
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
    status=1
    grep -E "ERROR|SUMMARY|==[0-9]+==|config error that" "$log" | head -5
  fi
done
exit $status
