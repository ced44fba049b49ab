#!/usr/bin/env python3
"""Device memory of `graphfuse demo --backend cuda` plans against what they hold without reuse.

usage: bench/gpu_memory_check.py DEMO.json...

For every CUDA plan a demo JSON records (its "cuda" rows: device_bytes, activation_bytes,
activation_bytes_no_reuse), prints the device memory held, the activations and scratch as
planned (values that share blocks by liveness) beside the sum of those buffers without reuse,
and the block's weights in the plan's dtype (hidden / ffn / family from the JSON's config, as
src/testing/blocks.cc draws them). Exits 1 when a plan holds more activation bytes than its
buffers add up to without reuse, or less device memory than its weights and activations need.
"""
import json
import sys

SIZE = {"f32": 4, "bf16": 2, "f16": 2}


def weight_count(preset, c):
    d, f = c["hidden"], c["ffn"]
    if preset.startswith("llama"):
        return 4 * d * d + 3 * d * f + 2 * d  # q, k, v, o; gate, up, down; two RMSNorm scales
    return 4 * (d * d + d) + (d * f + f) + (f * d + d) + 4 * d  # biased projections, two LayerNorms


def main(paths):
    bad = 0
    print(f"{'json':34} {'plan':22} {'dtype':5} {'device MB':>10} {'weights MB':>10} {'act MB':>9} "
          f"{'no reuse MB':>11} {'reuse':>6}")
    for path in paths:
        try:
            j = json.load(open(path))
        except (OSError, ValueError) as e:
            print(f"{path}: {e}")
            bad = 1
            continue
        dt = j.get("dtype", "f32")
        weights = weight_count(j["preset"], j["config"]) * SIZE[dt]
        for r in j.get("cuda", []):
            dev, act, flat = r["device_bytes"], r["activation_bytes"], r["activation_bytes_no_reuse"]
            ok = act <= flat and dev >= weights + act
            bad |= not ok
            print(f"{path.split('/')[-1][:34]:34} {r['plan']:22} {dt:5} {dev / 1e6:10.1f} {weights / 1e6:10.1f} "
                  f"{act / 1e6:9.2f} {flat / 1e6:11.2f} {act / flat if flat else 1:6.2f}{'' if ok else '  WRONG'}")
    print("(reuse = activations as planned / their buffers without reuse; WRONG: more than without reuse,"
          " or device memory below weights + activations)")
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) if len(sys.argv) > 1 else (print(__doc__), 2)[1])
