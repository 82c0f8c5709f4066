"""In-place changes to the tensors opt.state hands out, written back into the runtimes.

torch.optim's opt.state[p]["exp_avg"] is the state itself, so a script that changes it in
place changes the optimizer: ReLoRA's optimizer reset (`random_pruning_(state[key])`, a
`tensor.mul_(mask)`), `opt.state[p]["momentum_buffer"].zero_()`. shardopt.torch.Muon's
state lives in libshardopt runtimes, and opt.state hands out copies: such a change did
nothing, silently. Here each copy handed out is remembered with its version counter
(torch's Tensor._version, which every in-place operation advances) while it may still be
changed: while its dict (the _ParamState) lives, and after that while anything else holds the
tensor. At the next step, state_dict() or opt.state read, a copy whose version moved is
written into its runtime, as an assignment of that key is. A copy read before a step and
changed after it holds the state of before that step: torch.optim would change the state
the step left, which a copy cannot give, so that is refused by name, nothing written. A
copy whose key was assigned since, or whose state was loaded (load_state_dict) or deleted
(del opt.state[p]), is let go: as torch.optim's, it is no longer the state."""
import sys
import weakref

# sys.getrefcount of a tensor held only by the record (or the dict) being looked at, the
# loop's variable and the call's argument: more means someone else holds it and may change it
_HELD = 3


class _Edits:
    """What opt.state handed out: its live per-parameter dicts, the tensors that outlived
    theirs, the steps taken since (epoch) and what was assigned, loaded or deleted since
    (generation, per parameter and kind of state). write(g, rt, sp, key, tensor) writes one
    key into a runtime as assigning it does."""

    def __init__(self, write):
        self.write = write
        self.live = weakref.WeakValueDictionary()  # id -> _ParamState alive (a dict: unhashable)
        self.kept = []  # (record, tensor) of tensors that outlived their dict
        self.epoch = 0
        self.gen = {}  # (id(parameter), kind) -> generation; "*" for a load


    def record(self, g, rt, sp, key, t):
        """The record of a copy handed out: [g, rt, sp, key, version, epoch, generation]."""
        return [g, rt, sp, key, t._version, self.epoch, self._generation(sp, key)]

    def _generation(self, sp, key):
        return self.gen.get((id(sp.source), _kind(key)), 0), self.gen.get("*", 0)

    def replaced(self, p=None, key=None):
        """A key assigned, or every kind of a parameter's state (del), or everything (load:
        p None): copies handed out before are no longer the state."""
        if p is None:
            self.gen["*"] = self.gen.get("*", 0) + 1
            return
        for k in ((_kind(key),) if key else ("momentum", "exp_avg", "exp_avg_sq", "step")):
            self.gen[(id(p), k)] = self.gen.get((id(p), k), 0) + 1

    def flush(self, stepping=False):
        """Write every copy changed in place since it was handed out (or last written); a
        stale one (read before a step, changed after) is refused, nothing of it written.
        stepping: a step follows, after which every copy alive is stale. Nothing handed out
        alive: nothing to do (each step and state read asks)."""
        if not self.kept and not self.live:
            return
        try:
            for entry in list(self.live.values()):
                for key, rec in list(entry._recs.items()):
                    if not self._one(rec, dict.get(entry, key)):
                        del entry._recs[key]
            kept, self.kept = self.kept, []
            for i, (rec, t) in enumerate(kept):
                try:
                    followed = self._one(rec, t)
                except ValueError:
                    self.kept.extend(kept[i + 1:])  # the refused one let go, the rest kept
                    raise
                # held by the list, this variable and getrefcount's argument only: no one
                # else can change it any more
                if followed and sys.getrefcount(t) > _HELD:
                    self.kept.append((rec, t))
        finally:
            if stepping:
                self.epoch += 1

    def _one(self, rec, t):
        """Write t if it changed in place; False once it is no longer followed."""
        g, rt, sp, key, version, epoch, gen = rec
        if t is None:
            return False
        if gen != self._generation(sp, key):
            return False  # assigned, loaded or deleted since: not the state now
        if t._version == version:
            return True
        if epoch != self.epoch:
            rec[6] = None  # refused once: let go
            raise ValueError(
                f"{sp.name}: opt.state[p][{key!r}] was read before a step and changed in "
                "place after it; in torch.optim that tensor is the state the step left, here "
                "it is a copy of the state before it (shardopt.torch.Muon's state lives in "
                "libshardopt): read opt.state[p] again after the step and change that. "
                "Nothing of it was written")
        self.write(g, rt, sp, key, t)
        rec[4] = t._version
        return True

    def left(self, entry):
        """entry (a _ParamState) is being freed: the copies it handed out that were changed,
        or that someone else still holds, are kept until the next flush."""
        for key, rec in entry._recs.items():
            t = dict.get(entry, key)
            # held by the dict, this variable and getrefcount's argument: no one else can
            # change it
            if t is not None and (t._version != rec[4] or sys.getrefcount(t) > _HELD):
                self.kept.append((rec, t))


def _kind(key):
    return "momentum" if key == "momentum_buffer" else key
