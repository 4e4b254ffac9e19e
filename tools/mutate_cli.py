#!/usr/bin/env python3
"""Mutation testing of the memsim CLI end to end: mutates experiments/*.yaml (lines deleted,
duplicated, re-indented, truncated, keys misspelt, values replaced or scaled) and adds
--set overrides (real key paths with hostile values, misspelt paths), runs memsim on each with a
time and memory limit, and sorts the outcomes into classes:

mutation kinds: delete, duplicate, indent, dedent, truncate, swap-lines, garbage (bytes inserted),
key (misspelt), value (a hostile token), scale (a number times 0, 0.5, 2, 3, 10 or 100),
set-key (misspelt path), set-value (hostile token), set-number (a plain number).

  ran            exit 0 (the experiment ran; a run's out-of-memory is a reported outcome)
  run-failed     exit 1 (a run failed and said why)
  located-error  exit 2 with a config error naming the file and line, or the --set flag
  other-error    exit 2 with a message that names no file, line or flag   <- a finding
  crash          killed by a signal or an exit status memsim does not use <- a finding
  timeout        still running at the time limit (a valid but long experiment, or a hang)

Usage: tools/mutate_cli.py [--memsim build/memsim] [--runs 3000] [--seed 1] [--timeout 10]
                           [--mem-mib 4096] [--jobs 2] [--out DIR]
Prints the counts per class and per mutation kind, and every finding with the command that
reproduces it; writes DIR/outcomes.csv. Exit 1 when there is a finding."""
import argparse
import collections
import csv
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCATED = re.compile(r"config error: (--set |--sweep |\S+?(:\d+|\s+\(--set |\s+\(--sweep |: no YAML content))")
HOSTILE = ["-1", "0", "-0.5", "1e308", "nan", "inf", "18446744073709551616", "4294967297",
           "999999999999", "0.0000001", "''", '""', "[]", "{}", "[1, 2", "{a: 1}", "null", "~",
           "true", "yes", "abc", "1.5", "64KiB", "1TiB", "-3MiB", "12XB", "!!binary aGk=",
           "&a 1", "*a", "'\\x00'", "\u00e9t\u00e9", "1_000", "0x10", "1e3", "[[[]]]"]


def yaml_keys(lines):
    """Dotted key paths of the mapping keys in a YAML file, by indentation (keys inside list
    items are left out: --set paths name map keys)."""
    paths, stack = [], []  # stack: (indent, key or None for a list item)
    for line in lines:
        m = re.match(r"^(\s*)(- )?([A-Za-z_][\w.]*)\s*:", line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent + (2 if m.group(2) else 0):
            stack.pop()
        if m.group(2):
            stack.append((indent, None))
            indent += 2
        if all(k is not None for _, k in stack):
            paths.append(".".join([k for _, k in stack] + [m.group(3)]))
        stack.append((indent, m.group(3)))
    return paths


def misspell(word, rng):
    if len(word) < 2:
        return word + "x"
    i = rng.randrange(len(word))
    op = rng.choice(["drop", "swap", "dup"])
    if op == "drop":
        return word[:i] + word[i + 1:]
    if op == "swap" and i + 1 < len(word):
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    return word[:i] + word[i] + word[i:]


def scaled(number, rng):
    factor = rng.choice([0, 0.5, 2, 3, 10, 100])
    value = float(number) * factor
    return str(int(value)) if "." not in number else f"{value:g}"


def mutate_text(lines, rng):
    """One textual mutation of the YAML; returns (kind, new lines)."""
    lines = list(lines)
    body = [i for i, l in enumerate(lines) if l.strip() and not l.lstrip().startswith("#")]
    i = rng.choice(body)
    kind = rng.choice(["delete", "duplicate", "indent", "dedent", "truncate", "value", "key",
                       "garbage", "swap-lines", "scale", "scale"])
    if kind == "scale":  # a plausible value: a number in the file scaled, so the run goes on
        nums = [j for j in body if re.search(r":\s*-?\d", lines[j])]
        if nums:
            i = rng.choice(nums)
            lines[i] = re.sub(r"(:\s*)(-?\d+(\.\d+)?)",
                              lambda m: m.group(1) + scaled(m.group(2), rng), lines[i], count=1)
            return kind, lines
    if kind == "delete":
        del lines[i]
    elif kind == "duplicate":
        lines.insert(i, lines[i])
    elif kind == "indent":
        lines[i] = "  " + lines[i]
    elif kind == "dedent":
        lines[i] = lines[i][2:] if lines[i].startswith("  ") else lines[i].lstrip()
    elif kind == "truncate":
        cut = rng.randrange(sum(len(l) for l in lines) + 1)
        text = "".join(lines)[:cut]
        lines = [text]
    elif kind == "value":
        m = re.match(r"^(\s*(- )?[\w.]+\s*:\s*)(.*)$", lines[i].rstrip("\n"))
        if m and m.group(3).strip():
            lines[i] = m.group(1) + rng.choice(HOSTILE) + "\n"
        else:
            lines[i] = lines[i].rstrip("\n") + " " + rng.choice(HOSTILE) + "\n"
    elif kind == "key":
        m = re.match(r"^(\s*(- )?)([\w.]+)(\s*:.*)$", lines[i].rstrip("\n"))
        if m:
            lines[i] = m.group(1) + misspell(m.group(3), rng) + m.group(4) + "\n"
    elif kind == "garbage":
        junk = "".join(chr(rng.choice([0x7b, 0x7d, 0x5b, 0x5d, 0x3a, 0x2c, 0x26, 0x2a, 0x21,
                                       0x7c, 0x3e, 0x25, 0x40, 0x60, 0x22, 0x27, 0x09, 0x00,
                                       0xff, 0x41]))
                       for _ in range(rng.randint(1, 6)))
        pos = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:pos] + junk + lines[i][pos:]
    else:
        j = rng.choice(body)
        lines[i], lines[j] = lines[j], lines[i]
    return kind, lines


