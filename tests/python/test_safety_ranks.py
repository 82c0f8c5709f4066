"""The binding's refusals on 2 ranks (docs/python.md, "What the binding refuses"): a buffer
refused on one rank fails the collective call on every rank (ValueError there, shardopt.Error
naming that rank elsewhere), never a hang, nothing written: at the step, for a shard with
elements and an empty one, and at the commit; expert stacks under ep = 2. The one-rank cases
are test_safety.py's.

    mpiexec -n 2 python3 test_safety_ranks.py

SHARDOPT_LIBRARY names the library under test (safety.sh sets it)."""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import shardopt  # noqa: E402



def ranks():
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    assert size == 2, "run with 2 ranks"
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print(f"rank {rank}: FAIL: {what}", flush=True)

    def every_rank_fails(fn, bad_rank, *words):
        """fn() fails on every rank: ValueError with words on bad_rank, shardopt.Error
        naming bad_rank elsewhere."""
        try:
            fn()
            return check(False, f"{words}: accepted on rank {rank}")
        except (ValueError, TypeError) as e:
            check(rank == bad_rank and all(w in str(e) for w in words),
                  f"{words}: rank {rank}: {type(e).__name__} {e}")
        except shardopt.Error as e:
            check(rank != bad_rank and f"rank {bad_rank}" in e.message,
                  f"{words}: rank {rank}: Error {e}")

    # the step's re-check on one rank fails the step on both; nothing is written; fixed, the
    # next step goes on. A shard with elements here (the library names the parameter), then
    # an empty one (rank 1 holds no rows of "b"): both must fail everywhere.
    r = np.random.default_rng(4)
    wa = r.standard_normal((2, 8)).astype(np.float32)
    wb = r.standard_normal((1, 8)).astype(np.float32)
    a = wa[rank:rank + 1].copy()
    b = wb[:1 - rank].copy()  # rank 0: the row, rank 1: empty
    pa = shardopt.Param(name="a", shape=[2, 8], data=a, grad=np.ones_like(a), shard_dim=0,
                        shard_offset=rank, shard_length=1)
    pb = shardopt.Param(name="b", shape=[1, 8], data=b, grad=np.ones_like(b), shard_dim=0,
                        shard_offset=rank, shard_length=1 - rank)
    opt = shardopt.Optimizer([pa, pb], comm=comm, config={"dp_shard": 2})
    a0, b0 = a.copy(), b.copy()
    if rank == 1:
        pa.data = np.zeros(16, np.float32)  # another size; `a` stays referenced here
    every_rank_fails(lambda: opt.step(lr=0.01), 1, "a.data")
    check(np.array_equal(a, a0) and np.array_equal(b, b0), "a refused step wrote")
    pa.data = a
    if rank == 1:
        pb.data = np.zeros(0, np.float64)  # empty, but not float32
    every_rank_fails(lambda: opt.step(lr=0.01), 1, "b.data")
    pb.data = b
    if rank == 0:
        a.flags.writeable = False
    every_rank_fails(lambda: opt.step(lr=0.01), 0, "a.data", "read-only")
    a.flags.writeable = True
    check(np.array_equal(a, a0) and np.array_equal(b, b0), "a refused step wrote")
    # an argument Python refuses before the library sees it, on one rank (a betas pair of one,
    # an lr that is no number): that rank raises it, every other fails naming that rank. It
    # raised before the step's C call, and the other rank waited in the step until
    # comm_timeout_s ended the job
    every_rank_fails(lambda: opt.step(lr=0.01, adamw_betas=(0.9,) if rank == 1 else None), 1,
                     "adamw_betas", "a pair")
    every_rank_fails(lambda: opt.step(lr="0.01" if rank == 0 else 0.01), 0, "lr = '0.01'", "str")
    check(np.array_equal(a, a0) and np.array_equal(b, b0), "a refused step wrote")
    # a save directory os.fsencode refuses on one rank (None): every rank fails, nothing saved
    import tempfile
    ckpt = comm.bcast(tempfile.mkdtemp(prefix="shardopt_safety_") if rank == 0 else None)
    every_rank_fails(lambda: opt.save(None if rank == 1 else ckpt), 1, "NoneType")
    check(not os.path.exists(os.path.join(ckpt, "latest")), "a refused save wrote")
    opt.save(ckpt)
    check(os.path.exists(os.path.join(ckpt, "latest")), "the save after the refusal wrote nothing")
    comm.barrier()
    if rank == 0:
        import shutil
        shutil.rmtree(ckpt)
    opt.step(lr=0.01)
    check(not np.array_equal(a, a0), "the step after the refusals did not update")
    opt.close()

    # a config the binding refuses on one rank (a list for a number): that rank raises it, the
    # other fails in init naming it (before: it waited in init until comm_timeout_s)
    every_rank_fails(lambda: shardopt.Optimizer(
        [shardopt.Param(name="r", shape=[8], data=np.zeros(8, np.float32),
                        grad=np.zeros(8, np.float32), placement="replicated")], comm=comm,
        config={"momentum": [0.9]} if rank == 1 else {}), 1, "momentum")

    # expert stacks under ep = 2: each rank holds E / ep = 2 of the 4 experts; a rank passing
    # the global stack is refused there, every rank fails at commit
    e, o, i = 4, 8, 8
    mine = np.ones((e // 2, o, i), np.float32)
    ok = shardopt.Param(name="x", shape=[e, o, i], data=mine.copy(), grad=np.ones_like(mine),
                        placement="expert", algo="adamw")
    with shardopt.Optimizer([ok], comm=comm, config={"ep": 2}) as o2:
        o2.step(lr=0.01)
        check(not np.array_equal(ok.data, mine), "the expert stack under ep = 2 did not update")
    whole = np.ones((e, o, i), np.float32) if rank == 1 else mine.copy()
    every_rank_fails(lambda: shardopt.Optimizer(
        [shardopt.Param(name="x", shape=[e, o, i], data=whole, grad=np.ones_like(whole),
                        placement="expert")], comm=comm, config={"ep": 2}),
        1, "x", "2 of 4 experts", "holds 128 here")
    # read-only data on one rank: refused there, every rank fails at commit
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = rank != 0
    every_rank_fails(lambda: shardopt.Optimizer(
        [shardopt.Param(name="r", shape=[8], data=ro, grad=np.zeros(8, np.float32),
                        placement="replicated")], comm=comm), 0, "r.data", "read-only")

    n = comm.allreduce(len(failures))
    if rank == 0:
        print(f"test_safety: {size} ranks: {'ok' if n == 0 else f'{n} failure(s)'}", flush=True)
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(ranks())
