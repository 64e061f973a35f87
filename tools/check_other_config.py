#!/usr/bin/env python3
"""Checks that the forward pass follows config.json rather than the public golden config:
builds the generator's second configuration ("hidden": 9 layers, window 12, KV sources 2 and 5,
candidate blocks of 3, Engram on layers 1 and 2 — the second one a KV source) with
../shared/golden/tools/make_goldens.py, runs its independent NumPy implementation on the set's
three prompts, and writes OUT/model (checkpoint), OUT/gold/goldens.safetensors (logits, hash
ids, top-k, candidate masks, router experts) and OUT/in.json. Then run
  ds41 score --model OUT/model --tokenizer ../shared/tokenizer-v41 --input OUT/in.json \\
      --out OUT/out.safetensors --debug
  python3 ../shared/golden/tools/make_goldens.py compare OUT/gold OUT/out.safetensors

usage: check_other_config.py SHARED_DIR OUT   (needs numpy)"""
import json
import os
import sys

shared, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(shared, "golden", "tools"))
import numpy as np  # noqa: E402
import make_goldens as mg  # noqa: E402

art = mg.build_set("hidden", os.path.join(shared, "tokenizer-v41"), lambda *a: None)
d = os.path.join(out, "model")
os.makedirs(d, exist_ok=True)
json.dump(art["root"], open(os.path.join(d, "config.json"), "w"), indent=2)
mg.write_safetensors(os.path.join(d, "model.safetensors"), art["T"], {"format": "pt"})
gold, prompts = {}, {}
for i, ids in enumerate(art["prompts"]):
    ids = [int(x) for x in ids]
    prompts[f"prompt{i}"] = ids
    lg, tr = art["ref"].forward(ids)
    gold[f"prompt{i}.logits"] = ("F32", lg.astype(np.float32))
    gold[f"prompt{i}.engram_hash_ids"] = ("I32", tr["hash_ids"].astype(np.int32))
    for l, rec in enumerate(tr["layers"]):
        gold[f"prompt{i}.layer{l}.router_experts"] = ("I32", rec["router_idx"].astype(np.int32))
        if "index" in rec:
            gold[f"prompt{i}.layer{l}.topk_indices"] = ("I32", rec["index"]["sel"].astype(np.int32))
            if "cand" in rec["index"]:
                gold[f"prompt{i}.layer{l}.candidate_mask"] = ("U8", rec["index"]["cand"].astype(np.uint8))
os.makedirs(os.path.join(out, "gold"), exist_ok=True)
mg.write_safetensors(os.path.join(out, "gold", "goldens.safetensors"), gold, {"generator": "make_goldens NumPy ref"})
json.dump({"prompts": prompts}, open(os.path.join(out, "in.json"), "w"))
print("wrote", out, {k: len(v) for k, v in prompts.items()})
