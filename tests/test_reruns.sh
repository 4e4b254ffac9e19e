#!/usr/bin/env bash
# Reruns are identical: every experiments/*.yaml runs twice with the same seed, and every output
# file (tables, JSON, CSV, PNG, SVG, snapshots) must match byte for byte; only timing.json (host
# wall times) may differ. Experiments with random inputs also run with another seed, whose
# summary.json must differ (the seed matters).
# Usage: test_reruns.sh /path/to/memsim [--no-plots] [NAME...]   (MEMSIM_SOURCE_ROOT: the source
# tree). NAMEs pick experiments (default: all); --no-plots leaves the plots out (the quick suite).
set -u

MEMSIM=$1
shift
case $MEMSIM in /*) ;; *) MEMSIM=$PWD/$MEMSIM ;; esac
PLOTS=()
if [ "${1:-}" = --no-plots ]; then
  PLOTS=(--no-plots)
  shift
fi
ONLY=" $* "
ROOT=${MEMSIM_SOURCE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/memsim_reruns.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
export MEMSIM_ROOT=$ROOT

# Experiments whose inputs are drawn from the seed (synthetic requests, generated programs,
# dynamic arrivals); the others replay fixed traces or snapshots.
SEEDED="allocators kv_block_size kv_cow kv_prefix_sharing rl_colocation shapes sweep_grid"

failures=0
checks=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

for cfg in "$ROOT"/experiments/*.yaml; do
  name=$(basename "$cfg" .yaml)
  [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $name "* ]] || continue
  for run in a b; do
    (cd "$TMP" && "$MEMSIM" --config "$cfg" --seed 1 --out "$TMP/$run" "${PLOTS[@]}" \
      > "$TMP/$name.$run.out" 2> "$TMP/$name.$run.err")
    echo $? > "$TMP/$name.$run.rc"
  done
  checks=$((checks + 1))
  if ! cmp -s "$TMP/$name.a.rc" "$TMP/$name.b.rc"; then
    fail "$name: exit codes differ ($(cat "$TMP/$name.a.rc") vs $(cat "$TMP/$name.b.rc"))"
    continue
  fi
  # The terminal output, minus lines that report host time or the output folder.
  for run in a b; do
    grep -vE "wall|wrote |plots: |[0-9]x real|engine time" "$TMP/$name.$run.out" | sed "s#$TMP/$run#OUT#g" \
      > "$TMP/$name.$run.table"
  done
  cmp -s "$TMP/$name.a.table" "$TMP/$name.b.table" || fail "$name: the printed tables differ"
  files=0
  while IFS= read -r f; do
    rel=${f#"$TMP/a/"}
    [ "$(basename "$rel")" = timing.json ] && continue
    files=$((files + 1))
    if [ ! -f "$TMP/b/$rel" ]; then
      fail "$name: $rel written by the first run only"
    elif ! cmp -s "$f" "$TMP/b/$rel"; then
      fail "$name: $rel differs between two runs with the same seed"
    fi
  done < <(find "$TMP/a" -type f | sort)
  [ "$files" -gt 0 ] || fail "$name: no output files (exit $(cat "$TMP/$name.a.rc"))"
  if [[ " $SEEDED " == *" $name "* ]]; then
    checks=$((checks + 1))
    (cd "$TMP" && "$MEMSIM" --config "$cfg" --seed 2 --out "$TMP/c" "${PLOTS[@]}" >/dev/null 2>&1)
    s1=$(find "$TMP/a" -name summary.json | head -1)
    s2=$(find "$TMP/c" -name summary.json | head -1)
    if [ -z "$s2" ] || cmp -s "$s1" "$s2"; then
      fail "$name: --seed 2 gives the same summary.json as --seed 1"
    fi
  fi
  echo "test_reruns: $name: $files files identical across reruns"
  rm -rf "$TMP/a" "$TMP/b" "$TMP/c"
done

echo "test_reruns: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
