#!/usr/bin/env python3
"""Kernels per run of the transformers corpus (tests/models/hf), as a Markdown table.

Reads the report the corpus test writes (build/corpus_report.txt, from
`build/tests/onnx_tests --gtest_filter='HfCorpus*'`): per model, each data set's signature,
kernels unfused -> fused and planning time. Prints one row per model directory family
(model, exporter) with the static, dynamic and KV-cache variants side by side: fused kernels
(unfused in brackets), the range over data sets where they differ.

    python3 bench/corpus_table.py [build/corpus_report.txt]
"""
import collections
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"^\s+test_data_set_\d+ .*?(\d+) ->\s+(\d+) kernels, planned in ([\d.]+) ms")


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "corpus_report.txt")
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
    table = collections.OrderedDict()
    for name, sets in runs.items():
        m = re.match(r"(.+)_(ts|dynamo)_(static|dynamic|kv)$", name)
        if not m:
            continue
        if not sets:
            table.setdefault((m.group(1), m.group(2)), {})[m.group(3)] = "fails"
            continue
        fused = sorted({s[1] for s in sets})
        unfused = sorted({s[0] for s in sets})
        cell = "%s (%s)" % ("-".join(map(str, [fused[0], fused[-1]] if len(fused) > 1 else fused)),
                            "-".join(map(str, [unfused[0], unfused[-1]] if len(unfused) > 1 else unfused)))
        table.setdefault((m.group(1), m.group(2)), {})[m.group(3)] = cell
    print("| model | exporter | static | dynamic | KV cache |")
    print("|---|---|---:|---:|---:|")
    for (model, exporter), cells in table.items():
        print("| %s | %s | %s | %s | %s |" % (model, exporter, cells.get("static", "-"), cells.get("dynamic", "-"),
                                             cells.get("kv", "-")))


if __name__ == "__main__":
    main()
