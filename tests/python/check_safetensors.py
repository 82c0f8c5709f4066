#!/usr/bin/env python3
"""Interop: open every rank file of a shardopt checkpoint with the `safetensors` library and check
names, dtypes (BF16 for bf16 momentum), shapes and values against the report the saving run wrote
from the runtime's memory. numpy has no bfloat16, so BF16 tensors are read through
safetensors.deserialize and widened here; F32 ones also through safe_open(framework="numpy").

usage: check_safetensors.py STEP_DIR REPORT_DIR
"""
import glob
import json
import os
import sys

import numpy as np
import safetensors
from safetensors import safe_open


def main():
    step_dir, report_dir = sys.argv[1], sys.argv[2]
    files = sorted(glob.glob(os.path.join(step_dir, "rank-*.safetensors")))
    assert files, f"no rank files in {step_dir}"
    checked = bf16 = 0
    for path in files:
        rank = os.path.basename(path)[len("rank-"):-len(".safetensors")]
        with open(os.path.join(report_dir, f"report-rank-{rank}.json")) as f:
            want = {t["name"]: t for t in json.load(f)["tensors"]}
        with open(path, "rb") as f:
            raw = {name: t for name, t in safetensors.deserialize(f.read())}
        assert set(raw) == set(want), f"{path}: names {sorted(set(raw) ^ set(want))} differ"
        with safe_open(path, framework="numpy") as sf:
            meta = sf.metadata()
            assert "shardopt" in meta, f"{path}: no shardopt metadata"
            for name, t in raw.items():
                w = want[name]
                assert t["dtype"] == w["dtype"], f"{path}: {name}: {t['dtype']} != {w['dtype']}"
                assert list(t["shape"]) == w["shape"], f"{path}: {name}: shape {t['shape']}"
                data = bytes(t["data"])
                if t["dtype"] == "BF16":
                    vals = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
                    bf16 += 1
                else:
                    vals = np.frombuffer(data, np.float32)
                    assert np.array_equal(sf.get_tensor(name).ravel(), vals)
                assert np.array_equal(vals, np.array(w["values"], np.float32)), f"{path}: {name}: values"
                checked += 1
    print(f"check_safetensors: {len(files)} files, {checked} tensors ({bf16} BF16) match, "
          f"safetensors {safetensors.__version__}")
    assert bf16 > 0, "expected bf16 momentum tensors"


if __name__ == "__main__":
    main()
