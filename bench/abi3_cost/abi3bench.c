// abi3bench: the two hot paths of millpond._core, written once and compiled
// twice, with and without -DPy_LIMITED_API=0x030A0000 (the stable ABI of
// CPython 3.10, what one abi3 wheel for 3.10+ would be built against).
//
// - call_go(handle, step, key) -> int: a handle call shaped like
//   store_get (PyArg_ParseTuple "Ks#s#", the GIL released around a call
//   into Go); call_c is the same without Go, noop is the bare call.
// - pack_snapshot(live, dumps, protocol) -> int: the loop of
//   pybindings/snapshot.c over a dict of str keys -> live objects: call
//   .snapshot(), pickle the result with dumps(state, protocol), append key and
//   value to one buffer, hand the buffer to Go.
// - pack_rows(rows) -> int: the loop of mp_pack_rows in pybindings/module.c
//   over a list of (step, key, bytes) tuples.
//
// In the limited API the macros (PyList_GET_ITEM, PyTuple_GET_ITEM,
// PyBytes_AS_STRING, PyBytes_GET_SIZE, PyDict_GET_SIZE) are not there, nor,
// in 3.10's, PyObject_Vectorcall, PyObject_VectorcallMethod,
// PyObject_CallOneArg or PyObject_CallMethodNoArgs: the functions below
// stand in for them. Built with Py_LIMITED_API=0x030C0000 (3.12's stable
// ABI, run.py's third flavour on a 3.12+ interpreter) the calls use
// PyObject_Vectorcall and PyObject_VectorcallMethod again.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cgo_export.h"

