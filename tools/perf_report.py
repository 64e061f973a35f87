#!/usr/bin/env python3
"""ds41 tools/perf_report.py: markdown tables for docs/perf/ from the GPU benchmarks' JSON.

    perf_report.py decode DECODE.json            per run: step time, per layer kind time / bytes /
                                                 roofline ratio, the byte terms of each layer
    perf_report.py kernels KERNELS.json [LABEL]  per kernel shape: time, GB/s, roofline ratio
    perf_report.py ncu NCU.csv STEPS             per kernel name: launches and time per step
    perf_report.py ncu-compare A.csv B.csv [STEPS_A STEPS_B]
                                                 per kernel name: us per launch and per step in A
                                                 and B (two runs of the same step), B - A

DECODE.json is `ds41 bench decode --json`-style output (ds41 bench decode prints JSON), KERNELS.json
`ds41 bench kernels --json`, NCU.csv `ncu --metrics gpu__time_duration.sum --csv` of STEPS timed
steps (the bench brackets them with cudaProfilerStart/Stop); a .csv.gz is read as well. Only the
standard library."""
import collections
import csv
import gzip
import json
import sys


def decode(path):
    d = json.load(open(path))
    out = []
    for r in d["runs"]:
        out.append(f"### batch {r['batch']}, context {r['context']}: {r['step_ms_median']:.3f} ms per step\n")
        out.append("| layer kind | ms | bytes that must be read | roofline ratio |")
        out.append("|---|---|---|---|")
        for k, v in r["per_kind"].items():
            out.append(f"| {k} | {v['ms']:.3f} | {v['bytes'] / 1e6:.1f} MB | {v['roofline_ratio']:.2f} |")
        out.append("")
        terms = sorted({t for L in r["layers"] for t in L["bytes"]})
        out.append("| layer | kind | ms | " + " | ".join(terms) + " | ratio |")
        out.append("|---" * (len(terms) + 4) + "|")
        for L in r["layers"]:
            cells = [f"{L['bytes'].get(t, 0) / 1e6:.2f} MB" for t in terms]
            out.append(f"| {L['layer']} | {L['kind']} | {L['ms']:.3f} | " + " | ".join(cells) +
                       f" | {L['roofline_ratio']:.2f} |")
        out.append("")
        if "speculative" in r:
            out.append("DSpark (same run): `" + json.dumps(r["speculative"]) + "`\n")
    return "\n".join(out)


def kernels(path, label=""):
    d = json.load(open(path))
    out = [f"| kernel{(' (' + label + ')') if label else ''} | format | out x in | n | us | GB/s | roofline ratio |",
           "|---|---|---|---|---|---|---|"]
    for r in d["results"]:
        out.append(f"| {r['name']} | {r['format']} | {r['out']} x {r['in']} | {r['n']} | {r['ours_us']:.1f} | "
                   f"{r['ours_gbs']:.0f} | {r['roofline_ratio']:.2f} |")
    return "\n".join(out)


def ncu_agg(path):
    """Kernel name -> [launches, us] of an ncu gpu__time_duration CSV (plain or .gz)."""
    agg = collections.defaultdict(lambda: [0, 0.0])
    header = None
    f = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    for row in csv.reader(f):
        if "Kernel Name" in row:
            header = row
            continue
        if not header or len(row) != len(header):
            continue
        d = dict(zip(header, row))
        if d.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = d["Kernel Name"].split("(")[0].replace("void ", "")
        lt = name.find("<")
        base, targs = (name[:lt], name[lt:]) if lt >= 0 else (name, "")
        name = (base.split("::")[-1] + targs).replace("<unnamed>::", "").replace("ds41::cuda::", "").replace("tcg::", "").replace("dev::", "")
        v = float(d["Metric Value"].replace(",", ""))
        unit = d.get("Metric Unit", "")
        v = v / 1000 if unit in ("ns", "nsecond") else (v * 1000 if unit in ("ms", "msecond") else v)
        agg[name][0] += 1
        agg[name][1] += v
    return agg


def ncu_compare(path_a, path_b, steps_a=1, steps_b=1):
    a, b = ncu_agg(path_a), ncu_agg(path_b)
    ta, tb = sum(v[1] for v in a.values()) / steps_a, sum(v[1] for v in b.values()) / steps_b
    out = [f"kernel time per step: A {ta:.1f} us, B {tb:.1f} us ({tb - ta:+.1f} us)\n",
           "| kernel | launches per step A / B | us per launch A / B | us per step A / B | B - A us per step |",
           "|---|---|---|---|---|"]
    zero = [0, 0.0]
    for k in sorted(set(a) | set(b), key=lambda k: -max(a.get(k, zero)[1] / steps_a, b.get(k, zero)[1] / steps_b)):
        x, y = a.get(k, zero), b.get(k, zero)
        out.append(f"| `{k[:70]}` | {x[0] / steps_a:.0f} / {y[0] / steps_b:.0f} | "
                   f"{x[1] / max(x[0], 1):.1f} / {y[1] / max(y[0], 1):.1f} | {x[1] / steps_a:.1f} / {y[1] / steps_b:.1f} | "
                   f"{y[1] / steps_b - x[1] / steps_a:+.1f} |")
    return "\n".join(out)


def ncu(path, steps):
    agg = ncu_agg(path)
    total = sum(v[1] for v in agg.values())
    out = [f"kernel time {total / steps:.1f} us per step, {sum(v[0] for v in agg.values()) / steps:.0f} launches per step\n",
           "| kernel | launches per step | us per launch | us per step | share |", "|---|---|---|---|---|"]
    for k, v in sorted(agg.items(), key=lambda x: -x[1][1]):
        out.append(f"| `{k[:70]}` | {v[0] / steps:.0f} | {v[1] / max(v[0], 1):.1f} | {v[1] / steps:.1f} | "
                   f"{100 * v[1] / total:.1f} % |")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    what = sys.argv[1]
    if what == "decode":
        print(decode(sys.argv[2]))
    elif what == "kernels":
        print(kernels(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""))
    elif what == "ncu":
        print(ncu(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1))
    elif what == "ncu-compare" and len(sys.argv) >= 4:
        steps = [int(x) for x in sys.argv[4:6]] + [1, 1]
        print(ncu_compare(sys.argv[2], sys.argv[3], steps[0], steps[1] if len(sys.argv) > 5 else steps[0]))
    else:
        sys.exit(__doc__)
