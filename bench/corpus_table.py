#!/usr/bin/env python3
"""Kernels per run of the transformers corpus (tests/models/hf), as a Markdown table.

Reads the report the corpus test writes (build/corpus_report.txt, from
`build/tests/onnx_tests --gtest_filter='HfCorpus*'`): per model, each data set's signature,
kernels unfused -> fused and planning time. Prints one row per model directory family
(model, exporter, attention: transformers' default, which is sdpa where the class has it, or
eager, side by side) with the static, dynamic and KV-cache variants: fused kernels (unfused in
brackets), the range over data sets where they differ.

    python3 bench/corpus_table.py [build/corpus_report.txt] [--compact]

--compact: one row per (model, exporter), each cell the most fused kernels over the data sets,
the default export's then the eager one's ("11 / 11"; "-" where there is no such export).
"""
import collections
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"^\s+test_data_set_\d+ .*?(\d+) ->\s+(\d+) kernels, planned in ([\d.]+) ms")


def main():
    args = [a for a in sys.argv[1:] if a != "--compact"]
    compact = "--compact" in sys.argv[1:]
    path = args[0] if args else os.path.join(ROOT, "build", "corpus_report.txt")
    runs = collections.OrderedDict()
    name = None
    for line in open(path):
        if not line.startswith(" "):
            name = line.split(":")[0].strip()
            runs[name] = []
            continue
        m = LINE.match(line)
        if m and name:
            runs[name].append((int(m.group(1)), int(m.group(2)), float(m.group(3))))
    if compact:
        most = {}
        for name, sets in runs.items():
            m = re.match(r"(.+?)(_sdpa)?_(ts|dynamo|dynamo23|dynamo24)_(static|dynamic|kv)$", name)
            if m and sets:
                most.setdefault((m.group(1), m.group(3)), {})[(m.group(4), bool(m.group(2)))] = max(s[1] for s in sets)
        print("| model | exporter | static | dynamic | KV cache |")
        print("|---|---|---:|---:|---:|")
        for (model, exporter), cells in sorted(most.items()):
            row = []
            for v in ("static", "dynamic", "kv"):
                d, e = cells.get((v, True), "-"), cells.get((v, False), "-")
                row.append("-" if d == "-" and e == "-" else f"{d} / {e}")
            print("| %s | %s | %s |" % (model, exporter, " | ".join(row)))
        return
    table = {}
    for name, sets in runs.items():
        m = re.match(r"(.+?)(_sdpa)?_(ts|dynamo|dynamo23|dynamo24)_(static|dynamic|kv)$", name)
        if not m:
            continue
        key = (m.group(1), m.group(3), "default" if m.group(2) else "eager")
        if not sets:
            table.setdefault(key, {})[m.group(4)] = "fails"
            continue
        fused = sorted({s[1] for s in sets})
        unfused = sorted({s[0] for s in sets})
        cell = "%s (%s)" % ("-".join(map(str, [fused[0], fused[-1]] if len(fused) > 1 else fused)),
                            "-".join(map(str, [unfused[0], unfused[-1]] if len(unfused) > 1 else unfused)))
        table.setdefault(key, {})[m.group(4)] = cell
    print("| model | exporter | attention | static | dynamic | KV cache |")
    print("|---|---|---|---:|---:|---:|")
    for (model, exporter, attn) in sorted(table, key=lambda k: (k[0], k[1], k[2] != "default")):
        cells = table[(model, exporter, attn)]
        print("| %s | %s | %s | %s | %s | %s |" % (model, exporter, attn, cells.get("static", "-"),
                                                  cells.get("dynamic", "-"), cells.get("kv", "-")))

if __name__ == "__main__":
    main()