#if defined(Py_LIMITED_API) && Py_LIMITED_API + 0 >= 0x030C0000
static inline PyObject *call_method0(PyObject *o, PyObject *name) {
    PyObject *argv[1] = {o};
    return PyObject_VectorcallMethod(name, argv, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}
static inline PyObject *call2(PyObject *f, PyObject *a, PyObject *b) {
    PyObject *argv[2] = {a, b};
    return PyObject_Vectorcall(f, argv, 2, NULL);
}
#define CALL_METHOD0(o, name) call_method0(o, name)
#define CALL2(f, a, b) call2(f, a, b)
#define FLAVOUR "abi3.12"
#elif defined(Py_LIMITED_API)
#define CALL_METHOD0(o, name) PyObject_CallMethodObjArgs(o, name, NULL)
#define CALL2(f, a, b) PyObject_CallFunctionObjArgs(f, a, b, NULL)
#define FLAVOUR "abi3"
#endif

#ifdef Py_LIMITED_API
#define LIST_ITEM(l, i) PyList_GetItem(l, i)
#define TUPLE_ITEM(t, i) PyTuple_GetItem(t, i)
#define TUPLE_SIZE(t) PyTuple_Size(t)
#define LIST_SIZE(l) PyList_Size(l)
#define BYTES_DATA(b) PyBytes_AsString(b)
#define BYTES_SIZE(b) PyBytes_Size(b)
#define DICT_SIZE(d) PyDict_Size(d)
#else
#define LIST_ITEM(l, i) PyList_GET_ITEM(l, i)
#define TUPLE_ITEM(t, i) PyTuple_GET_ITEM(t, i)
#define TUPLE_SIZE(t) PyTuple_GET_SIZE(t)
#define LIST_SIZE(l) PyList_GET_SIZE(l)
#define BYTES_DATA(b) PyBytes_AS_STRING(b)
#define BYTES_SIZE(b) PyBytes_GET_SIZE(b)
#define DICT_SIZE(d) PyDict_GET_SIZE(d)
#define CALL_METHOD0(o, name) PyObject_CallMethodNoArgs(o, name)
static inline PyObject *call2(PyObject *f, PyObject *a, PyObject *b) {
    PyObject *argv[2] = {a, b};
    return PyObject_Vectorcall(f, argv, 2, NULL);
}
#define CALL2(f, a, b) call2(f, a, b)
#define FLAVOUR "full"
#endif

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static int grow(buf_t *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + more) cap *= 2;
    char *np = realloc(b->p, cap);
    if (np == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = np;
    b->cap = cap;
    return 0;
}

static void put_varint(buf_t *b, uint64_t v) {
    while (v >= 0x80) {
        b->p[b->len++] = (char)(v | 0x80);
        v >>= 7;
    }
    b->p[b->len++] = (char)v;
}

static int put_bytes(buf_t *b, const char *s, size_t n) {
    if (grow(b, n + 10) < 0) return -1;
    put_varint(b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static PyObject *take(buf_t *b) {
    long long n;
    Py_BEGIN_ALLOW_THREADS
    n = bench_take(b->p, b->len);
    Py_END_ALLOW_THREADS
    free(b->p);
    return PyLong_FromLongLong(n);
}

static PyObject *noop(PyObject *self, PyObject *unused) { Py_RETURN_NONE; }

static PyObject *call_c(PyObject *self, PyObject *args) {
    unsigned long long h;
    const char *step, *key;
    Py_ssize_t sl, kl;
    if (!PyArg_ParseTuple(args, "Ks#s#", &h, &step, &sl, &key, &kl)) return NULL;
    return PyLong_FromLongLong((long long)(h + (unsigned long long)sl + (unsigned long long)kl));
}

static PyObject *call_go(PyObject *self, PyObject *args) {
    unsigned long long h;
    const char *step, *key;
    Py_ssize_t sl, kl;
    if (!PyArg_ParseTuple(args, "Ks#s#", &h, &step, &sl, &key, &kl)) return NULL;
    long long r;
    Py_BEGIN_ALLOW_THREADS
    r = bench_call(h, (char *)step, (size_t)sl, (char *)key, (size_t)kl);
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(r);
}

static PyObject *pack_snapshot(PyObject *self, PyObject *args) {
    PyObject *live, *dumps, *protocol;
    if (!PyArg_ParseTuple(args, "O!OO", &PyDict_Type, &live, &dumps, &protocol)) return NULL;
    static PyObject *snapshot_name = NULL;
    if (snapshot_name == NULL && (snapshot_name = PyUnicode_InternFromString("snapshot")) == NULL) return NULL;
    buf_t b = {0};
    if (grow(&b, 16) < 0) return NULL;
    memcpy(b.p, "MPB1", 4);
    b.len = 4;
    put_varint(&b, (uint64_t)DICT_SIZE(live));
    Py_ssize_t pos = 0;
    PyObject *key, *obj;
    while (PyDict_Next(live, &pos, &key, &obj)) {
        Py_ssize_t kl;
        const char *k = PyUnicode_AsUTF8AndSize(key, &kl);
        if (k == NULL || put_bytes(&b, "step", 4) < 0 || put_bytes(&b, k, (size_t)kl) < 0) goto fail;
        PyObject *state = CALL_METHOD0(obj, snapshot_name);
        if (state == NULL) goto fail;
        PyObject *pickled = CALL2(dumps, state, protocol);
        Py_DECREF(state);
        if (pickled == NULL) goto fail;
        if (!PyBytes_Check(pickled)) {
            Py_DECREF(pickled);
            PyErr_SetString(PyExc_TypeError, "dumps must return bytes");
            goto fail;
        }
        Py_ssize_t vl = BYTES_SIZE(pickled);
        if (grow(&b, (size_t)vl + 10) < 0) {
            Py_DECREF(pickled);
            goto fail;
        }
        put_varint(&b, (uint64_t)vl + 1);
        memcpy(b.p + b.len, BYTES_DATA(pickled), (size_t)vl);
        b.len += (size_t)vl;
        Py_DECREF(pickled);
    }
    return take(&b);
fail:
    free(b.p);
    return NULL;
}

static PyObject *pack_rows(PyObject *self, PyObject *args) {
    PyObject *rows;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &rows)) return NULL;
    Py_ssize_t n = LIST_SIZE(rows);
    size_t size = 4 + 10;
    for (Py_ssize_t i = 0; i < n; i++) {  // sizes and checks, as mp_pack_rows
        PyObject *t = LIST_ITEM(rows, i);
        if (!PyTuple_Check(t) || TUPLE_SIZE(t) != 3) {
            PyErr_Format(PyExc_TypeError, "row %zd must be a (step_id, key, value) tuple", i);
            return NULL;
        }
        PyObject *step = TUPLE_ITEM(t, 0), *key = TUPLE_ITEM(t, 1), *val = TUPLE_ITEM(t, 2);
        Py_ssize_t sl, kl;
        if (PyUnicode_AsUTF8AndSize(step, &sl) == NULL || PyUnicode_AsUTF8AndSize(key, &kl) == NULL) return NULL;
        size += 30 + (size_t)sl + (size_t)kl;
        if (val == Py_None) continue;
        if (!PyBytes_Check(val)) {
            PyErr_Format(PyExc_TypeError, "row %zd: value must be bytes or None", i);
            return NULL;
        }
        size += (size_t)BYTES_SIZE(val);
    }
    buf_t b = {malloc(size), 0, size};
    if (b.p == NULL) return PyErr_NoMemory();
    memcpy(b.p, "MPB1", 4);
    b.len = 4;
    put_varint(&b, (uint64_t)n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = LIST_ITEM(rows, i);
        PyObject *val = TUPLE_ITEM(t, 2);
        Py_ssize_t sl, kl;
        const char *s = PyUnicode_AsUTF8AndSize(TUPLE_ITEM(t, 0), &sl);
        const char *k = PyUnicode_AsUTF8AndSize(TUPLE_ITEM(t, 1), &kl);
        put_varint(&b, (uint64_t)sl);
        memcpy(b.p + b.len, s, (size_t)sl);
        b.len += (size_t)sl;
        put_varint(&b, (uint64_t)kl);
        memcpy(b.p + b.len, k, (size_t)kl);
        b.len += (size_t)kl;
        if (val == Py_None) {
            put_varint(&b, 0);
            continue;
        }
        Py_ssize_t vl = BYTES_SIZE(val);
        put_varint(&b, (uint64_t)vl + 1);
        memcpy(b.p + b.len, BYTES_DATA(val), (size_t)vl);
        b.len += (size_t)vl;
    }
    return take(&b);
}

static PyMethodDef methods[] = {
    {"noop", noop, METH_NOARGS, NULL},
    {"call_c", call_c, METH_VARARGS, NULL},
    {"call_go", call_go, METH_VARARGS, NULL},
    {"pack_snapshot", pack_snapshot, METH_VARARGS, NULL},
    {"pack_rows", pack_rows, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "abi3bench", NULL, -1, methods};

PyMODINIT_FUNC PyInit_abi3bench(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "FLAVOUR", FLAVOUR) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
