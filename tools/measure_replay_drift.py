#!/usr/bin/env python3
"""Measures how far the two bounded-replay approximations (MODEL_SPEC 4.4 decoder replay,
4.5 encoder replay) move the logits from the exact path, with `ds41 score` on the public golden
model. Prints a Markdown table (the numbers in docs/replay_drift.md come from this script).

usage: measure_replay_drift.py DS41_BINARY SHARED_DIR [--threads N]
Needs numpy (Debian python3-numpy)."""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        dt = {"F32": np.float32, "I32": np.int32, "U8": np.uint8}[v["dtype"]]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=dt).reshape(v["shape"])
    return out


def random_prompt(n, seed, vocab=2048):
    rng = np.random.default_rng(seed)
    v = [0]
    while len(v) < n:
        if len(v) > 20 and rng.random() < 0.2:
            b = int(rng.integers(0, len(v) - 10))
            v.extend(v[b:b + 6])
        else:
            v.append(int(rng.integers(3, vocab)))
    return v[:n]


def metrics(ref, got):
    ref = ref.astype(np.float64)
    got = got.astype(np.float64)
    d = np.abs(ref - got).max()
    lp = ref - ref.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    lq = got - got.max(-1, keepdims=True)
    lq = lq - np.log(np.exp(lq).sum(-1, keepdims=True))
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    top1 = (ref.argmax(-1) == got.argmax(-1)).mean()
    return d, kl.mean(), kl.max(), top1


def main():
    exe, shared = sys.argv[1], sys.argv[2]
    threads = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "2"
    model = os.path.join(shared, "golden", "v41-tiny-public")
    tok = os.path.join(shared, "tokenizer-v41")
    man = json.load(open(os.path.join(model, "manifest.json")))
    gold = read_st(os.path.join(model, "goldens.safetensors"))
    cases = [("golden prompt2", man["prompts"]["prompt2"], gold["decode.input_ids"].tolist())]
    for n, seed in ((600, 1), (1200, 2)):
        ids = random_prompt(n + 32, seed)
        cases.append((f"random {n}", ids[:n], ids[n:]))
    tmp = tempfile.mkdtemp(prefix="ds41-replay-")
    print("| prompt | variant | rows compared | max abs dlogit | mean KL | max KL | top-1 agreement |")
    print("|---|---|---|---|---|---|---|")
    for name, prompt, dec in cases:
        S = len(prompt)
        inp = os.path.join(tmp, "in.json")
        json.dump({"prompts": {"p": prompt}, "decode": {"after": "p", "input_ids": dec}}, open(inp, "w"))

        def score(extra, tag):
            out = os.path.join(tmp, tag + ".safetensors")
            subprocess.run([exe, "score", "--model", model, "--tokenizer", tok, "--input", inp, "--out", out,
                            "--threads", threads] + extra, check=True)
            return read_st(out)

        exact = score([], "exact")
        dr = score(["--replay", "decoder"], "dec")
        # Decoder replay: the last prompt row and every decode step (the following positions).
        ref = np.concatenate([exact["p.logits"][S - 1:], exact["decode.logits"]])
        got = np.concatenate([dr["p.logits"][S - 1:], dr["decode.logits"]])
        d, klm, klx, t1 = metrics(ref, got)
        print(f"| {name} ({S}) | decoder replay (4.4) | {len(ref)} | {d:.3g} | {klm:.3g} | {klx:.3g} | {t1:.3f} |")
        for H in (S // 2, S - 1):
            er = score(["--replay", f"encoder:{H}"], "enc")
            ref = np.concatenate([exact["p.logits"][H:], exact["decode.logits"]])
            got = np.concatenate([er["p.logits"][H:], er["decode.logits"]])
            d, klm, klx, t1 = metrics(ref, got)
            print(f"| {name} ({S}) | encoder replay (4.5), H = {H} | {len(ref)} | {d:.3g} | {klm:.3g} | {klx:.3g} | "
                  f"{t1:.3f} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
