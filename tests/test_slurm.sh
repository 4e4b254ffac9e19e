#!/usr/bin/env bash
# memsim sweep on a real Slurm cluster: starts a one-node cluster on localhost (munge + slurmctld
# + slurmd from Debian's packages, installed when missing and running as root), submits a 4-task
# job array of a small grid with `memsim sweep --slurm --submit`, waits, merges the shards and
# compares sweep.csv with the same grid run locally (identical rows). Exits 77 (skipped) where
# Slurm cannot be installed or started.
# Usage: test_slurm.sh /path/to/memsim   (MEMSIM_SOURCE_ROOT: the source tree)
set -u

MEMSIM=$1
case $MEMSIM in /*) ;; *) MEMSIM=$PWD/$MEMSIM ;; esac
ROOT=${MEMSIM_SOURCE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
skip() {
  echo "test_slurm: skipped: $*"
  exit 77
}
fail() {
  echo "test_slurm: FAIL: $*" >&2
  for f in "$T"/slurmctld.log "$T"/slurmd.log "$T"/out/*-sweep/slurm-*.out; do
    [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }
  done
  exit 1
}

if ! command -v sbatch >/dev/null || ! command -v slurmctld >/dev/null ||
  ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  [ "$(id -u)" -eq 0 ] || skip "Slurm is not installed and installing it needs root"
  command -v apt-get >/dev/null || skip "Slurm is not installed and there is no apt-get"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null 2>&1; } ||
    skip "apt-get could not install slurmctld slurmd slurm-client munge"
fi
[ "$(id -u)" -eq 0 ] || skip "starting slurmd needs root"

T=$(mktemp -d "${TMPDIR:-/tmp}/memsim_slurm.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
mkdir -p "$T/state" "$T/spool" "$T/munge"
chmod 700 "$T/munge"

# munge with its own key and socket (leaves any system munged alone).
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$T/munge/munge.key"
munged --force --key-file="$T/munge/munge.key" --socket="$T/munge/munge.sock" \
  --pid-file="$T/munge/munged.pid" --log-file="$T/munge/munged.log" \
  --seed-file="$T/munge/munged.seed" || skip "munged did not start"
sleep 0.3
[ -f "$T/munge/munged.pid" ] && PIDS+=("$(cat "$T/munge/munged.pid")")

HOST=$(hostname -s)
CPUS=$(nproc)
PORT=$((20000 + RANDOM % 20000))
cat > "$T/slurm.conf" <<EOF
ClusterName=memsimtest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$T/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=test Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$T/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" >"$T/slurmctld.stdout" 2>&1 &
PIDS+=($!)
slurmd -D -f "$SLURM_CONF" -N "$HOST" >"$T/slurmd.stdout" 2>&1 &
PIDS+=($!)
ready=0
for _ in $(seq 1 60); do
  if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
    ready=1
    break
  fi
  sleep 0.5
done
[ "$ready" -eq 1 ] || skip "the one-node cluster did not come up ($(sinfo -h -o %t 2>&1 | head -1))"

# The grid: experiments/sweep_grid.yaml without its grid, 2 x 4 points from flags.
sed '/^grid:/,$d' "$ROOT/experiments/sweep_grid.yaml" > "$T/grid.yaml"
AXES=(--sweep kv.block_size=8,128 --sweep requests.arrival.rate=5,20,40,60)
cd "$T" || fail "cd $T"
export MEMSIM_ROOT=$ROOT
"$MEMSIM" sweep --config "$T/grid.yaml" --out "$T/out" --slurm --submit --tasks 4 -j 1 \
  "${AXES[@]}" > "$T/submit.out" 2>&1 || { cat "$T/submit.out" >&2; fail "sweep --slurm --submit"; }
grep -q "Submitted batch job" "$T/submit.out" || fail "no job submitted: $(cat "$T/submit.out")"
for _ in $(seq 1 240); do
  [ -z "$(squeue -h 2>/dev/null)" ] && break
  sleep 0.5
done
[ -z "$(squeue -h 2>/dev/null)" ] || fail "the array did not finish in 120 s"
ls "$T"/out/sweep_grid-sweep/slurm-*.out >/dev/null 2>&1 || fail "no array task output"
tasks=$(ls "$T"/out/sweep_grid-sweep/slurm-*.out | wc -l)
[ "$tasks" -eq 4 ] || fail "$tasks array tasks ran, expected 4"
"$MEMSIM" merge "$T/out/sweep_grid-sweep" > "$T/merge.out" 2>&1 || fail "merge: $(cat "$T/merge.out")"
grep -q "8 of 8 points complete" "$T/merge.out" || fail "merge: $(cat "$T/merge.out")"
"$MEMSIM" sweep --config "$T/grid.yaml" --out "$T/local" -j 2 --no-progress "${AXES[@]}" \
  > "$T/local.out" 2>&1 || fail "local sweep: $(tail -3 "$T/local.out")"
cmp -s "$T/out/sweep_grid-sweep/sweep.csv" "$T/local/sweep_grid-sweep/sweep.csv" ||
  fail "the array's sweep.csv differs from the local one"
echo "test_slurm: a 4-task Slurm array ran the 8-point grid; merged sweep.csv equals the local run"
exit 0
