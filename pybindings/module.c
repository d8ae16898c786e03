// millpond._core: the CPython face of the Go core.
//
// This file owns everything that touches Python objects: argument parsing,
// packing snapshot rows into one buffer, unpacking results into Python
// objects. Each call into Go runs with the GIL released; Go never sees a
// PyObject.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cgo_export.h"
#include "module.h"

PyObject *mp_CoreError = NULL;

// Raise _core.CoreError(kind, message) and free the Go-allocated message.
PyObject *mp_raise(int kind, char *msg) {
    PyObject *args = Py_BuildValue("(is)", kind, msg ? msg : "unknown error in the Go core");
    free(msg);
    if (args != NULL) {
        PyErr_SetObject(mp_CoreError, args);
        Py_DECREF(args);
    }
    return NULL;
}

// ---- varints -------------------------------------------------------------

static inline char *put_uvarint(char *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (char)(v | 0x80);
        v >>= 7;
    }
    *p++ = (char)v;
    return p;
}

// Reads a uvarint; returns NULL if it runs past end.
const char *mp_get_uvarint(const char *p, const char *end, uint64_t *out) {
    uint64_t v = 0;
    int shift = 0;
    while (p < end && shift < 64) {
        unsigned char b = (unsigned char)*p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (b < 0x80) {
            *out = v;
            return p;
        }
        shift += 7;
    }
    return NULL;
}

// ---- store ---------------------------------------------------------------

static PyObject *store_open(PyObject *self, PyObject *args) {
    const char *dir, *flow;
    int wi, wc, kg;
    long long execution, resume;
    if (!PyArg_ParseTuple(args, "ssiiiLL", &dir, &flow, &wi, &wc, &kg, &execution, &resume)) return NULL;
    uintptr_t h = 0;
    CALL_GO(mp_store_open((char *)dir, (char *)flow, wi, wc, kg, execution, resume, &h, &kind, &msg));
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject *store_close(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    CALL_GO(mp_store_close(h, &kind, &msg));
    Py_RETURN_NONE;
}

// Packs rows, a list of (step: str, key: str, value: bytes | None), into
// the rowbatch wire format; a bytes object is taken as already packed
// (pack_snapshot). Returns a malloc'd buffer or NULL with an exception set.
char *mp_pack_rows(PyObject *rows, size_t *out_len) {
    if (PyBytes_Check(rows)) {
        size_t n = (size_t)PyBytes_GET_SIZE(rows);
        char *copy = malloc(n ? n : 1);
        if (copy == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        memcpy(copy, PyBytes_AS_STRING(rows), n);
        *out_len = n;
        return copy;
    }
    if (!PyList_Check(rows)) {
        PyErr_SetString(PyExc_TypeError, "rows must be a list of (step_id, key, value) tuples");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(rows);
    size_t size = 4 + 10;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) {
            PyErr_Format(PyExc_TypeError, "row %zd must be a (step_id, key, value) tuple", i);
            return NULL;
        }
        PyObject *step = PyTuple_GET_ITEM(t, 0), *key = PyTuple_GET_ITEM(t, 1), *val = PyTuple_GET_ITEM(t, 2);
        Py_ssize_t sl, kl;
        if (!PyUnicode_Check(step) || PyUnicode_AsUTF8AndSize(step, &sl) == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "row %zd: step id must be str", i);
            return NULL;
        }
        if (!PyUnicode_Check(key) || PyUnicode_AsUTF8AndSize(key, &kl) == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "row %zd: state key must be str, got %.100s", i, Py_TYPE(key)->tp_name);
            return NULL;
        }
        size += 30 + (size_t)sl + (size_t)kl;
        if (val == Py_None) continue;
        if (!PyBytes_Check(val)) {
            PyErr_Format(PyExc_TypeError, "row %zd: value must be bytes or None", i);
            return NULL;
        }
        size += (size_t)PyBytes_GET_SIZE(val);
    }
    char *buf = malloc(size);
    if (buf == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    char *p = buf;
    memcpy(p, "MPB1", 4);
    p += 4;
    p = put_uvarint(p, (uint64_t)n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(rows, i);
        PyObject *val = PyTuple_GET_ITEM(t, 2);
        Py_ssize_t sl, kl;
        const char *s = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(t, 0), &sl);
        const char *k = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(t, 1), &kl);
        p = put_uvarint(p, (uint64_t)sl);
        memcpy(p, s, (size_t)sl);
        p += sl;
        p = put_uvarint(p, (uint64_t)kl);
        memcpy(p, k, (size_t)kl);
        p += kl;
        if (val == Py_None) {
            p = put_uvarint(p, 0);
            continue;
        }
        Py_ssize_t vl = PyBytes_GET_SIZE(val);
        p = put_uvarint(p, (uint64_t)vl + 1);
        memcpy(p, PyBytes_AS_STRING(val), (size_t)vl);
        p += vl;
    }
    *out_len = (size_t)(p - buf);
    return buf;
}

