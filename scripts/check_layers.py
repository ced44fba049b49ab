#!/usr/bin/env python3
"""Prints the include graph between graphfuse's folders and fails on a cycle or an upward edge.

The layers, lowest first; a folder may include its own layer's headers and those of layers
below it, never above:

  include     public headers (include/graphfuse)
  core        status, shapes, tensors, hashing, shared objects
  ops         the op table's semantics and float64 reference
  ir          graph, printer/parser, op schemas (type/shape inference)
  memory      the memory planner every backend shares
  passes      the pass pipeline
  cpu         the CPU backend (its kernels, executor, code generator)
  cuda        the CUDA backend (it runs host fallbacks on the CPU backend)
  runtime     targets by name (the one place that names the backends), input signatures
  onnx        ONNX import
  api         the embeddable API (include/graphfuse/model.h)
  testing     fixtures of the tools, tests and benchmarks (not in the library)

Usage: scripts/check_layers.py [ROOT] [--doc FILE [--write]]
  exit 1 on a violation, with each offending include; with --doc, also when FILE's block of this
  output (the fenced block after the line ending "Its output today:") differs from it (the
  ctest `layers` passes docs/ARCHITECTURE.md: its layer block is this output, not a copy by hand);
  --write puts this output into FILE's block instead of comparing
"""
import os
import re
import sys

LAYERS = ["include", "core", "ops", "ir", "memory", "passes", "cpu", "cuda", "runtime", "onnx", "api", "testing"]
RANK = {name: i for i, name in enumerate(LAYERS)}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(root, path):
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if parts[0] == "include":
        return "include"
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    return None


def resolve(root, src_file, inc):
    """The file an #include "inc" in src_file names, as the build's include path finds it."""
    for base in (os.path.dirname(src_file), os.path.join(root, "src"), os.path.join(root, "include")):
        p = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(p):
            return p
    return None


def doc_block(path):
    """The fenced block after the line that ends "Its output today:" in `path`, or None."""
    lines = open(path, encoding="utf-8").read().split("\n")
    for i, line in enumerate(lines):
        if line.rstrip().endswith("Its output today:"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            k = j + 1
            while k < len(lines) and not lines[k].startswith("```"):
                k += 1
            return "\n".join(lines[j + 1:k])
    return None


def write_block(path, text):
    """Replaces the fenced block after the line ending "Its output today:" in `path` with `text`."""
    lines = open(path, encoding="utf-8").read().split("\n")
    for i, line in enumerate(lines):
        if line.rstrip().endswith("Its output today:"):
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            k = j + 1
            while not lines[k].startswith("```"):
                k += 1
            lines[j + 1:k] = text.split("\n")
            open(path, "w", encoding="utf-8").write("\n".join(lines))
            return True
    return False


def main():
    args = sys.argv[1:]
    doc = None
    write = "--write" in args
    if write:
        args.remove("--write")
    if "--doc" in args:
        at = args.index("--doc")
        doc = args[at + 1]
        del args[at:at + 2]
    if doc:
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = check(args)
        sys.stdout.write(out.getvalue())
        want = doc_block(doc)
        got = out.getvalue().rstrip("\n")
        if write and rc == 0:
            if not write_block(doc, got):
                print(f"{doc}: no fenced block after a line ending 'Its output today:'", file=sys.stderr)
                return 1
            return 0
        if want is None:
            print(f"{doc}: no fenced block after a line ending 'Its output today:'", file=sys.stderr)
            return 1
        if want != got:
            import difflib
            print(f"{doc}: its layer block differs from this output (scripts/check_layers.py --doc {doc} --write "
                  "puts it there):", file=sys.stderr)
            for line in difflib.unified_diff(want.split("\n"), got.split("\n"), "doc", "check", lineterm=""):
                print(line, file=sys.stderr)
            return 1
        return rc
    return check(args)


def check(args):
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), ".."))
    edges = {}  # (from, to) -> [(file, include)]
    unknown = set()
    for top in ("src", "include"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith((".h", ".cc", ".def")):
                    continue
                path = os.path.join(dirpath, f)
                src = folder_of(root, path)
                if src not in RANK:
                    unknown.add(src)
                    continue
                with open(path, encoding="utf-8") as fh:
                    for inc in INCLUDE.findall(fh.read()):
                        target = resolve(root, path, inc)
                        if target is None:
                            continue  # a system or third-party header
                        dst = folder_of(root, target)
                        if dst is None or dst == src:
                            continue
                        edges.setdefault((src, dst), []).append((os.path.relpath(path, root), inc))
    print("folder include graph (from -> to: includes):")
    bad = []
    for (a, b), uses in sorted(edges.items(), key=lambda e: (RANK.get(e[0][0], 99), RANK.get(e[0][1], 99))):
        upward = RANK.get(b, 99) > RANK.get(a, 99)
        print(f"  {a:8s} -> {b:8s} {len(uses):3d}{'   UPWARD' if upward else ''}")
        if upward:
            bad.extend((a, b, f, inc) for f, inc in uses)
    sys.stdout.flush()
    cycles = sorted({tuple(sorted((a, b))) for (a, b) in edges if (b, a) in edges})
    for a, b in cycles:
        print(f"cycle: {a} <-> {b}", file=sys.stderr)
    for a, b, f, inc in bad:
        print(f"upward include: {f} ({a}) includes \"{inc}\" ({b})", file=sys.stderr)
    for u in sorted(x for x in unknown if x):
        print(f"folder src/{u} is in no layer: add it to LAYERS in {os.path.relpath(__file__, root)}", file=sys.stderr)
    if bad or cycles or any(unknown - {None}):
        return 1
    print(f"layers ok: {' -> '.join(LAYERS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
