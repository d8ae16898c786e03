// millpond._core: scans of a store's rows (scan.go): pages of packed rows
// decoded into Python objects, or straight into live state objects.
#include "module.h"

#include <stdlib.h>
#include <string.h>

#include "_cgo_export.h"

MP_METHOD(scan_open) {
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
static PyObject *unpack_kv(const char *buf, size_t len) {
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

// The key object of asked (a sorted list of str) whose UTF-8 is k, moving
// *j past the smaller ones; NULL if asked has none (new reference).
static PyObject *asked_key(PyObject *asked, Py_ssize_t *j, const char *k, size_t kl) {
    for (; *j < PyList_GET_SIZE(asked); (*j)++) {
        PyObject *a = PyList_GET_ITEM(asked, *j);
        Py_ssize_t al;
        const char *as = PyUnicode_AsUTF8AndSize(a, &al);  // encoded when asked
        if (as == NULL) {
            PyErr_Clear();
            continue;
        }
        int c = memcmp(as, k, (size_t)al < kl ? (size_t)al : kl);
        if (c == 0) c = ((size_t)al > kl) - ((size_t)al < kl);
        if (c == 0) return Py_NewRef(a);
        if (c > 0) break;
    }
    return NULL;
}

// Builds live objects from a packed page (declared in module.h; scans and
// store_hydrate_keys share it). Doing this loop in C keeps a restore's
// per-key cost to the unpickling and the builder themselves.
Py_ssize_t mp_hydrate_page(const char *buf, size_t len, PyObject *asked, PyObject *live, PyObject *skip,
                           PyObject *builder, PyObject *loads) {
    Py_ssize_t j = 0;
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
        PyObject *k = asked ? asked_key(asked, &j, e.key, e.key_len) : NULL;
        if (k == NULL) k = PyUnicode_DecodeUTF8(e.key, (Py_ssize_t)e.key_len, "surrogatepass");
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

MP_METHOD(scan_hydrate) {
    unsigned long long h;
    PyObject *live, *skip, *builder, *loads;
    if (!PyArg_ParseTuple(args, "KO!O!OO", &h, &PyDict_Type, &live, &PySet_Type, &skip, &builder, &loads)) return NULL;
    char *out = NULL;
    size_t len = 0;
    CALL_GO(mp_scan_next(h, &out, &len, &kind, &msg));
    if (out == NULL) Py_RETURN_NONE;
    Py_ssize_t built = mp_hydrate_page(out, len, NULL, live, skip, builder, loads);
    free(out);
    if (built < 0) return NULL;
    return PyLong_FromSsize_t(built);
}

MP_METHOD(scan_next) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    char *out = NULL;
    size_t len = 0;
    CALL_GO(mp_scan_next(h, &out, &len, &kind, &msg));
    if (out == NULL) Py_RETURN_NONE;
    PyObject *list = unpack_kv(out, len);
    free(out);
    return list;
}

MP_METHOD(scan_close) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    mp_scan_close(h);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