static PyObject *store_write(PyObject *self, PyObject *args) {
    unsigned long long h;
    long long epoch;
    PyObject *rows;
    if (!PyArg_ParseTuple(args, "KLO", &h, &epoch, &rows)) return NULL;
    size_t len = 0;
    char *buf = mp_pack_rows(rows, &len);
    if (buf == NULL) return NULL;
    long long written = 0;
    int kind = 0;
    char *msg = NULL;
    Py_BEGIN_ALLOW_THREADS
    kind = mp_store_write(h, epoch, buf, len, &written, &kind, &msg);
    free(buf);
    Py_END_ALLOW_THREADS
    if (kind) return mp_raise(kind, msg);
    return PyLong_FromLongLong(written);
}

static PyObject *store_get(PyObject *self, PyObject *args) {
    unsigned long long h;
    const char *step, *key;
    Py_ssize_t sl, kl;
    if (!PyArg_ParseTuple(args, "Ks#s#", &h, &step, &sl, &key, &kl)) return NULL;
    int found = 0, kind = 0;
    long long epoch = 0;
    char *val = NULL, *msg = NULL;
    size_t vl = 0;
    Py_BEGIN_ALLOW_THREADS
    kind = mp_store_get(h, (char *)step, (size_t)sl, (char *)key, (size_t)kl, &found, &epoch, &val, &vl, &kind, &msg);
    Py_END_ALLOW_THREADS
    if (kind) return mp_raise(kind, msg);
    if (found == 0) Py_RETURN_NONE;
    if (found == 2) return Py_BuildValue("(LO)", epoch, Py_None);
    PyObject *b = PyBytes_FromStringAndSize(val ? val : "", (Py_ssize_t)vl);
    free(val);
    if (b == NULL) return NULL;
    PyObject *res = Py_BuildValue("(LN)", epoch, b);
    return res;
}

static PyObject *store_steps(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    char *out = NULL;
    size_t len = 0;
    CALL_GO(mp_store_steps(h, &out, &len, &kind, &msg));
    PyObject *list = PyList_New(0);
    if (list == NULL) {
        free(out);
        return NULL;
    }
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        if (out[i] != 0) continue;
        PyObject *s = PyUnicode_DecodeUTF8(out + start, (Py_ssize_t)(i - start), "strict");
        if (s == NULL || PyList_Append(list, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(list);
            free(out);
            return NULL;
        }
        Py_DECREF(s);
        start = i + 1;
    }
    free(out);
    return list;
}

static PyObject *store_meta(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    long long v[9] = {0};
    CALL_GO(mp_store_meta(h, v, &kind, &msg));
    return Py_BuildValue("{sLsLsLsLsLsLsLsLsL}", "worker_index", v[0], "worker_count", v[1],
                         "key_group_count", v[2], "execution", v[3], "last_epoch", v[4], "gc_epoch", v[5],
                         "rows", v[6], "deletions", v[7], "value_bytes", v[8]);
}

typedef int (*epoch_op)(uintptr_t, long long, long long *, int *, char **);

