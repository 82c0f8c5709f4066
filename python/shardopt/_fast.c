/* _shardopt_fast: step()'s comparison (Optimizer._follow) in C, an optional CPython extension.

   The binding is ctypes and works without this module; with it, the per-tensor loop that
   step() runs over a runtime's torch parameters (read .grad, compare data_ptr, the
   parameter's shape or the kept gradient's element count, contiguity and the negative bit with
   what the library was pointed at, check a new gradient's type, dtype, shape and device) and the
   shardopt_step call after it cost one Python call a runtime. follow makes exactly the checks of
   the Python version (shardopt/__init__.py, _follow_rows), in the same order, through the same
   torch attributes and methods (never torch's C++ ABI, which changes between releases), on the same
   lists, and returns what that returns: None (not followed: the caller checks every buffer again)
   or the status of the shardopt_params_set_pointers call. The binding passes the addresses of that
   function and of shardopt_step from the library ctypes loaded, so that both paths always call the
   same copy. tests/python/test_torch_optim.py runs its step cases with and without this module and
   compares the two bit for bit (docs/python.md, "What a step costs in Python"). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <time.h>

#include "shardopt.h"

#if PY_VERSION_HEX < 0x030A0000 /* Py_NewRef came with 3.10; the binding takes 3.9 */
static inline PyObject *fast_new_ref(PyObject *o)
{
    Py_INCREF(o);
    return o;
}
#define Py_NewRef fast_new_ref
#endif

/* shardopt_params_set_pointers and shardopt_step, called through the addresses the binding
   takes from the library ctypes loaded */
typedef shardopt_status_t (*fast_set_pointers_fn)(shardopt_runtime_t rt, int n,
                                                  const shardopt_param_t *params, void *const *data,
                                                  const void *const *grad);
typedef shardopt_status_t (*fast_step_fn)(shardopt_runtime_t rt, const shardopt_step_args_t *a);

/* the module's API: the binding ignores a module of another version (2: rows hold the
   parameters' shapes, compared instead of their element counts; 3: a gradient is stored in the
   rows' list only, not on the slot and the Param, so that the binding can let it go after the
   step; 4: rows hold torch.Tensor.is_neg, and a lazily negated tensor is not followed; 5: rows
   hold the seen list, and a new gradient's storage is measured) */
enum { FAST_API = 5 };

static PyObject *s_grad, *s_dtype, *s_is_cpu, *s_is_cuda, *s_grad_addr, *s_shape,
    *s_untyped_storage, *s_nbytes, *s_storage_offset, *s_element_size;

/* rows: the tuple _Fast.rows holds (shardopt/__init__.py, _fast_rows) */
enum {
    R_TENSOR,
    R_DATA_PTR, /* torch.Tensor.data_ptr, numel, is_contiguous: called as the Python path does */
    R_NUMEL,
    R_CONTIGUOUS,
    R_IS_NEG, /* torch.Tensor.is_neg: a torch._neg_view reads its memory negated */
    R_HOST,
    R_SET_POINTERS,
    R_PARAMS,
    R_SLOTS,
    R_SRCS,
    R_GRADS,
    R_GADDRS,
    R_DADDRS,
    R_COUNTS,
    R_DTYPES,
    R_SHAPES,
    R_SEEN, /* weak references to the gradients whose storage was measured whole (None: none) */
    R_HANDLES,
    R_DARR,
    R_GARR,
    R_LEN
};

/* the methods of torch.Tensor follow() calls, from rows */
struct methods {
    PyObject *data_ptr, *numel, *contiguous, *is_neg;
};

/* method(obj) as a new reference, NULL with an exception set */
static PyObject *call1(PyObject *method, PyObject *obj)
{
    return PyObject_Vectorcall(method, &obj, 1, NULL);
}

/* 1: method(obj) == want; 0: not; -1: an exception */
static int call_eq(PyObject *method, PyObject *obj, PyObject *want)
{
    PyObject *v = call1(method, obj);
    if (v == NULL)
        return -1;
    int eq = PyObject_RichCompareBool(v, want, Py_EQ);
    Py_DECREF(v);
    return eq;
}

