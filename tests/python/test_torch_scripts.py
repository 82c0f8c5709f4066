"""shardopt.torch.Muon under more of the habits of training scripts written by others (the
second round after test_torch_dropin.py, whose models and helpers it reuses): what torch.optim
does with each, compared step by step. One process.

    test_torch_scripts.py [CASE ...]     every case when none is named

Each case is a function below; a failure names the case and goes on with the next. Exit 77
(skip) only where torch is not importable."""
import sys
import traceback

try:
    import torch
    import torch.nn as nn
except Exception as e:  # noqa: BLE001 - any import failure means: no torch here
    print(f"SKIP: torch is not importable ({e})")
    sys.exit(77)

from test_torch_dropin import batch, model, refused

from shardopt.torch import Muon

torch.set_num_threads(1)


def snapshot(m):
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def changed(a, b):
    return [n for n in a if not torch.equal(a[n], b[n])]


def case_group_params_list_edited():
    """A group's "params" list edited by hand after the group was made (a tensor appended, as
    progressive-unfreezing code does, one removed, one replaced in place): torch.optim steps
    the list as it is, the runtime holds the tensors the group was made with, so the step
    would leave the new one unstepped and step the removed one. Refused by name at step(),
    nothing stepped in any group; put back, the run goes on. The same tensors in another order
    step as before (bit for bit as an optimizer whose list was left alone)."""
    m, ref = model(), model()
    opt = Muon(m.named_parameters(), lr=0.02, adamw_lr=3e-3, model=m)
    ropt = Muon(ref.named_parameters(), lr=0.02, adamw_lr=3e-3, model=ref)
    m(*batch(0)).backward()
    ref(*batch(0)).backward()
    opt.step()
    ropt.step()
    extra = nn.Parameter(torch.randn(5, 5))
    extra.grad = torch.randn(5, 5)
    muon = opt.param_groups[0]["params"]
    for what, edit, undo, words in (
            ("appended", lambda: muon.append(extra), muon.pop, ("1 tensor(s) not registered",)),
            ("removed", lambda: muon.pop(0), lambda p: muon.insert(0, p),
             ("1 registered one(s) no longer listed",)),
            ("replaced", lambda: muon.__setitem__(1, extra), None, ("not registered",))):
        kept = muon[1]
        out = edit()
        before = snapshot(m)
        refused(opt.step, ValueError, "param group 0 (muon)", "'params' list was edited",
                "add_param_group", "nothing was stepped", *words)
        assert not changed(before, snapshot(m)), what
        if undo is None:
            muon[1] = kept
        elif out is None:
            undo()
        else:
            undo(out)
    muon.reverse()  # the same tensors, another order
    opt.param_groups[1]["params"] = list(opt.param_groups[1]["params"])  # a new list, the same
    for k in (1, 2):
        for mm, o in ((m, opt), (ref, ropt)):
            o.zero_grad()
            mm(*batch(k)).backward()
            o.step()
    assert not changed(snapshot(m), snapshot(ref)), changed(snapshot(m), snapshot(ref))
    opt.close()
    ropt.close()


CASES = {k[5:]: v for k, v in sorted(globals().items()) if k.startswith("case_")}

if __name__ == "__main__":
    names = sys.argv[1:] or list(CASES)
    failed = []
    for name in names:
        try:
            CASES[name]()
            print(f"ok   {name}")
        except Exception:  # noqa: BLE001 - report every case
            traceback.print_exc()
            print(f"FAIL {name}")
            failed.append(name)
    if failed:
        print(f"test_torch_scripts: {len(failed)} of {len(names)} cases failed: {failed}")
        sys.exit(1)
    print(f"test_torch_scripts: {len(names)} cases: ok")