static PyObject *call_epoch_op(PyObject *args, epoch_op op) {
    unsigned long long h;
    long long epoch;
    if (!PyArg_ParseTuple(args, "KL", &h, &epoch)) return NULL;
    long long n = 0;
    CALL_GO(op(h, epoch, &n, &kind, &msg));
    return PyLong_FromLongLong(n);
}

static PyObject *store_gc(PyObject *self, PyObject *args) { return call_epoch_op(args, (epoch_op)mp_store_gc); }

static PyObject *store_delete_from(PyObject *self, PyObject *args) {
    return call_epoch_op(args, (epoch_op)mp_store_delete_from);
}

// ---- scans ---------------------------------------------------------------

static PyObject *scan_open(PyObject *self, PyObject *args) {
    unsigned long long h;
    const char *step;
    int chunk;
    if (!PyArg_ParseTuple(args, "Ksi", &h, &step, &chunk)) return NULL;
    uintptr_t out = 0;
    CALL_GO(mp_scan_open(h, (char *)step, chunk, &out, &kind, &msg));
    return PyLong_FromUnsignedLongLong(out);
}

// One entry of a packed scan page (see snapfile/page.go).
typedef struct {
    const char *key;
    size_t key_len;
    const char *val;  // NULL for a deletion
    size_t val_len;
} mp_entry;

// Reads the next entry at *p; returns 0 at a malformed entry.
static int next_entry(const char **p, const char *end, mp_entry *e) {
    uint64_t kl, epoch, tag;
    const char *q = *p;
    if ((q = mp_get_uvarint(q, end, &kl)) == NULL || kl > (uint64_t)(end - q)) return 0;
    e->key = q;
    e->key_len = (size_t)kl;
    q += kl;
    if ((q = mp_get_uvarint(q, end, &epoch)) == NULL) return 0;
    if ((q = mp_get_uvarint(q, end, &tag)) == NULL) return 0;
    if (tag == 0) {
        e->val = NULL;
        e->val_len = 0;
    } else {
        if (tag - 1 > (uint64_t)(end - q)) return 0;
        e->val = q;
        e->val_len = (size_t)(tag - 1);
        q += tag - 1;
    }
    *p = q;
    return 1;
}

static PyObject *malformed_page(void) {
    PyErr_SetString(PyExc_RuntimeError, "millpond._core: malformed page from the Go core");
    return NULL;
}

