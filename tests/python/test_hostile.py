"""The binding against callers that lie (beyond test_safety.py, which is at its size limit): a
shape holding a bool, a parameter name that is bytes, not UTF-8, or a str subclass whose encode
says another name; a shape that reads differently each time; an ndarray subclass lying about its
length and size; an object offering __array_interface__ for a buffer; a gradient that is its
parameter's data; one array registered as two parameters; step() arguments that are no number (a
bool, text, None, an int past a double); a config key that is no str, a config that is no dict;
a Param field of another type (placement 'EXPERT', lr_mult True); a state kind that is none, a
bool step count, a name where a Param is taken. Each is refused with a ValueError (or the
library's shardopt.Error) naming what was wrong, or stepped within the buffers it was given:
never a crash, never a name or layout other than the one checked.

    SHARDOPT_LIBRARY=build/libshardopt.so python3 test_hostile.py"""
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import shardopt  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", flush=True)


def arrays(n=8):
    return np.zeros((n, n), np.float32), np.ones((n, n), np.float32)


def one(data, grad, shape=None, name="w"):
    p = shardopt.Param(name=name, shape=list(data.shape) if shape is None else shape, data=data,
                       grad=grad, placement="replicated")
    return p, shardopt.Optimizer([p])


def refused(fn, kind, *words):
    try:
        fn()
    except kind as e:
        for w in words:
            check(w in str(e), f"{fn.__name__}: '{w}' not in: {e}")
        return
    except Exception as e:  # noqa: BLE001 (any other exception is the failure reported)
        check(False, f"{fn.__name__}: {type(e).__name__} ({e}), expected {kind.__name__}")
        return
    check(False, f"{fn.__name__}: accepted")


def bool_in_shape():  # [True, 64] was registered as [1, 64]
    w, g = arrays()
    one(w, g, shape=[True, 64])[1].close()


def bytes_name():  # an AttributeError ('bytes' object has no attribute 'encode')
    w, g = arrays()
    one(w, g, name=b"w")[1].close()


def surrogate_name():  # Python's UnicodeEncodeError, naming no parameter
    w, g = arrays()
    one(w, g, name="w\udcff")[1].close()


class LyingStr(str):
    def encode(self, *a, **k):
        return b"x" * 100000


def lying_encode_registers_the_real_name():
    """the library got the subclass's 100000 bytes (refused), where the name is 'w'"""
    w, g = arrays()
    p, opt = one(w, g, name=LyingStr("w"))
    opt.step(lr=0.01)
    with tempfile.TemporaryDirectory() as d:
        opt.save(d)
        with open(os.path.join(d, "latest")) as f:
            step = f.read().strip()
        with open(os.path.join(d, step, "index.json")) as f:
            names = [q["name"] for q in json.load(f)["params"]]
    opt.close()
    check(names == ["w"], f"registered names {names}, expected ['w']")


class Flip:
    """A shape that reads [8, 8] once and [4096, 4096] after."""

    def __init__(self):
        self.reads = 0

    def __iter__(self):
        self.reads += 1
        return iter([8, 8] if self.reads == 1 else [4096, 4096])

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return [8, 8][i]


def flipping_shape_steps_within_its_buffer():
    w, g = arrays()
    guard = np.full(1 << 16, 7, np.float32)  # memory beside, which a 4096 x 4096 write would hit
    try:
        p, opt = one(w, g, shape=Flip())
        opt.step(lr=0.01)
        opt.close()
    except (ValueError, shardopt.Error):
        pass  # refusing is as good
    check(bool(np.all(guard == 7)), "memory beside the buffer changed")


class LyingLen(np.ndarray):
    def __len__(self):
        return 1 << 40

    @property
    def size(self):
        return 1 << 40


def ndarray_lying_about_len_and_size_is_read_as_it_is():
    w, g = arrays()
    p, opt = one(w.view(LyingLen), g)
    opt.step(lr=0.01)
    opt.close()
    check(bool(np.any(w != 0)), "the step did not update the array's memory")


class Interface:
    def __init__(self, a):
        self.a = a

    @property
    def __array_interface__(self):
        d = dict(self.a.__array_interface__)
        d["shape"] = (4096, 4096)
        return d


def array_interface_object():
    w, g = arrays()
    one(w, Interface(g), shape=[8, 8])[1].close()


