#!/usr/bin/env python3
"""Interop: open every rank file of a shardopt checkpoint with the `safetensors` library and check
names, dtypes (BF16 for bf16 momentum), shapes and values against the report the saving run wrote
from the runtime's memory. numpy has no bfloat16, so BF16 tensors are read through
safetensors.deserialize and widened here; F32 ones also through safe_open(framework="numpy").

With ckpt_weights (REPORT_DIR/report-weights.json, every parameter whole as the saving ranks held
it in memory): index.json says format_version 4 and "weights": true, and each parameter is
reassembled from its index record (name, global shape) and the writers' shard records
(rank-NNNNN.index.json: each shard's file, offset and shape, CRC-checked against its record),
reading the tensor of the parameter's own name from each rank file, and must equal the report.

usage: check_safetensors.py STEP_DIR REPORT_DIR
"""
import glob
import json
import os
import sys

import numpy as np
import safetensors
from safetensors import safe_open


def widen(t):
    """A deserialized tensor's values as float32 (BF16 widened)."""
    data = bytes(t["data"])
    if t["dtype"] == "BF16":
        return (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(data, np.float32)


def crc32c(data):
    """CRC-32C (Castagnoli), bit by bit: the index files are small."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def check_weights(step_dir, report_dir):
    """Every parameter reassembled from the index and the rank files; returns how many."""
    with open(os.path.join(report_dir, "report-weights.json")) as f:
        want = json.load(f)
    with open(os.path.join(step_dir, "index.json")) as f:
        index = json.load(f)
    assert index["format_version"] == 4 and index["weights"] is True, "no weights in the index"
    tensors = {t["name"]: dict(t, shards=[]) for t in index["tensors"]}
    # format_version 4: each writer's shard records are in its own rank-NNNNN.index.json, whose
    # integrity record (the CRC-32C of its bytes) is checked here too
    for w in range(index["writers"]):
        path = os.path.join(step_dir, f"rank-{w:05d}.index.json")
        with open(path, "rb") as f:
            text = f.read()
        with open(path + ".crc32c") as f:
            assert int(f.read(), 16) == crc32c(text), f"{path}: CRC-32C differs from its record"
        records = json.loads(text)
        assert records["writer"] == w and records["step"] == index["step"], path
        for sh in records["shards"]:
            tensors[sh["tensor"]]["shards"].append(dict(sh, file=records["file"]))
    files = {}
    for p in index["params"]:
        name = p["name"]
        t = tensors[name]  # the weight: the tensor of the parameter's own name
        w = want[name]
        assert t["param"] == name and t["shape"] == p["shape"] == w["shape"], f"{name}: shape"
        assert t["dtype"] == w["dtype"], f"{name}: dtype {t['dtype']} != {w['dtype']}"
        whole = np.zeros(t["shape"], np.float32)
        covered = np.zeros(t["shape"], np.int32)
        for sh in t["shards"]:
            path = os.path.join(step_dir, sh["file"])
            if path not in files:
                with open(path, "rb") as f:
                    files[path] = dict(safetensors.deserialize(f.read()))
            raw = files[path][name]
            assert list(raw["shape"]) == sh["shape"], f"{path}: {name}: shape {raw['shape']}"
            vals = widen(raw).reshape(sh["shape"])
            if raw["dtype"] == "F32":  # numpy reads F32 by name too
                with safe_open(path, framework="numpy") as sf:
                    assert np.array_equal(sf.get_tensor(name), vals), f"{path}: {name}"
            box = tuple(slice(o, o + n) for o, n in zip(sh["offset"], sh["shape"]))
            whole[box] = vals
            covered[box] += 1
        assert (covered == 1).all(), f"{name}: the shards do not tile the parameter"
        expect = np.array(w["values"], np.float32).reshape(w["shape"])
        assert np.array_equal(whole, expect), f"{name}: reassembled values differ"
    return len(index["params"])


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
    if os.path.exists(os.path.join(report_dir, "report-weights.json")):
        n = check_weights(step_dir, report_dir)
        print(f"check_safetensors: {n} parameters reassembled from index.json equal the saving "
              f"ranks' memory")


if __name__ == "__main__":
    main()