// Decodes a packed page into a list of (key, bytes | None) tuples.
PyObject *mp_unpack_kv(const char *buf, size_t len) {
    const char *p = buf, *end = buf + len;
    uint64_t n;
    if ((p = mp_get_uvarint(p, end, &n)) == NULL || n > len) return malformed_page();
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL) return NULL;
    for (uint64_t i = 0; i < n; i++) {
        mp_entry e;
        if (!next_entry(&p, end, &e)) {
            Py_DECREF(list);
            return malformed_page();
        }
        PyObject *k = PyUnicode_DecodeUTF8(e.key, (Py_ssize_t)e.key_len, "surrogatepass");
        PyObject *v = e.val ? PyBytes_FromStringAndSize(e.val, (Py_ssize_t)e.val_len) : Py_NewRef(Py_None);
        PyObject *t = (k && v) ? PyTuple_Pack(2, k, v) : NULL;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (t == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    return list;
}

// Builds live objects from a packed page: for every key not in live and not
// in skip, live[key] = builder(loads(value)). Doing this loop in C keeps a
// restore's per-key cost to the unpickling and the builder themselves.
static Py_ssize_t hydrate_page(const char *buf, size_t len, PyObject *live, PyObject *skip, PyObject *builder,
                               PyObject *loads) {
    const char *p = buf, *end = buf + len;
    uint64_t n;
    if ((p = mp_get_uvarint(p, end, &n)) == NULL || n > len) {
        malformed_page();
        return -1;
    }
    Py_ssize_t built = 0;
    for (uint64_t i = 0; i < n; i++) {
        mp_entry e;
        if (!next_entry(&p, end, &e)) {
            malformed_page();
            return -1;
        }
        if (e.val == NULL) continue;
        PyObject *k = PyUnicode_DecodeUTF8(e.key, (Py_ssize_t)e.key_len, "surrogatepass");
        if (k == NULL) return -1;
        int present = PyDict_Contains(live, k);
        if (present == 0) present = PySet_Contains(skip, k);
        if (present != 0) {
            Py_DECREF(k);
            if (present < 0) return -1;
            continue;
        }
        PyObject *v = PyBytes_FromStringAndSize(e.val, (Py_ssize_t)e.val_len);
        PyObject *state = v ? PyObject_CallOneArg(loads, v) : NULL;
        Py_XDECREF(v);
        PyObject *obj = state ? PyObject_CallOneArg(builder, state) : NULL;
        Py_XDECREF(state);
        if (obj == NULL || PyDict_SetItem(live, k, obj) < 0) {
            Py_XDECREF(obj);
            Py_DECREF(k);
            return -1;
        }
        Py_DECREF(obj);
        Py_DECREF(k);
        built++;
    }
    return built;
}

static PyObject *scan_hydrate(PyObject *self, PyObject *args) {
    unsigned long long h;
    PyObject *live, *skip, *builder, *loads;
    if (!PyArg_ParseTuple(args, "KO!O!OO", &h, &PyDict_Type, &live, &PySet_Type, &skip, &builder, &loads)) return NULL;
    char *out = NULL;
    size_t len = 0;
    CALL_GO(mp_scan_next(h, &out, &len, &kind, &msg));
    if (out == NULL) Py_RETURN_NONE;
    Py_ssize_t built = hydrate_page(out, len, live, skip, builder, loads);
    free(out);
    if (built < 0) return NULL;
    return PyLong_FromSsize_t(built);
}

static PyObject *scan_next(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    char *out = NULL;
    size_t len = 0;
    CALL_GO(mp_scan_next(h, &out, &len, &kind, &msg));
    if (out == NULL) Py_RETURN_NONE;
    PyObject *list = mp_unpack_kv(out, len);
    free(out);
    return list;
}

static PyObject *scan_close(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    mp_scan_close(h);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

// ---- module --------------------------------------------------------------

static PyMethodDef methods[] = {
    {"store_open", store_open, METH_VARARGS,
     "store_open(dir, flow_id, worker_index, worker_count, key_group_count, execution, resume_epoch) -> handle"},
    {"store_close", store_close, METH_VARARGS, "store_close(handle)"},
    {"store_write", store_write, METH_VARARGS,
     "store_write(handle, epoch, rows: list[(step_id, key, bytes | None)]) -> rows written"},
    {"store_get", store_get, METH_VARARGS, "store_get(handle, step_id, key) -> None | (epoch, bytes | None)"},
    {"store_steps", store_steps, METH_VARARGS, "store_steps(handle) -> list of step ids with rows"},
    {"store_meta", store_meta, METH_VARARGS, "store_meta(handle) -> dict of metadata and row counts"},
    {"store_gc", store_gc, METH_VARARGS, "store_gc(handle, committed_epoch) -> rows removed"},
    {"store_delete_from", store_delete_from, METH_VARARGS, "store_delete_from(handle, epoch) -> rows removed"},
    {"scan_open", scan_open, METH_VARARGS, "scan_open(handle, step_id, chunk_rows) -> scan handle"},
    {"scan_next", scan_next, METH_VARARGS, "scan_next(scan) -> list[(key, bytes)] | None at the end"},
    {"scan_close", scan_close, METH_VARARGS, "scan_close(scan)"},
    {"scan_hydrate", scan_hydrate, METH_VARARGS,
     "scan_hydrate(scan, live: dict, skip: set, builder, loads) -> objects built from the next page | None at the end"},
    MP_EXTRA_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "millpond._core",
    "The Go core of millpond (state store, snapshots, durable recovery). Internal: use millpond.state.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__core(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    mp_CoreError = PyErr_NewExceptionWithDoc("millpond._core.CoreError",
                                             "An error from the Go core: args are (kind, message).", NULL, NULL);
    if (mp_CoreError == NULL || PyModule_AddObject(m, "CoreError", mp_CoreError) < 0) {
        Py_XDECREF(mp_CoreError);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(mp_CoreError);
    return m;
}