def gradient_is_its_data():
    w, _ = arrays()
    p, opt = one(w, w)
    try:
        opt.step(lr=0.01)
    finally:
        opt.close()


def one_array_as_two_parameters():
    w, g = arrays()
    ps = [shardopt.Param(name=n, shape=[8, 8], data=w, grad=g.copy(), placement="replicated")
          for n in ("a", "b")]
    opt = shardopt.Optimizer(ps)
    try:
        opt.step(lr=0.01)
    finally:
        opt.close()


def step_arguments_that_are_no_number_name_themselves():
    """ctypes took True as 1.0 (max_grad_norm=True clipped at 1), skip_missing_grads="false"
    as True, and refused a str, None or an int past a double with a TypeError or
    OverflowError naming no argument"""
    w, g = arrays()
    w0 = w.copy()
    p, opt = one(w, g)
    bad = [({"lr": True}, "lr = True"), ({"lr": 0.01, "max_grad_norm": True}, "max_grad_norm"),
           ({"lr": "0.01"}, "lr = '0.01'"), ({"lr": None}, "lr = None"),
           ({"lr": 10 ** 400}, "lr = an integer of 401 digits"), ({"lr": 1j}, "complex"),
           ({"lr": 0.01, "adamw_lr": [0.1]}, "adamw_lr"),
           ({"lr": 0.01, "skip_missing_grads": "false"}, "skip_missing_grads = 'false'"),
           ({"lr": 0.01, "adamw_betas": (0.9, "0.95")}, "adamw_betas[1]"),
           ({"lr": 0.01, "adamw_betas": 0.9}, "adamw_betas = 0.9")]
    for kw, word in bad:
        try:
            opt.step(**kw)
            check(False, f"step({kw!r}) accepted")
        except ValueError as e:
            check(word in str(e), f"step({kw!r}): '{word}' not in: {e}")
        except Exception as e:  # noqa: BLE001
            check(False, f"step({kw!r}): {type(e).__name__} ({e}), expected ValueError")
    check(bool(np.array_equal(w, w0)), "a refused step wrote")
    import decimal
    opt.step(lr=decimal.Decimal("0.01"), max_grad_norm=np.float32(5), skip_missing_grads=0,
             adamw_betas=[0.9, np.float64(0.95)], momentum=np.array(0.9))
    opt.close()
    check(bool(np.any(w != w0)), "the step after the refusals did not update")


def config_keys_that_are_no_str_and_configs_that_are_no_dict():
    """a bytes or int key raised AttributeError ('bytes' object has no attribute 'encode'), a
    list of pairs or "key=value" text ('list' object has no attribute 'items'), naming nothing"""
    for cfg, words in [({b"momentum": 0.5}, ["config key b'momentum'", "bytes", "a str"]),
                       ({1: 2}, ["config key 1", "int"]),
                       ([("momentum", 0.5)], ["config = [('momentum', 0.5)]", "a dict", "list"]),
                       ("momentum=0.5", ["config = 'momentum=0.5'", "a dict", "str"])]:
        w, g = arrays()
        p = shardopt.Param(name="w", shape=[8, 8], data=w, grad=g, placement="replicated")
        try:
            shardopt.Optimizer([p], config=cfg).close()
            check(False, f"config {cfg!r} accepted")
        except ValueError as e:
            for word in words:
                check(word in str(e), f"config {cfg!r}: '{word}' not in: {e}")
        except Exception as e:  # noqa: BLE001
            check(False, f"config {cfg!r}: {type(e).__name__} ({e}), expected ValueError")
    w, g = arrays()
    p = shardopt.Param(name="w", shape=[8, 8], data=w, grad=g, placement="replicated")
    shardopt.Optimizer([p], config={"momentum": 0.5}).close()  # a dict still configures