def mutate_set(lines, rng):
    """--set overrides: a real key path with a hostile value, or a misspelt path."""
    keys = yaml_keys(lines)
    out = []
    for _ in range(rng.randint(1, 2)):
        key = rng.choice(keys) if keys else "seed"
        if rng.random() < 0.25:
            parts = key.split(".")
            j = rng.randrange(len(parts))
            parts[j] = misspell(parts[j], rng)
            key = ".".join(parts)
            out.append(("set-key", f"{key}={rng.choice(['1', '2', 'x'])}"))
        elif rng.random() < 0.5:
            out.append(("set-value", f"{key}={rng.choice(HOSTILE)}"))
        else:
            out.append(("set-number", f"{key}={rng.choice(['1', '2', '7', '64', '1000', '0.9'])}"))
    return out


def limit_memory(mib):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (mib << 20, mib << 20))
        os.setsid()
    return apply


def classify(rc, stderr, timed_out):
    if timed_out:
        return "timeout"
    if rc == 0:
        return "ran"
    if rc == 1:
        return "run-failed"
    if rc == 2:
        return "located-error" if LOCATED.search(stderr) else "other-error"
    return "crash"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memsim", default=os.path.join(ROOT, "build", "memsim"))
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=10)
    ap.add_argument("--mem-mib", type=int, default=4096)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="memsim-mutate-")
    os.makedirs(out, exist_ok=True)
    # Mutated files live one level below the repository root, as experiments/ does, so their
    # relative paths (../tests/data/..., ../data/...) still resolve.
    work = tempfile.mkdtemp(prefix=".mutate-", dir=ROOT)
    experiments = sorted(f for f in os.listdir(os.path.join(ROOT, "experiments"))
                         if f.endswith(".yaml"))
    sources = {f: open(os.path.join(ROOT, "experiments", f), encoding="utf-8").readlines()
               for f in experiments}
    rng = random.Random(args.seed)
    cases = []
    for n in range(args.runs):
        name = rng.choice(experiments)
        lines = sources[name]
        sets = []
        if rng.random() < 0.5:
            kind, lines = mutate_text(lines, rng)
        else:
            kind = None
        if kind is None or rng.random() < 0.3:
            muts = mutate_set(lines, rng)
            sets = [s for _, s in muts]
            kind = (kind + "+" if kind else "") + muts[0][0]
        cases.append((n, name, kind, "".join(lines), sets))

    def run(case):
        n, name, kind, text, sets = case
        d = os.path.join(out, f"case{n}")
        os.makedirs(d, exist_ok=True)
        cfg = os.path.join(work, f"case{n}-{name}")
        with open(cfg, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        cmd = [args.memsim, "--config", cfg, "--no-plots", "--out", os.path.join(d, "out")]
        for s in sets:
            cmd += ["--set", s]
        env = dict(os.environ, MEMSIM_ROOT=ROOT)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                             cwd=ROOT, preexec_fn=limit_memory(args.mem_mib))
        timed_out = False
        try:
            so, err = p.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            so, err = p.communicate()
            timed_out = True
        err = err.decode("utf-8", "replace")
        # A failed run says why in its table (stdout): keep the first such line.
        why = [l.strip() for l in so.decode("utf-8", "replace").splitlines()
               if "error:" in l or "FAILED" in l]
        cls = classify(p.returncode, err, timed_out)
        if cls in ("ran", "run-failed", "located-error", "timeout"):
            shutil.rmtree(d, ignore_errors=True)
        else:  # keep the mutated file beside the finding, and name it in the command
            kept = os.path.join(d, name)
            shutil.copy(cfg, kept)
            cmd = [kept if c == cfg else c for c in cmd]
            cmd.insert(0, f"(cd {ROOT} &&")
            cmd.append(")")
        os.remove(cfg)
        last = err.strip().splitlines()[-1] if err.strip() else (why[-1] if why else "")
        return n, name, kind, cls, p.returncode, last, cmd

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run, cases))
    shutil.rmtree(work, ignore_errors=True)
    by_class = collections.Counter(r[3] for r in results)
    by_kind = collections.defaultdict(collections.Counter)
    for r in results:
        by_kind[r[2].split("+")[0]][r[3]] += 1
    with open(os.path.join(out, "outcomes.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "experiment", "mutation", "class", "exit", "message"])
        for r in results:
            w.writerow(r[:6])
    classes = ["ran", "run-failed", "located-error", "other-error", "crash", "timeout"]
    print(f"{len(results)} runs (seed {args.seed}, {args.timeout:g} s and {args.mem_mib} MiB each):")
    print("  " + ", ".join(f"{c} {by_class[c]}" for c in classes))
    print(f"  {'mutation':<14}" + "".join(f"{c:>15}" for c in classes))
    for k in sorted(by_kind):
        print(f"  {k:<14}" + "".join(f"{by_kind[k][c]:>15}" for c in classes))
    findings = [r for r in results if r[3] in ("other-error", "crash")]
    for r in findings[:40]:
        print(f"FINDING {r[3]} (exit {r[4]}) {r[1]} [{r[2]}]: {r[5][:200]}")
        print("   " + " ".join(repr(c) if " " in c else c for c in r[6]))
    print(f"outcomes: {os.path.join(out, 'outcomes.csv')}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