/* 1: method(obj) is truthy; 0: not; -1: an exception */
static int call_true(PyObject *method, PyObject *obj)
{
    PyObject *v = call1(method, obj);
    if (v == NULL)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* 1: obj.attr is truthy; 0: not; -1: an exception */
static int attr_true(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* 1: t is not a lazily negated view; 0: it is; -1: an exception */
static int not_negated(const struct methods *m, PyObject *t)
{
    const int neg = call_true(m->is_neg, t);
    return neg < 0 ? -1 : !neg;
}

/* a tensor at addr with n elements, contiguous, not negated: 1, 0 or -1 (an exception) */
static int unchanged(const struct methods *m, PyObject *t, PyObject *addr, PyObject *n)
{
    int ok = call_eq(m->data_ptr, t, addr);
    if (ok == 1)
        ok = call_eq(m->numel, t, n);
    if (ok == 1)
        ok = call_true(m->contiguous, t);
    if (ok == 1)
        ok = not_negated(m, t);
    return ok;
}

/* a parameter at addr of the registered shape (so element count), contiguous, not negated:
   1, 0 or -1 */
static int in_place(const struct methods *m, PyObject *t, PyObject *addr, PyObject *shape)
{
    int ok = call_eq(m->data_ptr, t, addr);
    if (ok == 1) {
        PyObject *v = PyObject_GetAttr(t, s_shape);
        if (v == NULL)
            return -1;
        ok = PyObject_RichCompareBool(v, shape, Py_EQ);
        Py_DECREF(v);
    }
    if (ok == 1)
        ok = call_true(m->contiguous, t);
    if (ok == 1)
        ok = not_negated(m, t);
    return ok;
}

/* a new gradient as a torch gradient must be here (the Python version's order): 1, 0, -1. Its
   shape, not only its element count: param.grad.data = g of another shape passes torch's setter */
static int fit(const struct methods *m, PyObject *g, PyObject *tensor, PyObject *dtype,
               PyObject *shape, int host)
{
    if ((PyObject *)Py_TYPE(g) != tensor)
        return 0;
    int ok = call_true(m->contiguous, g);
    if (ok == 1) {
        PyObject *dt = PyObject_GetAttr(g, s_dtype);
        if (dt == NULL)
            return -1;
        ok = PyObject_RichCompareBool(dt, dtype, Py_NE);
        Py_DECREF(dt);
        ok = ok < 0 ? -1 : !ok;
    }
    if (ok == 1) {
        PyObject *v = PyObject_GetAttr(g, s_shape);
        if (v == NULL)
            return -1;
        ok = PyObject_RichCompareBool(v, shape, Py_EQ);
        Py_DECREF(v);
    }
    if (ok == 1) {
        ok = attr_true(g, s_is_cpu);
        if (ok == 0 && !host)
            ok = attr_true(g, s_is_cuda);
    }
    if (ok == 1)
        ok = not_negated(m, g);
    return ok;
}

/* obj.name() as a C long long, -1 with an exception set (the values asked are never negative) */
static long long call_ll(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_VectorcallMethod(name, &obj, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (v == NULL)
        return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return x;
}

/* The element size of dtype, g's (fit compared them): g.element_size() the first time a dtype
   is seen, kept with a reference to that dtype, so that a new gradient costs no call for it (a
   dtype object's size never changes; the reference keeps its address from being another's).
   -1 with an exception set. */
static long long elem_size(PyObject *g, PyObject *dtype)
{
    static PyObject *known; /* the dtype last asked, held */
    static long long size;
    if (dtype != known) {
        const long long e = call_ll(g, s_element_size);
        if (e < 0)
            return -1;
        Py_INCREF(dtype);
        Py_XSETREF(known, dtype);
        size = e;
    }
    return size;
}

/* a new gradient of n elements of dtype whose storage holds its whole extent: 1, 0 (shorter: a
   storage resized smaller after the tensor was made, untyped_storage().resize_(); the full check
   names it), -1. Checked for new gradients only: a kept one's resize moves its memory, so
   data_ptr differs and the full check runs. Three calls a new gradient: untyped_storage(), its
   nbytes() and storage_offset() (docs/python.md). */
static int whole(PyObject *g, PyObject *n, PyObject *dtype)
{
    PyObject *st =
        PyObject_VectorcallMethod(s_untyped_storage, &g, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (st == NULL)
        return -1;
    const long long have = call_ll(st, s_nbytes);
    Py_DECREF(st);
    if (have < 0)
        return -1;
    const long long off = call_ll(g, s_storage_offset), count = PyLong_AsLongLong(n);
    if (off < 0 || count < 0)
        return PyErr_Occurred() ? -1 : 0;
    /* count elements of the dtype's size, off of them before it (none counted for an empty
       tensor); an overflow would be no real storage */
    const long long size = elem_size(g, dtype), esize = count > 0 ? size : 0;
    if (size < 0)
        return PyErr_Occurred() ? -1 : 0;
    if (esize > 0 && (count > LLONG_MAX / esize || off > (LLONG_MAX - count * esize) / esize))
        return 0;
    const long long body = count * esize;
    return have >= body + off * esize;
}

/* 1: w is a weak reference to g; 0: not (None, another object, a dead one) */
static int refers_to(PyObject *w, PyObject *g)
{
    if (!PyWeakref_CheckRef(w))
        return 0;
#if PY_VERSION_HEX >= 0x030D0000 /* PyWeakref_GetObject is deprecated from 3.13 */
    PyObject *o = NULL;
    if (PyWeakref_GetRef(w, &o) < 0) {
        PyErr_Clear();
        return 0;
    }
    Py_XDECREF(o); /* only compared: g is held by the caller */
    return o == g;
#else
    return PyWeakref_GetObject(w) == g;
#endif
}

static int as_pointer(PyObject *v, void **out)
{
    *out = v == Py_None ? NULL : PyLong_AsVoidPtr(v);
    return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

/* _follow_rows's twin (see the top): 1 followed (*status: of the set_pointers call, 0 where
   none was needed), 0 not followed, -1 an exception */
static int follow(PyObject *rows, PyObject *rt_obj, int skip, int *status)
{
    *status = 0;
    if (!PyTuple_CheckExact(rows) || PyTuple_GET_SIZE(rows) != R_LEN) {
        PyErr_SetString(PyExc_TypeError, "_shardopt_fast: rows is _Fast.rows");
        return -1;
    }
    PyObject *const *r = &PyTuple_GET_ITEM(rows, 0);
    const struct methods m = {r[R_DATA_PTR], r[R_NUMEL], r[R_CONTIGUOUS], r[R_IS_NEG]};
    PyObject *tensor = r[R_TENSOR], *params = r[R_PARAMS], *slots = r[R_SLOTS], *srcs = r[R_SRCS],
             *grads = r[R_GRADS], *gaddrs = r[R_GADDRS], *daddrs = r[R_DADDRS],
             *counts = r[R_COUNTS], *dtypes = r[R_DTYPES], *shapes = r[R_SHAPES], *seen = r[R_SEEN];
    if (!PyList_CheckExact(params) || !PyList_CheckExact(slots) || !PyList_CheckExact(srcs) ||
        !PyList_CheckExact(grads) || !PyList_CheckExact(gaddrs) || !PyList_CheckExact(daddrs) ||
        !PyList_CheckExact(counts) || !PyList_CheckExact(dtypes) || !PyList_CheckExact(shapes) ||
        !PyList_CheckExact(seen)) {
        PyErr_SetString(PyExc_TypeError, "_shardopt_fast: rows holds lists");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(srcs);
    if (PyList_GET_SIZE(params) != n || PyList_GET_SIZE(slots) != n ||
        PyList_GET_SIZE(grads) != n || PyList_GET_SIZE(gaddrs) != n ||
        PyList_GET_SIZE(daddrs) != n || PyList_GET_SIZE(counts) != n ||
        PyList_GET_SIZE(dtypes) != n || PyList_GET_SIZE(shapes) != n ||
        PyList_GET_SIZE(seen) != n || n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "_shardopt_fast: rows' lists differ in length");
        return -1;
    }
    int host = PyObject_IsTrue(r[R_HOST]);
    if (host < 0)
        return -1;
    /* the gradients as they are now (Py_None: none) and their addresses */
    PyObject **got = PyMem_Calloc((size_t)n + 1, 2 * sizeof(PyObject *));
    if (got == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject **addr = got + n;
    int changed = 0, ok = 1;
    for (Py_ssize_t i = 0; i < n && ok == 1; i++) {
        PyObject *src = PyList_GET_ITEM(srcs, i), *was = PyList_GET_ITEM(grads, i),
                 *cnt = PyList_GET_ITEM(counts, i);
        ok = in_place(&m, src, PyList_GET_ITEM(daddrs, i), PyList_GET_ITEM(shapes, i));
        if (ok != 1)
            break;
        PyObject *g = PyObject_GetAttr(src, s_grad);
        if (g == NULL) {
            ok = -1;
            break;
        }
        got[i] = g;
        if (g == Py_None) {
            ok = skip;
            addr[i] = Py_NewRef(Py_None);
        } else if (g == was) {
            /* held before any call: torch may run Python code (a __torch_function__ mode) */
            PyObject *a = addr[i] = Py_NewRef(PyList_GET_ITEM(gaddrs, i));
            ok = unchanged(&m, g, a, cnt);
        } else {
            ok = fit(&m, g, tensor, PyList_GET_ITEM(dtypes, i), PyList_GET_ITEM(shapes, i), host);
            if (ok == 1) {
                addr[i] = call1(m.data_ptr, g);
                /* 0: no memory (a ZeroTensor): not followed, the full check names it */
                ok = addr[i] == NULL ? -1 : PyObject_IsTrue(addr[i]);
            }
            /* measured once per tensor object: the one measured before at the same address is
               whole still (a resize moves the memory) */
            if (ok == 1 && !refers_to(PyList_GET_ITEM(seen, i), g))
                ok = whole(g, cnt, PyList_GET_ITEM(dtypes, i));
            else if (ok == 1) {
                const int moved =
                    PyObject_RichCompareBool(addr[i], PyList_GET_ITEM(gaddrs, i), Py_NE);
                ok = moved < 0 ? -1 : moved ? whole(g, cnt, PyList_GET_ITEM(dtypes, i)) : 1;
            }
        }
        if (ok == 1 && !changed) {
            changed = PyObject_RichCompareBool(addr[i], PyList_GET_ITEM(gaddrs, i), Py_NE);
            ok = changed < 0 ? -1 : 1;
        }
    }
    if (ok == -1 && PyErr_ExceptionMatches(PyExc_RuntimeError)) {
        PyErr_Clear(); /* a tensor that refuses to say (a sparse layout): the full check names it */
        ok = 0;
    }
    if (ok == 1 && changed) {
        void **garr = PyLong_AsVoidPtr(r[R_GARR]), **handles = PyLong_AsVoidPtr(r[R_HANDLES]),
             **darr = PyLong_AsVoidPtr(r[R_DARR]), *rt = NULL;
        fast_set_pointers_fn fn =
            (fast_set_pointers_fn)(uintptr_t)PyLong_AsVoidPtr(r[R_SET_POINTERS]);
        if (PyErr_Occurred() || as_pointer(rt_obj, &rt) < 0) {
            ok = -1;
        } else if (garr == NULL || handles == NULL || darr == NULL || fn == NULL) {
            PyErr_SetString(PyExc_ValueError, "_shardopt_fast: a NULL array or function in rows");
            ok = -1;
        }
        for (Py_ssize_t i = 0; i < n && ok == 1; i++)
            if (as_pointer(addr[i], &garr[i]) < 0)
                ok = -1;
        if (ok == 1)
            *status =
                fn(rt, (int)n, (const shardopt_param_t *)handles, darr, (const void *const *)garr);
    }
    for (Py_ssize_t i = 0; i < n && ok == 1 && *status == 0; i++) {
        PyObject *g = got[i];
        if (g == PyList_GET_ITEM(grads, i))
            continue;
        /* held in grads through the step only: Optimizer.step lets them go after it */
        if (PyObject_SetAttr(PyList_GET_ITEM(slots, i), s_grad_addr, addr[i]) < 0 ||
            PyList_SetItem(grads, i, Py_NewRef(g)) < 0 ||
            PyList_SetItem(gaddrs, i, Py_NewRef(addr[i])) < 0)
            ok = -1;
        else if (g != Py_None && !refers_to(PyList_GET_ITEM(seen, i), g)) {
            PyObject *w = PyWeakref_NewRef(g, NULL);
            if (w == NULL || PyList_SetItem(seen, i, w) < 0)
                ok = -1;
        }
    }
    for (Py_ssize_t i = 0; i < 2 * n; i++)
        Py_XDECREF(got[i]);
    PyMem_Free(got);
    return ok;
}

/* follow(rows, rt, skip_missing) -> None (not followed) | status of the set_pointers call */
static PyObject *fast_follow(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "follow(rows, rt, skip_missing)");
        return NULL;
    }
    int skip = PyObject_IsTrue(args[2]), status = 0;
    int ok = skip < 0 ? -1 : follow(args[0], args[1], skip, &status);
    if (ok < 0)
        return NULL;
    return ok == 0 ? Py_NewRef(Py_None) : PyLong_FromLong(status);
}

/* step(rows, rt, step_fn, args, skip_missing, lr, adamw_lr, weight_decay, max_grad_norm,
   stream[, followed]) -> None | (status, seconds): follow (not where followed is true: the
   binding's _prepare followed already), then, where followed, fill the binding's
   shardopt_step_args_t (at args) as Optimizer.step does and call shardopt_step (at step_fn)
   without the GIL, as ctypes calls it. (status, None): the set_pointers call failed, no step;
   (status, seconds): the step's status and its wall time as the caller waited for it. */
static PyObject *fast_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 10 && nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "step(rows, rt, step_fn, args, skip_missing, lr, "
                                         "adamw_lr, weight_decay, max_grad_norm, stream"
                                         "[, followed])");
        return NULL;
    }
    int skip = PyObject_IsTrue(args[4]), status = 0;
    const int followed = nargs == 11 ? PyObject_IsTrue(args[10]) : 0;
    int ok = skip < 0 || followed < 0 ? -1 : followed ? 1 : follow(args[0], args[1], skip, &status);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    if (status != 0)
        return Py_BuildValue("(iO)", status, Py_None);
    void *rt = NULL, *fn_addr = NULL, *stream = NULL;
    shardopt_step_args_t *a = NULL;
    if (as_pointer(args[1], &rt) < 0 || as_pointer(args[2], &fn_addr) < 0 ||
        as_pointer(args[3], (void **)&a) < 0 || as_pointer(args[9], &stream) < 0)
        return NULL;
    double lr = PyFloat_AsDouble(args[5]), adamw_lr = PyFloat_AsDouble(args[6]),
           wd = PyFloat_AsDouble(args[7]), max_norm = PyFloat_AsDouble(args[8]);
    if (PyErr_Occurred())
        return NULL;
    if (fn_addr == NULL || a == NULL) {
        PyErr_SetString(PyExc_ValueError, "_shardopt_fast.step: a NULL function or args");
        return NULL;
    }
    a->lr = lr;
    a->adamw_lr = adamw_lr;
    a->weight_decay = wd;
    a->stream = stream;
    a->max_grad_norm = max_norm;
    a->skip_missing_grads = skip;
    fast_step_fn fn = (fast_step_fn)(uintptr_t)fn_addr;
    struct timespec t0, t1;
    Py_BEGIN_ALLOW_THREADS;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    status = fn(rt, a);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    Py_END_ALLOW_THREADS;
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return Py_BuildValue("(id)", status, secs);
}

static PyMethodDef fast_methods[] = {
    {"follow", (PyCFunction)(void (*)(void))fast_follow, METH_FASTCALL,
     "follow(rows, rt, skip_missing) -> None | status: shardopt's _follow_rows in C"},
    {"step", (PyCFunction)(void (*)(void))fast_step, METH_FASTCALL,
     "step(rows, rt, step_fn, args, skip_missing, lr, adamw_lr, weight_decay, max_grad_norm, "
     "stream[, followed]) -> None | (status, seconds): follow, then shardopt_step"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef fast_module = {PyModuleDef_HEAD_INIT,
                                         "_shardopt_fast",
                                         "step()'s comparison in C (shardopt's _follow_rows)",
                                         -1,
                                         fast_methods,
                                         NULL,
                                         NULL,
                                         NULL,
                                         NULL};

PyMODINIT_FUNC PyInit__shardopt_fast(void)
{
    struct {
        PyObject **s;
        const char *text;
    } names[] = {{&s_grad, "grad"},
                 {&s_dtype, "dtype"},
                 {&s_is_cpu, "is_cpu"},
                 {&s_is_cuda, "is_cuda"},
                 {&s_grad_addr, "grad_addr"},
                 {&s_shape, "shape"},
                 {&s_untyped_storage, "untyped_storage"},
                 {&s_nbytes, "nbytes"},
                 {&s_storage_offset, "storage_offset"},
                 {&s_element_size, "element_size"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (*names[i].s == NULL &&
            (*names[i].s = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    PyObject *m = PyModule_Create(&fast_module);
    if (m != NULL && PyModule_AddIntConstant(m, "API", FAST_API) < 0)
        Py_CLEAR(m);
    return m;
}