def param_fields_of_another_type_name_the_parameter():
    """placement 'EXPERT' and algo 'Muon' raised a bare KeyError, transposed 'no' int()'s
    ValueError, lr_mult '2' ctypes' TypeError, naming neither the parameter nor what is
    accepted; shard_offset = True registered offset 1, lr_mult = True a multiplier of 1"""
    bad = [({"placement": "EXPERT"}, "w: placement = 'EXPERT': accepted dense, expert"),
           ({"algo": "Muon"}, "w: algo = 'Muon': accepted auto, muon, adamw"),
           ({"algo": None}, "w: algo = None"),
           ({"transposed": "no"}, "w: transposed = 'no': accepted True or False"),
           ({"transposed": 2}, "w: transposed = 2"),
           ({"shard_offset": True}, "w: shard_offset = True is a bool"),
           ({"shard_dim": np.False_}, "w: shard_dim = "),
           ({"lr_mult": True}, "w: lr_mult = True (bool)"),
           ({"lr_mult": "2"}, "w: lr_mult = '2' (str)"),
           ({"wd_mult": 10 ** 400}, "w: wd_mult = an integer of 401 digits")]
    for kw, word in bad:
        w, g = arrays()
        args = dict(name="w", shape=[8, 8], data=w, grad=g, placement="replicated")
        args.update(kw)
        try:
            shardopt.Optimizer([shardopt.Param(**args)]).close()
            check(False, f"Param({kw!r}) accepted")
        except ValueError as e:
            check(word in str(e), f"Param({kw!r}): '{word}' not in: {e}")
        except Exception as e:  # noqa: BLE001
            check(False, f"Param({kw!r}): {type(e).__name__} ({e}), expected ValueError")
    w, g = arrays()  # numpy's bool and a 0-d multiplier are still taken
    p = shardopt.Param(name="w", shape=[8, 8], data=w, grad=g, placement="replicated",
                       transposed=np.False_, lr_mult=np.float32(0.5))
    opt = shardopt.Optimizer([p])
    opt.step(lr=0.01)
    opt.close()


def state_kinds_steps_and_params_of_another_type_are_named():
    """get_state(p, "MOMENTUM") raised a bare KeyError, set_step(p, True) set step 1, algo("w")
    an AttributeError ('str' object has no attribute 'name')"""
    w, g = arrays()
    p, opt = one(w, g)
    opt.step(lr=0.01)
    m = opt.get_state(p, "momentum")
    calls = [(lambda: opt.get_state(p, "MOMENTUM"), "w: state kind 'MOMENTUM': accepted momentum"),
             (lambda: opt.state_info(p, 0), "w: state kind 0"),
             (lambda: opt.set_state(p, None, m), "w: state kind None"),
             (lambda: opt.set_step(p, True), "w: step = True: a step count is an integer, not"),
             (lambda: opt.algo("w"), "'w' is a str: pass the shardopt.Param"),
             (lambda: opt.get_step("w"), "'w' is a str")]
    for fn, word in calls:
        try:
            fn()
            check(False, f"'{word}': accepted")
        except ValueError as e:
            check(word in str(e), f"'{word}' not in: {e}")
        except Exception as e:  # noqa: BLE001
            check(False, f"'{word}': {type(e).__name__} ({e}), expected ValueError")
    check(opt.get_step(p) == 1, f"step count {opt.get_step(p)} after the refusals, expected 1")
    opt.set_step(p, np.int64(4))  # numpy's integers are still step counts
    check(opt.get_step(p) == 4, "set_step(np.int64(4)) did not set 4")
    opt.close()


def runs(fn):
    """fn() completes (it checks what it must); an exception is this probe's failure"""
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        check(False, f"{fn.__name__}: {type(e).__name__}: {e}")


refused(bool_in_shape, ValueError, "holds a bool")
refused(bytes_name, ValueError, "b'w'", "not a str")
refused(surrogate_name, ValueError, "parameter name", "not UTF-8")
runs(lying_encode_registers_the_real_name)
runs(flipping_shape_steps_within_its_buffer)
runs(ndarray_lying_about_len_and_size_is_read_as_it_is)
refused(array_interface_object, ValueError, "w.grad", "not a numpy array or torch tensor")
refused(gradient_is_its_data, shardopt.Error, "share memory")
refused(one_array_as_two_parameters, shardopt.Error, "share memory")
runs(step_arguments_that_are_no_number_name_themselves)
runs(config_keys_that_are_no_str_and_configs_that_are_no_dict)
runs(param_fields_of_another_type_name_the_parameter)
runs(state_kinds_steps_and_params_of_another_type_are_named)
print(f"test_hostile: {'ok' if not failures else f'{len(failures)} failure(s)'}", flush=True)
sys.exit(1 if failures else 0)
