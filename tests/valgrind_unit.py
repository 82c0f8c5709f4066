#!/usr/bin/env python3
"""valgrind memcheck over the unit suite: every CTest test labelled unit, run as CTest would
(command, environment, working directory) under
    valgrind --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=97
A test counts as failed when valgrind reports an error or a definite leak (exit 97), or when the
test itself fails (a skip, exit 77 where the test allows it, is reported apart). Prints one line
per test and a summary with the counts.   tests/valgrind_unit.py BUILD_DIR [-R REGEX]"""
import json
import os
import re
import subprocess
import sys
import time

build = sys.argv[1] if len(sys.argv) > 1 else "build"
regex = sys.argv[sys.argv.index("-R") + 1] if "-R" in sys.argv else None
listing = subprocess.run(["ctest", "--test-dir", build, "-L", "unit", "--show-only=json-v1"],
                         check=True, capture_output=True, text=True).stdout
tests = json.loads(listing)["tests"]
suppressions = os.path.join(os.path.dirname(os.path.abspath(__file__)), "valgrind.supp")
failed, skipped, errors_total = [], [], 0
t_start = time.time()
for t in tests:
    if regex and not re.search(regex, t["name"]):
        continue
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    env = dict(os.environ)
    for kv in props.get("ENVIRONMENT", []):
        k, _, v = kv.partition("=")
        env[k] = v
    # test_alloc_fault reruns its whole sequence once per allocation (about 2,200 times): under
    # memcheck every 50th injection point is enough to check that the failure paths free
    env.setdefault("SHARDOPT_TEST_ALLOC_STRIDE", "50")
    cmd = t["command"]
    if not os.path.basename(cmd[0]).startswith(("test_", "moe_", "ns_", "shardopt")):
        print(f"{t['name']}: not a compiled program ({cmd[0]}), skipped")
        skipped.append(t["name"])
        continue
    vg = ["valgrind", "--quiet", "--leak-check=full", "--errors-for-leak-kinds=definite",
          "--show-leak-kinds=definite", "--error-exitcode=97", "--track-origins=no",
          f"--suppressions={suppressions}"]
    t0 = time.time()
    r = subprocess.run(vg + cmd, env=env, cwd=props.get("WORKING_DIRECTORY", build),
                       capture_output=True, text=True)
    dt = time.time() - t0
    out = r.stdout + r.stderr
    nerr = 0
    m = re.findall(r"ERROR SUMMARY: (\d+) errors", out)
    if m:
        nerr = max(int(x) for x in m)
    if r.returncode == props.get("SKIP_RETURN_CODE", -1):
        print(f"{t['name']}: skipped by the test ({dt:.0f} s)")
        skipped.append(t["name"])
        continue
    passed_regex = props.get("PASS_REGULAR_EXPRESSION")
    ok = r.returncode == 0 or (passed_regex and r.returncode != 97 and
                               any(re.search(p, out) for p in passed_regex))
    if r.returncode == 97 or not ok:
        failed.append(t["name"])
        errors_total += nerr
        print(f"{t['name']}: FAILED (exit {r.returncode}, {dt:.0f} s)")
        print("\n".join(l for l in out.splitlines() if l.startswith("==") or "FAIL" in l)[:4000])
    else:
        print(f"{t['name']}: ok ({dt:.0f} s)")
    sys.stdout.flush()
ran = sum(1 for t in tests if not regex or re.search(regex, t["name"])) - len(skipped)
print(f"valgrind_unit: {ran} tests under memcheck in {time.time() - t_start:.0f} s, "
      f"{len(failed)} failed ({errors_total} errors), {len(skipped)} skipped")
sys.exit(1 if failed else 0)
