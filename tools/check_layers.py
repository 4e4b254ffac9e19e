#!/usr/bin/env python3
"""The house rules CI checks (issue 30): includes point down the layers and no two folders
include each other; no source file over 800 lines; no function over 120 lines.

Layers, bottom to top (a file may include its own layer and the ones below):
  core                      clock, event queue, metrics: the engine core
  kernels                   CUDA kernels and their plans
  backends                  the Backend interface, SimBackend, CudaBackend
  workload                  requests, snapshots, model shapes, programs, step time
  src/config                typed YAML access, loaders, the registry template
  src/alloc src/saver src/graph src/kv     strategies (role interfaces + registries)
  src/drivers src/serve src/rl src/exec    experiment drivers
  src/app                   the command line, experiments, writers
bench/, fuzz/ and tests/ sit on top. Usage: tools/check_layers.py [ROOT]; exit 1 on a finding.
"""
import os
import re
import sys

LAYERS = [
    ["core"], ["kernels"], ["backends"], ["workload"], ["src/config"],
    ["src/alloc", "src/saver", "src/graph", "src/kv"],
    ["src/drivers", "src/serve", "src/rl", "src/exec"],
    ["src/app"],
]
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 120
SOURCES = (".h", ".cpp", ".cu", ".cuh")


def folder_of(path):
    for layer in LAYERS:
        for folder in layer:
            if path == folder or path.startswith(folder + "/"):
                return folder
    return None


def layer_of(folder):
    for i, layer in enumerate(LAYERS):
        if folder in layer:
            return i
    return None


def functions_over(lines, limit):
    """Top-level function bodies longer than `limit` lines: a definition starting at column 0
    (its signature on one line, or continued over the next lines up to the one ending in '{'),
    closed by a '}' at column 0."""
    out = []
    start = None
    name = ""
    signature = None  # first line of a column-0 signature still open (no '{' or ';' yet)
    for i, line in enumerate(lines):
        if start is not None:
            if line.startswith("}"):
                if i - start + 1 > limit:
                    out.append((start + 1, i - start + 1, name))
                start = None
            continue
        top = re.match(r"^[A-Za-z]", line) and \
            not re.match(r"^(namespace|struct|class|enum|union|extern|template|using|typedef)\b",
                         line)
        if top and re.search(r"\)\s*(const)?\s*(noexcept)?\s*(override)?\s*\{\s*$", line):
            start, name, signature = i, line.strip(), None
        elif top and "(" in line and not line.rstrip().endswith((";", "}")):
            signature = i
        elif signature is not None:
            text = line.rstrip()
            if text.endswith("{") and not text.lstrip().startswith(("{", "//")):
                start, name, signature = signature, lines[signature].strip(), None
            elif text.endswith(";") or text.endswith("}") or not text.startswith((" ", "\t")):
                signature = None
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.abspath(root)
    findings = []
    edges = {}
    for top in ["core", "kernels", "backends", "workload", "src", "bench", "fuzz", "tests"]:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
                if len(lines) - 1 > MAX_FILE_LINES:
                    findings.append(f"{rel}: {len(lines) - 1} lines (at most {MAX_FILE_LINES})")
                for line_no, length, name in functions_over(lines, MAX_FUNCTION_LINES):
                    findings.append(f"{rel}:{line_no}: a function of {length} lines (at most "
                                    f"{MAX_FUNCTION_LINES}): {name}")
                src = folder_of(rel)
                if src is None:
                    continue
                for n, line in enumerate(lines, 1):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m:
                        continue
                    dst = folder_of(m.group(1))
                    if dst is None or dst == src:
                        continue
                    edges.setdefault((src, dst), f"{rel}:{n}")
                    if layer_of(dst) > layer_of(src):
                        findings.append(f"{rel}:{n}: {src} includes {m.group(1)}, a layer above")
    for (a, b), where in sorted(edges.items()):
        if (b, a) in edges and a < b:
            findings.append(f"{a} and {b} include each other ({where}, {edges[(b, a)]})")
    for f in findings:
        print(f)
    print(f"check_layers: {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
