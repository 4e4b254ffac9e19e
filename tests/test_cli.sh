#!/usr/bin/env bash
# End-to-end test of the memsim command line: --help/--version, the main job's outputs, and that
# a bad config gives one located error, exit code 2 and no output folder.
# Usage: test_cli.sh /path/to/memsim   (MEMSIM_SOURCE_ROOT: the source tree)
# Exits 0 when every check passes, 1 otherwise (each failure is printed).
set -u

if [ $# -lt 1 ]; then
  echo "usage: $0 /path/to/memsim" >&2
  exit 1
fi
MEMSIM=$1
case $MEMSIM in /*) ;; *) MEMSIM=$PWD/$MEMSIM ;; esac
ROOT=${MEMSIM_SOURCE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
CONFIG=$ROOT/experiments/shapes.yaml
GPU=$ROOT/configs/gpus/h200.yaml
MODEL=$ROOT/configs/models/llama-3.1-8b.yaml

CLI_TEST_NAME=test_cli
# shellcheck source=tests/cli_lib.sh
source "$(dirname "$0")/cli_lib.sh"

# A copy of the experiment with one sed edit, referencing gpu/model by absolute path.
make_config() {
  local name=$1 edit=$2
  sed -e "s#^gpu: h200#gpu: $GPU#" -e "s#^model: llama-3.1-8b#model: $MODEL#" "$CONFIG" |
    sed -e "$edit" >"$TMP/$name.yaml"
}

# line_of FILE PREFIX: 1-based number of the first line of FILE starting with PREFIX.
line_of() { awk -v p="$2" 'index($0, p) == 1 { print NR; exit }' "$1"; }

check "memsim binary $MEMSIM is executable" test -x "$MEMSIM"
check "experiment $CONFIG exists" test -f "$CONFIG"

# --- --help and --version ----------------------------------------------------------------------
run help --help
expect_rc help 0
expect_in "$TMP/help.out" "--config" "--help lists --config"
expect_in "$TMP/help.out" "--set" "--help lists --set"

run version --version
expect_rc version 0
if [ "$(cat "$TMP/version.out")" = "memsim 0.1.0" ]; then
  pass
else
  fail "--version printed '$(cat "$TMP/version.out")', expected 'memsim 0.1.0'"
fi

# --- the main job ------------------------------------------------------------------------------
run main --config "$CONFIG" --out "$TMP/out_main"
expect_rc main 0
for f in summary.json curves.csv timeseries.csv; do
  check "main job wrote $f" test -s "$TMP/out_main/shapes/$f"
done
# Every strategy label starts a row of the printed table.
for label in private_pools shared_pool shared_pool/large_first global_pool/large_first vmm_alias \
  graph_mem_nodes; do
  if grep -qE "^${label}[[:space:]]" "$TMP/main.out"; then
    pass
  else
    fail "main job: the table has no row for strategy '$label'"
  fi
done
expect_in "$TMP/main.out" "variant weak/fixed/full/persistent" "main job: table slice named"
expect_in "$TMP/main.out" " 0 invariant violation(s)" "main job: no invariant violations"
expect_in "$TMP/main.out" "wrote $TMP/out_main/shapes/summary.json" "main job: says where it wrote"
expect_re "$TMP/out_main/shapes/summary.json" '"seed": *1,' "main job: summary.json has seed 1"
expect_in "$TMP/out_main/shapes/curves.csv" "variant,strategy," "main job: curves.csv header"
if [ -s "$TMP/main.err" ]; then fail "main job wrote to stderr"; show "$TMP/main.err"; else pass; fi

# --- --set seed=7 and --seed 7 -------------------------------------------------------------------
run set_seed --config "$CONFIG" --out "$TMP/out_seed" --set seed=7
expect_rc set_seed 0
expect_re "$TMP/out_seed/shapes/summary.json" '"seed": *7,' "--set seed=7: summary.json has seed 7"

run seed_flag --config "$CONFIG" --out "$TMP/out_seed_flag" --seed 7
expect_rc seed_flag 0
expect_re "$TMP/out_seed_flag/shapes/summary.json" '"seed": *7,' "--seed 7: summary.json has seed 7"

run set_small --config "$CONFIG" --out "$TMP/out_small" --set max_num_seqs=8
expect_rc set_small 0
expect_re "$TMP/out_small/shapes/summary.json" '"capture_sizes": *\[1, *2, *4, *8, *16\]' \
  "--set max_num_seqs=8: capture sizes 1, 2, 4, 8, 16"

# --- a typo'd config: exit 2, one located error, nothing written --------------------------------
make_config typo 's/^max_num_seqs: 256/max_num_seq: 256/'
LINE=$(line_of "$TMP/typo.yaml" "max_num_seq:")
run typo --config "$TMP/typo.yaml" --out "$TMP/out_typo"
expect_rc typo 2
expect_in "$TMP/typo.err" \
  "$TMP/typo.yaml:$LINE: max_num_seq: unknown key 'max_num_seq' (did you mean 'max_num_seqs'?)" \
  "typo: stderr names file:line: key"
expect_one_line "$TMP/typo.err" "typo: one error"
expect_absent "$TMP/out_typo" "typo: --out dir created"
if [ -s "$TMP/typo.out" ]; then fail "typo: wrote to stdout"; show "$TMP/typo.out"; else pass; fi

# A typo inside a strategy, and an unknown impl.
make_config typo_param 's/    handle_bytes: 2MiB/    handle_byte: 2MiB/'
LINE=$(line_of "$TMP/typo_param.yaml" "    handle_byte:")
run typo_param --config "$TMP/typo_param.yaml" --out "$TMP/out_typo_param"
expect_rc typo_param 2
expect_in "$TMP/typo_param.err" \
  "$TMP/typo_param.yaml:$LINE: strategies[4].handle_byte: unknown key 'handle_byte' (did you mean 'handle_bytes'?)" \
  "typo_param: stderr names file:line: key"
expect_absent "$TMP/out_typo_param" "typo_param: --out dir created"

# Out of range, bad byte size, missing referenced model.
make_config range 's/^kv_block_size: 16/kv_block_size: 0/'
run range --config "$TMP/range.yaml" --out "$TMP/out_range"
expect_rc range 2
expect_in "$TMP/range.err" "$TMP/range.yaml:$(line_of "$TMP/range.yaml" kv_block_size:): kv_block_size: 0 is out of range" \
  "range: stderr names file:line: key"
expect_absent "$TMP/out_range" "range: --out dir created"

make_config bytes 's/^gemm_workspace: 32MiB/gemm_workspace: 3 parsecs/'
run bytes --config "$TMP/bytes.yaml" --out "$TMP/out_bytes"
expect_rc bytes 2
expect_in "$TMP/bytes.err" "$TMP/bytes.yaml:$(line_of "$TMP/bytes.yaml" gemm_workspace:): gemm_workspace: unknown unit 'parsecs'" \
  "bytes: stderr names file:line: key"
expect_absent "$TMP/out_bytes" "bytes: --out dir created"

make_config nomodel "s#^model: .*#model: $TMP/no_such_model.yaml#"
run nomodel --config "$TMP/nomodel.yaml" --out "$TMP/out_nomodel"
expect_rc nomodel 2
expect_in "$TMP/nomodel.err" "$TMP/nomodel.yaml:$(line_of "$TMP/nomodel.yaml" model:): model: cannot find models config" \
  "nomodel: stderr names file:line: key"
expect_absent "$TMP/out_nomodel" "nomodel: --out dir created"

# A YAML syntax error.
make_config syntax 's/^seed: 1/seed: 1: 2/'
run syntax --config "$TMP/syntax.yaml" --out "$TMP/out_syntax"
expect_rc syntax 2
expect_in "$TMP/syntax.err" "$TMP/syntax.yaml:$(line_of "$TMP/syntax.yaml" seed:): YAML syntax error" \
  "syntax: stderr names file:line"
expect_absent "$TMP/out_syntax" "syntax: --out dir created"

# --- bad --set ---------------------------------------------------------------------------------
run set_unknown --config "$CONFIG" --out "$TMP/out_set_unknown" --set max_num_seq=8
expect_rc set_unknown 2
expect_in "$TMP/set_unknown.err" "unknown key 'max_num_seq' (did you mean 'max_num_seqs'?)" \
  "--set max_num_seq=8: names the key"
expect_one_line "$TMP/set_unknown.err" "--set max_num_seq=8: one error"
expect_absent "$TMP/out_set_unknown" "--set max_num_seq=8: --out dir created"

run set_malformed --config "$CONFIG" --out "$TMP/out_set_malformed" --set seed
expect_rc set_malformed 2
expect_in "$TMP/set_malformed.err" "--set seed: expected key.path=value" "--set seed: explained"
expect_absent "$TMP/out_set_malformed" "--set seed: --out dir created"

run set_value --config "$CONFIG" --out "$TMP/out_set_value" --set kv_block_size=0
expect_rc set_value 2
expect_in "$TMP/set_value.err" "kv_block_size" "--set kv_block_size=0: names the key"
expect_absent "$TMP/out_set_value" "--set kv_block_size=0: --out dir created"

# --- command-line errors -----------------------------------------------------------------------
run noconfig --out "$TMP/out_noconfig"
expect_rc noconfig 2
expect_absent "$TMP/out_noconfig" "no --config: --out dir created"

run missing_config --config "$TMP/absent.yaml" --out "$TMP/out_missing_config"
expect_rc missing_config 2
expect_in "$TMP/missing_config.err" "$TMP/absent.yaml" "missing --config file: named"
expect_absent "$TMP/out_missing_config" "missing --config file: --out dir created"

run bad_backend --config "$CONFIG" --out "$TMP/out_bad_backend" --backend tpu
expect_rc bad_backend 2
expect_absent "$TMP/out_bad_backend" "--backend tpu: --out dir created"

# --- --backend cuda on a build without CUDA ------------------------------------------------------
run cuda --config "$CONFIG" --out "$TMP/out_cuda" --backend cuda
if [ "$rc" -ne 0 ]; then pass; else fail "--backend cuda: exit code 0, expected non-zero"; fi
if grep -qi cuda "$TMP/cuda.err"; then
  pass
else
  fail "--backend cuda: stderr does not mention CUDA"
  show "$TMP/cuda.err"
fi
expect_absent "$TMP/out_cuda" "--backend cuda: --out dir created"

# --- serving experiments (experiments/kv_*.yaml) --------------------------------------------------
KVCONF="$TMP/kv_small.yaml"
cat > "$KVCONF" <<YAML
experiment: kv_small
gpu: $ROOT/configs/gpus/h200.yaml
model: $ROOT/configs/models/llama-3.1-8b.yaml
engine: {kv_budget: 2GiB, max_model_len: 4096}
requests:
  source: trace
  trace: {path: $ROOT/data/azure-llm-2023/conv.csv, limit: 200, time_scale: 0.1}
runs:
  - kv: {impl: paged_block_pool, block_size: 16}
  - kv: {impl: radix_token_pool}
YAML
run kv_small --config "$KVCONF" --out "$TMP/out_kv"
expect_rc kv_small 0
expect_in "$TMP/kv_small.out" "paged_block_pool block_size=16" "kv run: table row"
for f in summary.json curves.csv timeseries.csv; do
  check "kv run: $f written" test -s "$TMP/out_kv/kv_small/$f"
done
sed 's/block_size: 16/blok_size: 16/' "$KVCONF" > "$TMP/kv_typo.yaml"
run kv_typo --config "$TMP/kv_typo.yaml" --out "$TMP/out_kv_typo"
expect_rc kv_typo 2
expect_in "$TMP/kv_typo.err" "kv_typo.yaml:9: runs[0].kv.blok_size" "kv typo: file, line and key"
expect_in "$TMP/kv_typo.err" "block_size" "kv typo: closest key suggested"
expect_absent "$TMP/out_kv_typo" "kv typo: --out dir created"
# Special files as a trace are refused by type, before anything is read (a FIFO would block).
mkfifo "$TMP/fifo"
for special in /dev/zero "$TMP/fifo" "$TMP"; do
  run kv_special --config "$KVCONF" --out "$TMP/out_kv_special" --set "requests.trace.path=$special"
  expect_rc kv_special 2
  expect_in "$TMP/kv_special.err" "requests.trace.path): $special is not a regular file (a" \
    "kv trace $special: refused by its type"
done
# Serving on --backend cuda needs a GPU (tests run without one): refused with exit 2, nothing
# written, and the message says why.
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  run kv_cuda --config "$KVCONF" --out "$TMP/out_kv_cuda" --backend cuda
  expect_rc kv_cuda 2
  expect_in "$TMP/kv_cuda.err" "cuda" "kv --backend cuda without a GPU: says why"
  expect_absent "$TMP/out_kv_cuda" "kv --backend cuda without a GPU: --out dir created"
fi

# Sliding-window and hybrid attention (experiments/kv_hybrid.yaml, Gemma-3-12B): both runs
# finish; a strategy without KV cache groups and a pattern without a window are located errors.
run kv_hybrid --config "$ROOT/experiments/kv_hybrid.yaml" --out "$TMP/out_kv_hybrid" --no-plots \
  --set requests.count=100
expect_rc kv_hybrid 0
expect_in "$TMP/kv_hybrid.out" "KV cache groups: 6 groups of 8 layers: 5 x window 1024, 1 x full" \
  "kv_hybrid: the groups in the budget"
expect_in "$TMP/kv_hybrid.out" "hybrid bf16" "kv_hybrid: the hybrid run's row"
sed 's/    kv: {impl: paged_block_pool, block_size: 16}$/    kv: {impl: radix_token_pool}/' \
  "$ROOT/experiments/kv_hybrid.yaml" > "$TMP/kv_hybrid_radix.yaml"
run kv_hybrid_radix --config "$TMP/kv_hybrid_radix.yaml" --out "$TMP/out_kv_hybrid_radix"
expect_rc kv_hybrid_radix 2
expect_in "$TMP/kv_hybrid_radix.err" \
  "kv_hybrid_radix.yaml:$(grep -n 'impl: radix_token_pool' "$TMP/kv_hybrid_radix.yaml" | sed -n 2p | cut -d: -f1): runs[1].kv.impl" \
  "kv_hybrid with radix_token_pool: file, line and key"
expect_in "$TMP/kv_hybrid_radix.err" "cannot hold KV cache groups" "kv_hybrid with radix: says why"
sed -e '/^sliding_window: 1024/d' "$ROOT/configs/models/gemma-3-12b.yaml" > "$TMP/nowindow.yaml"
run kv_nowindow --config "$ROOT/experiments/kv_hybrid.yaml" --out "$TMP/out_kv_nowindow" \
  --set "model=$TMP/nowindow.yaml"
expect_rc kv_nowindow 2
expect_in "$TMP/kv_nowindow.err" "sliding_window_pattern: needs sliding_window" \
  "a pattern without a window: names the key"

# memsim replay: a recorded PyTorch snapshot, its outputs, and bad snapshots or options.
SNAP=$ROOT/tests/data/snapshots/steps_default.pickle
run replay replay "$SNAP" --out "$TMP/out_replay" --export "$TMP/exported.pickle"
expect_rc replay 0
expect_in "$TMP/replay.out" "reserved equal to the recording after every op" "replay: torch_caching matches the recording"
for f in summary.json timeseries.csv; do
  check "replay: $f written" test -s "$TMP/out_replay/replay/$f"
done
expect_in "$TMP/out_replay/replay/summary.json" '"peak_reserved_bytes": 150994944' \
  "replay: peak reserved as PyTorch reported it"
check "replay: snapshot exported" test -s "$TMP/exported.pickle"
run replay_back replay "$TMP/exported.pickle" --allocator torch_caching --no-min-capacity \
  --out "$TMP/out_replay_back"
expect_rc replay_back 0
expect_in "$TMP/replay_back.out" "reserved equal to the recording after every op" "replay: the exported snapshot replays"
# Variants of one allocator side by side, each row labelled with its options; --no-plots.
run replay_var replay "$SNAP" --no-min-capacity --no-plots --out "$TMP/out_replay_var" \
  --allocator torch_caching --allocator torch_caching:expandable_segments=true \
  --allocator 'torch_caching:roundup_power2_divisions=4,max_split_size=64MiB' \
  --set torch_caching.garbage_collection_threshold=0.5
expect_rc replay_var 0
expect_re "$TMP/replay_var.out" "^torch_caching:garbage_collection_threshold=0.5 +117.7 MiB +119.1 MiB +144.0 MiB" \
  "replay variants: --set labels its row"
expect_re "$TMP/replay_var.out" \
  "^torch_caching:garbage_collection_threshold=0.5,expandable_segments=true +117.7 MiB +117.7 MiB +144.0 MiB" \
  "replay variants: expandable segments row"
expect_re "$TMP/replay_var.out" \
  "^torch_caching:garbage_collection_threshold=0.5,roundup_power2_divisions=4,max_split_size=64MiB +117.7 MiB +129.7 MiB +164.0 MiB" \
  "replay variants: two options in one row"
expect_in "$TMP/replay_var.out" "plots skipped (--no-plots)" "replay: --no-plots"
expect_in "$TMP/replay_var.out" "columns: add --explain, or see docs/tables.md#allocators-and-memsim-replay" \
  "replay: the table's footer points to its columns"
run replay_explain replay "$SNAP" --no-min-capacity --no-plots --out "$TMP/out_replay_explain" \
  --allocator torch_caching --explain
expect_rc replay_explain 0
expect_re "$TMP/replay_explain.out" "^  peak requested +peak of the bytes the program asked for" \
  "replay --explain: a legend line per column"
check "replay --explain: no footer" bash -c "! grep -q 'add --explain' '$TMP/replay_explain.out'"
expect_in "$TMP/out_replay_var/replay/summary.json" \
  '"config": "{garbage_collection_threshold: 0.5, expandable_segments: true}"' \
  "replay variants: summary.json has the resolved options"
check "replay variants: no plot with --no-plots" test ! -e "$TMP/out_replay_var/replay/allocators.png"
run replay_var_twice replay "$SNAP" --allocator torch_caching:expandable_segments=true \
  --allocator torch_caching:expandable_segments=true --out "$TMP/out_replay_var2"
expect_rc replay_var_twice 2
expect_in "$TMP/replay_var_twice.err" "is given twice" "replay variants: a row given twice"
run replay_var_key replay "$SNAP" --allocator torch_caching:expandable_segment=true \
  --out "$TMP/out_replay_var2"
expect_rc replay_var_key 2
expect_in "$TMP/replay_var_key.err" \
  "'expandable_segment' is not a key of torch_caching (did you mean 'expandable_segments'?)" \
  "replay variants: a misspelt option named"
run replay_var_val replay "$SNAP" --allocator torch_caching:max_split_size=1MiB \
  --out "$TMP/out_replay_var2"
expect_rc replay_var_val 2
expect_in "$TMP/replay_var_val.err" "torch_caching:max_split_size=1MiB (torch_caching.max_split_size): must be above 20 MiB" \
  "replay variants: a bad value names its row"
expect_absent "$TMP/out_replay_var2" "replay variants: no output on a bad option"
head -c 5000 "$SNAP" > "$TMP/truncated.pickle"
run replay_trunc replay "$TMP/truncated.pickle" --out "$TMP/out_trunc"
expect_rc replay_trunc 2
expect_in "$TMP/replay_trunc.err" "truncated.pickle: pickle byte" "replay: truncated snapshot named"
expect_absent "$TMP/out_trunc" "replay truncated: --out dir created"
run replay_text replay "$CONFIG" --out "$TMP/out_text"
expect_rc replay_text 2
expect_in "$TMP/replay_text.err" "not a binary pickle" "replay: a YAML file is not a pickle"
# /dev/zero and /dev/urandom never end and a FIFO blocks: refused unread (an address-space limit
# keeps a regression from eating the machine's memory; timeout from blocking on the FIFO).
# (AddressSanitizer's shadow memory does not fit under such a limit: its runs set ASAN_OPTIONS.)
vlimit=4194304
[ -n "${ASAN_OPTIONS:-}" ] && vlimit=unlimited
for special in /dev/zero /dev/urandom "$TMP/fifo"; do
  (ulimit -v $vlimit; cd "$TMP" && exec timeout 20 "$MEMSIM" replay "$special" --no-min-capacity \
    --out "$TMP/out_special") >"$TMP/replay_special.out" 2>"$TMP/replay_special.err"
  rc=$?
  expect_rc replay_special 2
  expect_in "$TMP/replay_special.err" "memsim replay: $special is not a regular file (a" \
    "replay $special: refused by its type"
done
expect_absent "$TMP/out_special" "replay of a special file: --out dir created"
run replay_alloc replay "$SNAP" --allocator torch_cachin --out "$TMP/out_alloc"
expect_rc replay_alloc 2
expect_in "$TMP/replay_alloc.err" "did you mean 'torch_caching'" "replay: unknown allocator"
run replay_key replay "$SNAP" --set torch_caching.max_split=64MiB --out "$TMP/out_key"
expect_rc replay_key 2
expect_in "$TMP/replay_key.err" "max_split_size" "replay: unknown key names the closest"
run replay_val replay "$SNAP" --set torch_caching.max_split_size=lots --out "$TMP/out_val"
expect_rc replay_val 2
expect_in "$TMP/replay_val.err" "torch_caching.max_split_size" "replay: bad value names the key"

# The allocators experiment (a shortened grid): table, outputs, and a located config error.
ALCONF=$ROOT/experiments/allocators.yaml
sed -e 's/steps: 300 /steps: 40 /' -e 's#path: ../tests#path: '"$ROOT"'/tests#' "$ALCONF" \
  > "$TMP/alloc_small.yaml"
MEMSIM_ROOT=$ROOT run alloc --config "$TMP/alloc_small.yaml" --out "$TMP/out_alloc" \
  --set min_capacity=false --explain
expect_rc alloc 0
expect_re "$TMP/alloc.out" "^workload +allocator +peak requested +peak allocated +peak reserved" \
  "allocators: header names requested and allocated peaks"
expect_re "$TMP/alloc.out" "^  workload +the allocation program replayed" "allocators --explain: legend"
expect_in "$TMP/out_alloc/allocators/summary.json" '"peak_requested_bytes": ' \
  "allocators: summary.json has the requested peak"
expect_in "$TMP/alloc.out" "reserved equal to the recording after every op" \
  "allocators: torch_caching reproduces the committed snapshot"
for f in summary.json timeseries.csv; do
  check "allocators: $f written" test -s "$TMP/out_alloc/allocators/$f"
done
if command -v python3 >/dev/null 2>&1; then
  check "allocators: summary.json parses" python3 -c "import json,sys; json.load(open(sys.argv[1]))" \
    "$TMP/out_alloc/allocators/summary.json"
fi
sed 's/impl: sma/impl: smaa/' "$ALCONF" > "$TMP/alloc_typo.yaml"
sed -i 's#path: ../tests#path: '"$ROOT"'/tests#' "$TMP/alloc_typo.yaml"
MEMSIM_ROOT=$ROOT run alloc_typo --config "$TMP/alloc_typo.yaml" --out "$TMP/out_alloc_typo"
expect_rc alloc_typo 2
expect_in "$TMP/alloc_typo.err" "alloc_typo.yaml" "allocators typo: file named"
expect_in "$TMP/alloc_typo.err" "sma" "allocators typo: closest impl suggested"

# The shapes experiment with one PyTorch snapshot per capture size: each shape's standalone
# private pool equals the private-pool segments PyTorch itself held after that capture
# (34, 34 and 54 MiB at batch 1, 8, 64: max 54 MiB, sum 122 MiB).
run shapes_snap --config "$ROOT/experiments/shapes_snapshots.yaml" --out "$TMP/out_shapes_snap"
expect_rc shapes_snap 0
expect_in "$TMP/shapes_snap.out" "max(shape) = 54.0 MiB, sum(shape) = 122.0 MiB" \
  "shapes with snapshots: PyTorch's private pools"
sed 's#graph_b8.pickle#graph_b9.pickle#' "$ROOT/experiments/shapes_snapshots.yaml" \
  | sed 's#\.\./tests#'"$ROOT"'/tests#' > "$TMP/shapes_snap_bad.yaml"
MEMSIM_ROOT=$ROOT run shapes_snap_bad --config "$TMP/shapes_snap_bad.yaml" --out "$TMP/out_ssb"
expect_rc shapes_snap_bad 2
expect_in "$TMP/shapes_snap_bad.err" "program.files.8: cannot find file" \
  "shapes with snapshots: a missing file is named"

# The same three captures named by a pattern instead of a list.
sed -e '/^  files:/,/^    64:/d' -e 's#^  source: snapshot#  source: snapshot\n  pattern: "'"$ROOT"'/tests/data/snapshots/graph_b{batch}.pickle"#' \
  -e 's#^seed: 1#seed: 1\ncapture_sizes: [1, 8, 64]#' "$ROOT/experiments/shapes_snapshots.yaml" \
  > "$TMP/shapes_pattern.yaml"
MEMSIM_ROOT=$ROOT run shapes_pattern --config "$TMP/shapes_pattern.yaml" --out "$TMP/out_pattern"
expect_rc shapes_pattern 0
expect_in "$TMP/shapes_pattern.out" "max(shape) = 54.0 MiB, sum(shape) = 122.0 MiB" \
  "shapes with a snapshot pattern"

# export_snapshots: each pool strategy's timeline as a PyTorch snapshot; replayed through one
# torch_caching pool, shared_pool's reproduces its reserved bytes op for op.
run shapes_export --config "$CONFIG" --out "$TMP/out_shapes_export" --set export_snapshots=true
expect_rc shapes_export 0
EXPORTED=$TMP/out_shapes_export/shapes/snapshots/shared_pool_large_first.pickle
check "shapes export: snapshot written" test -s "$EXPORTED"
run shapes_export_replay replay "$EXPORTED" --allocator torch_caching --no-min-capacity \
  --out "$TMP/out_shapes_export_replay"
expect_rc shapes_export_replay 0
expect_in "$TMP/shapes_export_replay.out" "reserved equal to the recording after every op" \
  "shapes export: shared_pool's timeline replays exactly"

# engine.export_snapshot: a serving run's profile-run allocator timeline, replayed exactly.
run kv_export --config "$KVCONF" --out "$TMP/out_kv_export" --set engine.export_snapshot=true
expect_rc kv_export 0
KVSNAP=$(ls "$TMP"/out_kv_export/*/snapshots/*_profile_run.pickle 2>/dev/null | head -1)
check "serving export: snapshot written" test -s "$KVSNAP"
run kv_export_replay replay "$KVSNAP" --allocator torch_caching --no-min-capacity \
  --out "$TMP/out_kv_export_replay"
expect_rc kv_export_replay 0
expect_in "$TMP/kv_export_replay.out" "reserved equal to the recording after every op" \
  "serving export: the profile run replays exactly"

# The RL co-location experiment: table, outputs, OOM outcome, located config errors.
RLCONF=$ROOT/experiments/rl_colocation.yaml
run rl --config "$RLCONF" --out "$TMP/out_rl" --set iterations=1 --set max_utilization=false \
  --set models=[qwen2.5-7b]
expect_rc rl 0
expect_re "$TMP/rl.out" "no_saver .*OOM at iteration 0" "rl: no saver runs out of memory"
expect_re "$TMP/rl.out" "tagged_multi_stage .* valid +ok" "rl: multi-stage completes, graphs valid"
for f in summary.json phases.csv timeseries.csv; do
  check "rl: $f written" test -s "$TMP/out_rl/rl_colocation/$f"
done
if command -v python3 >/dev/null 2>&1; then
  check "rl: summary.json parses" python3 -c "import json,sys; json.load(open(sys.argv[1]))" \
    "$TMP/out_rl/rl_colocation/summary.json"
fi
if /usr/bin/python3 -c "import matplotlib" >/dev/null 2>&1; then
  check "rl: timeline plot written" test -s "$TMP/out_rl/rl_colocation/rl_timeline.png"
fi
run rl_typo --config "$RLCONF" --out "$TMP/out_rl_typo" --set train.shardng=zero3
expect_rc rl_typo 2
expect_in "$TMP/rl_typo.err" "train.shardng" "rl: unknown key named"
expect_in "$TMP/rl_typo.err" "sharding" "rl: closest key suggested"
check "rl: no output on a config error" test ! -e "$TMP/out_rl_typo"
run rl_sep --config "$RLCONF" --out "$TMP/out_rl_sep" --set 'runs=[{label: x, placement: separate, saver: {impl: tagged_regions}}]'
expect_rc rl_sep 2
expect_in "$TMP/rl_sep.err" "needs no saver" "rl: a saver with separate GPUs is refused"

# memsim sweep: a 2 x 2 grid in parallel, resume, invalid points, shards + merge, Slurm script.
sed '/^grid:/,$d' "$ROOT/experiments/sweep_grid.yaml" > "$TMP/grid.yaml"
SWEEP_AXES=(--sweep kv.block_size=8,128 --sweep requests.arrival.rate=5,60)
MEMSIM_ROOT=$ROOT run sweep sweep --config "$TMP/grid.yaml" --out "$TMP/out_sweep" -j 2 \
  "${SWEEP_AXES[@]}"
expect_rc sweep 0
expect_in "$TMP/sweep.out" "4 points (2 axes" "sweep: grid expanded"
expect_in "$TMP/sweep.out" "4 done, 0 failed" "sweep: every point ran"
SWCSV=$TMP/out_sweep/sweep_grid-sweep/sweep.csv
check "sweep: sweep.csv has a row per point" test "$(wc -l < "$SWCSV")" -eq 5
expect_re "$SWCSV" "^point,kv.block_size,requests.arrival.rate,label," "sweep: axes then fields"
cp "$SWCSV" "$TMP/sweep_first.csv"
MEMSIM_ROOT=$ROOT run sweep_again sweep --config "$TMP/grid.yaml" --out "$TMP/out_sweep" -j 2 \
  "${SWEEP_AXES[@]}"
expect_rc sweep_again 0
expect_in "$TMP/sweep_again.out" "4 of 4 points already complete" "sweep: a rerun resumes"
check "sweep: the rerun's sweep.csv is the same" cmp -s "$SWCSV" "$TMP/sweep_first.csv"
# memsim plot: the README's plot command, with the interpreter memsim found; bad kinds refused.
run plot_bad plot ../tools/plot_sweep
expect_rc plot_bad 2
expect_in "$TMP/plot_bad.err" "no plot '../tools/plot_sweep' (known: shapes" "plot: a path is no kind"
MEMSIM_PYTHON=/bin/false run plot_nopy plot sweep "$TMP/out_sweep/sweep_grid-sweep"
expect_rc plot_nopy 1
expect_in "$TMP/plot_nopy.err" "MEMSIM_PYTHON=/bin/false cannot import matplotlib" \
  "plot: an interpreter without matplotlib is named"
if /usr/bin/python3 -c "import matplotlib" >/dev/null 2>&1; then
  MEMSIM_ROOT=$ROOT run plot_sweep plot sweep "$TMP/out_sweep/sweep_grid-sweep" \
    --x requests.arrival.rate --y output_tokens_per_s --lines kv.block_size
  expect_rc plot_sweep 0
  check "plot: the sweep plot drawn" test -s \
    "$TMP/out_sweep/sweep_grid-sweep/sweep_output_tokens_per_s_vs_requests.arrival.rate.png"
fi
MEMSIM_ROOT=$ROOT run sweep_bad sweep --config "$TMP/grid.yaml" --out "$TMP/out_sweep_bad" \
  --sweep scheduler.max_num_seqs=0,16
expect_rc sweep_bad 2
expect_in "$TMP/sweep_bad.err" "point 0 (scheduler.max_num_seqs=0)" "sweep: invalid point named"
expect_in "$TMP/sweep_bad.err" "nothing was run" "sweep: nothing runs when a point is invalid"
check "sweep: no output for an invalid grid" test ! -e "$TMP/out_sweep_bad"
for k in 0 1; do
  MEMSIM_ROOT=$ROOT run sweep_shard$k sweep --config "$TMP/grid.yaml" --out "$TMP/out_shards" \
    --shard $k/2 "${SWEEP_AXES[@]}"
  expect_rc sweep_shard$k 0
done
expect_in "$TMP/sweep_shard1.out" "shard 1/2: 2 points" "sweep: a shard runs its points"
run merge merge "$TMP/out_shards/sweep_grid-sweep"
expect_rc merge 0
check "sweep: merged shards equal the local sweep" \
  cmp -s "$TMP/out_shards/sweep_grid-sweep/sweep.csv" "$SWCSV"
(cd "$TMP" && SLURM_ARRAY_TASK_ID=3 SLURM_ARRAY_TASK_MIN=2 SLURM_ARRAY_TASK_COUNT=2 \
  MEMSIM_ROOT=$ROOT "$MEMSIM" sweep --config "$TMP/grid.yaml" --out "$TMP/out_slurm_env" \
  "${SWEEP_AXES[@]}" > "$TMP/slurm_env.out" 2>&1)
expect_in "$TMP/slurm_env.out" "shard 1/2: 2 points" "sweep: the shard comes from a Slurm array"
MEMSIM_ROOT=$ROOT run sweep_sbatch sweep --config "$TMP/grid.yaml" --out "$TMP/out_sbatch" \
  --slurm --tasks 2 -j 1 "${SWEEP_AXES[@]}"
expect_rc sweep_sbatch 0
expect_in "$TMP/out_sbatch/sweep_grid-sweep/sweep.sbatch" "#SBATCH --array=0-1" \
  "sweep: the Slurm script is an array"
MEMSIM_ROOT=$ROOT run sweep_dry sweep --config "$ROOT/experiments/sweep_grid.yaml" --dry-run \
  --out "$TMP/out_dry"
expect_rc sweep_dry 0
expect_in "$TMP/sweep_dry.out" "500 points (3 axes" "sweep: the 500-point grid validates"
MEMSIM_ROOT=$ROOT run grid_base --config "$ROOT/experiments/sweep_grid.yaml" --out "$TMP/out_gb" \
  --no-plots
expect_rc grid_base 0

# Degenerate results: every run without KV memory still gets its table, JSON and plots that say
# why there is nothing to draw; exit 0 (outcomes, not failures).
sed 's/kv_budget: 2GiB, //' "$KVCONF" > "$TMP/kv_degenerate.yaml"
run degenerate --config "$TMP/kv_degenerate.yaml" --out "$TMP/out_degenerate" \
  --set engine.gpu_memory_utilization=0.05
expect_rc degenerate 0
expect_in "$TMP/degenerate.out" "no KV memory" "degenerate: the outcome is in the table"
check "degenerate: summary.json written" test -s "$TMP/out_degenerate/"*/summary.json
if /usr/bin/python3 -c "import matplotlib" >/dev/null 2>&1; then
  check "degenerate: no failing plot script" bash -c "! grep -q 'plots failed' '$TMP/degenerate.out'"
  check "degenerate: a plot that says why" test -s "$(ls "$TMP"/out_degenerate/*/kv_summary.png)"
fi

# A model profile's options without --model would go unused: refused before anything runs.
for opt in "--kv-cache-dtype fp8" "--graphs" "--layers 2" "--decode-batches 1,8" "--prefill-chunks 16,64"; do
  name=calibrate_needs_model_${opt%% *}; name=${name//-/}
  run "$name" calibrate --backend cuda $opt
  expect_rc "$name" 2
  expect_in "$TMP/$name.err" "${opt%% *} requires --model" "calibrate $opt without --model: says why"
done

# A profile's decode batches out of order or out of range: refused before any GPU work.
run decode_batches_order calibrate --backend cuda --model llama-3.1-8b --decode-batches 8,4
expect_rc decode_batches_order 2
expect_in "$TMP/decode_batches_order.err" "--decode-batches: batches must ascend (4 after 8)" \
  "calibrate --decode-batches 8,4: says which is out of order"
run decode_batches_range calibrate --backend cuda --model llama-3.1-8b --decode-batches 1,1024
expect_rc decode_batches_range 2
expect_in "$TMP/decode_batches_range.err" "--decode-batches: batch 1024 is outside 1..512" \
  "calibrate --decode-batches 1,1024: names the batch and the range"
run prefill_chunks_order calibrate --backend cuda --model llama-3.1-8b --prefill-chunks 16,512,384
expect_rc prefill_chunks_order 2
expect_in "$TMP/prefill_chunks_order.err" "--prefill-chunks: chunks must ascend (384 after 512)" \
  "calibrate --prefill-chunks 16,512,384: says which is out of order"
run prefill_chunks_range calibrate --backend cuda --model llama-3.1-8b --prefill-chunks 16,9000
expect_rc prefill_chunks_range 2
expect_in "$TMP/prefill_chunks_range.err" "--prefill-chunks: chunk 9000 is outside 1..8192" \
  "calibrate --prefill-chunks 16,9000: names the chunk and the range"

# calibrate --check of two runs' calls (no GPU needed): one run at about the model's time per map,
# one at 6x: per run 1 and 0 classes within 25%, the class beyond any model's reach, and pooled out.
for i in 1 2; do
  t=$([ "$i" = 1 ] && echo 1.6 || echo 10)
  { echo "strategy,primitive,handles,bytes,nodes,mappings,measured_us"
    for _ in $(seq 12); do echo "vmm_alias,map,1,2097152,0,0,$t"; done; } > "$TMP/calls$i.csv"
done
run check_calls calibrate --check "$TMP/calls1.csv" "$TMP/calls2.csv" --gpu "$GPU"
expect_rc check_calls 0
expect_in "$TMP/check_calls.out" "the 2 files as runs of one workload (1 classes)" \
  "calibrate --check: several files compared as runs"
expect_re "$TMP/check_calls.out" "within 25% of the model, per run: +1, 0" \
  "calibrate --check: per-run counts"
expect_in "$TMP/check_calls.out" "more than 5/3 of the fastest: 1 (no model puts these" \
  "calibrate --check: the class beyond any model's reach"
expect_in "$TMP/check_calls.out" "calls pooled over the runs: 0 of 1 within 25%" \
  "calibrate --check: pooled calls"

# calibrate --in-context re-fits a re-fit: the header keeps one level of "base: " (older in-context
# generations go, the isolated calibration's lines stay), so it stops growing; a primitive the
# fit leaves alone keeps its term and the comment on its line.
run refit1 calibrate --in-context "$TMP/calls1.csv" --gpu "$ROOT/configs/gpus/h200.yaml" \
  --out "$TMP/refit1.yaml"
expect_rc refit1 0
run refit2 calibrate --in-context "$TMP/calls2.csv" --gpu "$TMP/refit1.yaml" --out "$TMP/refit2.yaml"
run refit3 calibrate --in-context "$TMP/calls1.csv" --gpu "$TMP/refit2.yaml" --out "$TMP/refit3.yaml"
expect_rc refit3 0
check "calibrate --in-context: the header stops growing" \
  test "$(grep -c '^#' "$TMP/refit2.yaml")" -eq "$(grep -c '^#' "$TMP/refit3.yaml")"
check "calibrate --in-context: one level of base" bash -c "! grep -q 'base: base:' '$TMP/refit3.yaml'"
expect_in "$TMP/refit3.yaml" "# base: h200 calibrated by \`memsim calibrate --backend cuda" \
  "calibrate --in-context: the isolated calibration's provenance stays"
expect_re "$TMP/refit3.yaml" "host_free_pinned: .*# per byte: RL co-location on the GPU" \
  "calibrate --in-context: a term left alone keeps its comment"

# A config copied anywhere runs from any folder: gpu:, model: and the trace path resolve beside it,
# in its project, then in the installation (the binary's source tree), with no MEMSIM_ROOT.
mkdir -p "$TMP/elsewhere"
cp "$ROOT/experiments/kv_strategies.yaml" "$TMP/elsewhere/copied.yaml"
(cd / && exec env -u MEMSIM_ROOT "$MEMSIM" --config "$TMP/elsewhere/copied.yaml" \
  --set requests.trace.limit=20 --out "$TMP/out_copied" --no-plots) \
  > "$TMP/copied.out" 2> "$TMP/copied.err"
rc=$?
expect_rc copied 0
check "a copied config's results" test -s "$TMP/out_copied/kv_strategies/summary.json"
run unknown_gpu --config "$TMP/elsewhere/copied.yaml" --set gpu=h300 --out "$TMP/out_unknown"
expect_rc unknown_gpu 2
expect_re "$TMP/unknown_gpu.err" "\(--set gpu\): unknown gpus config 'h300' \(did you mean 'h100'\?\); known in .*/configs/gpus: h100, h200" \
  "an unknown GPU name lists the known ones"

# A model whose weights do not fit the GPU has no graphs to capture: said at the model: key.
run shapes_70b --config "$CONFIG" --set model=llama-3.1-70b --set gpu=h100 --out "$TMP/out_70b" \
  --no-plots
expect_rc shapes_70b 2
expect_in "$TMP/shapes_70b.err" "(--set model): the weights of llama-3.1-70b (131.42 GiB) do not fit the 79.18 GiB of h100" \
  "shapes: weights larger than the GPU"
expect_absent "$TMP/out_70b" "shapes_70b: no output"

# Tensor parallelism: the tp_memory experiment (per-rank rows, a point that does not fit as an
# outcome), a TP serving run (the rank's budget, the collectives in the step time), and the
# config errors that name the key and the field that does not split.
TPCONF=$ROOT/experiments/tp_memory.yaml
run tp_memory --config "$TPCONF" --out "$TMP/out_tp" --set models=[llama-3.1-70b] \
  --set gpus=[h100] --set 'tensor_parallel_sizes=[1, 2]' --set graph_memory=[shared_pool]
expect_rc tp_memory 0
expect_re "$TMP/tp_memory.out" "llama-3.1-70b +h100 +1 shared_pool .* the weights \(131.42 GiB\) do not fit" \
  "tp_memory: TP 1 of a 70B on an H100 does not fit, said"
expect_re "$TMP/tp_memory.out" "llama-3.1-70b +h100 +2 shared_pool +65.71 .* 0.90 +0.04 .* ok" \
  "tp_memory: TP 2 rank: 65.71 GiB of weights, NCCL 0.90 GiB, custom all-reduce 0.04 GiB"
check "tp_memory: ranks.csv has a row per rank (1 + 2) and a header" \
  test "$(wc -l < "$TMP/out_tp/tp_memory/ranks.csv")" -eq 4
expect_in "$TMP/out_tp/tp_memory/ranks.csv" "llama-3.1-70b,h100,2,shared_pool,1,0,70555025408," \
  "tp_memory: rank 1 reported with the shard's exact weight bytes"
run tp_split --config "$TPCONF" --out "$TMP/out_tp_split" --set 'tensor_parallel_sizes=[3]'
expect_rc tp_split 2
expect_in "$TMP/tp_split.err" "tensor_parallel_sizes[0]" "tp_memory: the bad size's key named"
expect_in "$TMP/tp_split.err" "heads (64) do not divide by tensor_parallel_size 3" \
  "tp_memory: the field that does not split named"
run tp_serving --config "$KVCONF" --out "$TMP/out_tp_serving" --set model=llama-3.1-70b \
  --set gpu=h200 --set parallel.tensor_parallel_size=4 --unset engine.kv_budget --no-plots
expect_rc tp_serving 0
expect_in "$TMP/tp_serving.out" "every term is one rank's of 4" "tp serving: the budget is a rank's"
expect_in "$TMP/tp_serving.out" \
  "roofline + collectives (NCCL 2.28.9 measured at 4 ranks (h200); custom all-reduce under 8 MiB measured at 4 ranks)" \
  "tp serving: the step time adds measured collectives, the custom all-reduce's under 8 MiB"
expect_in "$TMP/out_tp_serving/"*/summary.json '"tensor_parallel_size": 4' \
  "tp serving: summary.json says the figures are per rank"
run tp_pp --config "$KVCONF" --out "$TMP/out_tp_pp" --set parallel.pipeline_parallel_size=2 \
  --no-plots
expect_rc tp_pp 0
expect_in "$TMP/tp_pp.out" "each step split over 2 stages of 16+16 layers" \
  "pp serving: the step-time line says how steps are split"
expect_in "$TMP/out_tp_pp/"*/summary.json '"pipeline_parallel_size": 2' \
  "pp serving: summary.json records the stages"
run dp_serving --config "$KVCONF" --out "$TMP/out_dp" --set parallel.data_parallel_size=2 \
  --no-plots
expect_rc dp_serving 0
expect_in "$TMP/dp_serving.out" "data parallel: 2 engine replicas" "dp serving: the table says so"
expect_re "$TMP/dp_serving.out" "^    dp 1: [0-9]+ requests" "dp serving: one line per replica"
expect_in "$TMP/out_dp/"*/summary.json '"replicas": [' "dp serving: summary.json has the replicas"
run dp_node --config "$KVCONF" --out "$TMP/out_dp_node" --set parallel.data_parallel_size=16
expect_rc dp_node 2
expect_in "$TMP/dp_node.err" "data_parallel_size): tensor_parallel_size 1 x pipeline_parallel_size 1 x data_parallel_size 16" \
  "dp serving: replicas beyond the node refused, naming the key"
run pp_memory --config "$TPCONF" --out "$TMP/out_pp" --set models=[llama-3.1-70b] \
  --set gpus=[h100] --set 'tensor_parallel_sizes=[2]' --set 'pipeline_parallel_sizes=[2]' \
  --set graph_memory=[shared_pool]
expect_rc pp_memory 0
check "pp_memory: ranks.csv has a row per rank (2 stages x 2) and a header" \
  test "$(wc -l < "$TMP/out_pp/tp_memory/ranks.csv")" -eq 5
expect_in "$TMP/out_pp/tp_memory/ranks.csv" "llama-3.1-70b,h100,2,shared_pool,3,2,35277520896," \
  "pp_memory: rank 3 (stage 1, TP rank 1) with its stage's exact weight bytes"
run pp_node --config "$TPCONF" --out "$TMP/out_pp_node" --set 'tensor_parallel_sizes=[4]' \
  --set 'pipeline_parallel_sizes=[4]'
expect_rc pp_node 2
expect_in "$TMP/pp_node.err" "pipeline_parallel_sizes[0]" "pp_memory: the size beyond the node named"
expect_in "$TMP/pp_node.err" "16 ranks exceed the 8 GPUs of one h100 node" \
  "pp_memory: tp x pp against the node's GPUs"

echo "test_cli: $checks checks passed, $failures failed"
if [ "$failures" -ne 0 ]; then exit 1; fi
exit 0
