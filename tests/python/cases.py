"""The case runner of the one-process torch tests (test_torch_optim, _dropin, _scripts).

run(label, namespace): every function named case_* in namespace, in name order, or the cases
named on the command line; a failure prints its traceback and "FAIL name" and the run goes on,
so that one broken case does not hide the others. The last line is what CTest's
PASS_REGULAR_EXPRESSION looks for: "<label>: N cases: ok", exit 1 otherwise.
"""

import sys
import traceback


def run(label, namespace, argv=None):
    cases = {k[5:]: v for k, v in sorted(namespace.items()) if k.startswith("case_")}
    names = (sys.argv[1:] if argv is None else argv) or list(cases)
    failed = []
    for name in names:
        try:
            cases[name]()
            print(f"ok   {name}")
        except Exception:  # noqa: BLE001 - report every case
            traceback.print_exc()
            print(f"FAIL {name}")
            failed.append(name)
    if failed:
        print(f"{label}: {len(failed)} of {len(names)} cases failed: {failed}")
        sys.exit(1)
    print(f"{label}: {len(names)} cases: ok")


def need_torch():
    """Exit 77 (CTest's skip) with one line where torch is not importable: the one-process torch
    tests call it before their torch imports, so that a machine without torch skips them."""
    try:
        import torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means: no torch here
        print(f"SKIP: torch is not importable ({e})")
        sys.exit(77)
