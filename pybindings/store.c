// millpond._core: stores (store.go).
#include "module.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "_cgo_export.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

MP_METHOD(store_open) {
    const char *dir, *flow;
    int wi, wc, kg;
    long long execution, resume;
    if (!PyArg_ParseTuple(args, "ssiiiLL", &dir, &flow, &wi, &wc, &kg, &execution, &resume)) return NULL;
    uintptr_t h = 0;
    CALL_GO(mp_store_open((char *)dir, (char *)flow, wi, wc, kg, execution, resume, &h, &kind, &msg));
    return PyLong_FromUnsignedLongLong(h);
}

MP_METHOD(store_close) { return mp_call_handle(args, mp_store_close); }

// The one way a snapshot is written: packed once, here, into a buffer that
// the Go core takes over (it frees it when its last reader is done), and
// written through the store's handle, alone or owned by a run.
MP_METHOD(store_snapshot) {
    unsigned long long h;
    long long epoch;
    PyObject *dirty, *live, *dumps, *protocol, *packed = Py_None, *deleted = Py_None;
    int whole = 0;
    mp_carry carry = {0};
    if (!PyArg_ParseTuple(args, "KLO!O!OOi|OpnnOp", &h, &epoch, &PyDict_Type, &dirty, &PyDict_Type, &live, &dumps,
                          &protocol, &whole, &packed, &carry.topped_up, &carry.budget, &carry.held, &deleted,
                          &carry.marked))
        return NULL;
    if ((packed != Py_None && !PyDict_CheckExact(packed)) || (deleted != Py_None && !PyDict_Check(deleted))) {
        PyErr_SetString(PyExc_TypeError, "store_snapshot: packed and deleted must be dicts or None");
        return NULL;
    }
    if (whole < 0 || whole > 2 || (whole == 2 && deleted != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "store_snapshot: whole must be 0, 1 or 2 (2 packs touched keys: no deleted)");
        return NULL;
    }
    carry.packed = packed == Py_None ? NULL : packed;
    double t0 = now_seconds();
    size_t len = 0;
    char *buf = mp_pack_snapshot(dirty, live, deleted == Py_None ? NULL : deleted, dumps, protocol,
                                 &carry, &len);
    if (buf == NULL) return NULL;
    double t1 = now_seconds();
    long long written = 0, carried = 0;
    CALL_GO(mp_store_write(h, epoch, whole, buf, len, &written, &carried, &kind, &msg));
    double t2 = now_seconds();
    return Py_BuildValue("(LddnnnL)", written, t1 - t0, t2 - t1, carry.reused, carry.held, carry.ahead, carried);
}

MP_METHOD(store_carries) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    int out = 0;
    CALL_GO(mp_store_carries(h, &out, &kind, &msg));
    return PyBool_FromLong(out);
}

MP_METHOD(store_carry_off) { return mp_call_handle(args, mp_store_carry_off); }

MP_METHOD(store_get) {
    unsigned long long h;
    const char *step, *key;
    Py_ssize_t sl, kl;
    if (!PyArg_ParseTuple(args, "Ks#s#", &h, &step, &sl, &key, &kl)) return NULL;
    int found = 0;
    long long epoch = 0;
    char *val = NULL;
    size_t vl = 0;
    CALL_GO(mp_store_get(h, (char *)step, (size_t)sl, (char *)key, (size_t)kl, &found, &epoch, &val, &vl, &kind, &msg));
    if (found == 0) Py_RETURN_NONE;
    if (found == 2) return Py_BuildValue("(LO)", epoch, Py_None);
    PyObject *b = PyBytes_FromStringAndSize(val ? val : "", (Py_ssize_t)vl);
    free(val);
    if (b == NULL) return NULL;
    return Py_BuildValue("(LN)", epoch, b);
}

// Appends uvarint(n) and n bytes at s to the key list *buf (of *len bytes,
// *cap allocated); -1 with MemoryError set when it cannot grow.
static int put_key(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*cap - *len < n + 10) {
        size_t want = *cap * 2 > *len + n + 10 ? *cap * 2 : *len + n + 10;
        char *grown = realloc(*buf, want);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *buf = grown;
        *cap = want;
    }
    uint64_t v = n;
    while (v >= 0x80) {
        (*buf)[(*len)++] = (char)(v | 0x80);
        v >>= 7;
    }
    (*buf)[(*len)++] = (char)v;
    memcpy(*buf + *len, s, n);
    *len += n;
    return 0;
}

// Adds to absent (if not NULL) every key of keys that live does not hold.
static int add_absent(PyObject *keys, PyObject *live, PyObject *absent) {
    for (Py_ssize_t i = 0; absent != NULL && i < PyList_GET_SIZE(keys); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        int in = PyDict_Contains(live, key);
        if (in < 0 || (in == 0 && PySet_Add(absent, key) < 0)) return -1;
    }
    return 0;
}

// One call for the stored state of many keys: the keys not yet live and not
// in skip cross to the core in one buffer of length-prefixed UTF-8, sorted
// and each once, are looked up there in one pass (the GIL released), and
// come back as a packed page in the same order, which mp_hydrate_page turns
// into live objects under the key objects asked with (a str sorts as its
// UTF-8 does).
MP_METHOD(store_hydrate_keys) {
    unsigned long long h;
    const char *step;
    Py_ssize_t sl;
    PyObject *keys, *live, *skip, *builder, *loads, *absent = NULL;
    if (!PyArg_ParseTuple(args, "Ks#O!O!O!OO|O!", &h, &step, &sl, &PyList_Type, &keys, &PyDict_Type, &live, &PySet_Type,
                          &skip, &builder, &loads, &PySet_Type, &absent))
        return NULL;
    PyObject *asked = PyList_New(0);
    if (asked == NULL) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, count = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!PyUnicode_Check(key)) {
            PyErr_Format(PyExc_TypeError, "store_hydrate_keys: keys must be str, not %.100s", Py_TYPE(key)->tp_name);
            goto fail;
        }
        int present = PyDict_Contains(live, key);
        if (present == 0) present = PySet_Contains(skip, key);
        if (present < 0) goto fail;
        if (present) continue;
        // A key with a lone surrogate is never stored (snapshots refuse
        // it): it has no row, like any other key not found.
        if (PyUnicode_AsUTF8AndSize(key, NULL) == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) goto fail;
            PyErr_Clear();
            continue;
        }
        if (PyList_Append(asked, key) < 0) goto fail;
    }
    if (PyList_Sort(asked) < 0) goto fail;
    const char *prev = NULL;
    Py_ssize_t prev_len = -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(asked); i++) {
        Py_ssize_t kl;
        const char *k = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(asked, i), &kl);  // cached above
        if (kl == prev_len && memcmp(k, prev, (size_t)kl) == 0) continue;
        if (put_key(&buf, &len, &cap, k, (size_t)kl) < 0) goto fail;
        prev = k;
        prev_len = kl;
        count++;
    }
    if (count == 0) {
        Py_DECREF(asked);
        free(buf);
        return add_absent(keys, live, absent) < 0 ? NULL : PyLong_FromLong(0);
    }
    // CALL_GO's steps, with the key list freed before an error returns.
    char *out = NULL;
    size_t out_len = 0;
    int kind = 0;
    char *msg = NULL;
    Py_BEGIN_ALLOW_THREADS
    kind = mp_store_get_many(h, (char *)step, (size_t)sl, buf, len, count, &out, &out_len, &kind, &msg);
    Py_END_ALLOW_THREADS
    free(buf);
    if (kind) {
        Py_DECREF(asked);
        return mp_raise(kind, msg);
    }
    Py_ssize_t built = mp_hydrate_page(out, out_len, asked, live, skip, builder, loads);
    free(out);
    Py_DECREF(asked);
    if (built < 0 || add_absent(keys, live, absent) < 0) return NULL;
    return PyLong_FromSsize_t(built);
fail:
    Py_DECREF(asked);
    free(buf);
    return NULL;
}

MP_METHOD(store_steps) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    char *out = NULL;
    size_t len = 0;
    CALL_GO(mp_store_steps(h, &out, &len, &kind, &msg));
    PyObject *list = PyList_New(0);
    size_t start = 0;
    for (size_t i = 0; list != NULL && i < len; i++) {
        if (out[i] != 0) continue;
        PyObject *s = PyUnicode_DecodeUTF8(out + start, (Py_ssize_t)(i - start), "strict");
        if (s == NULL || PyList_Append(list, s) < 0) Py_CLEAR(list);
        Py_XDECREF(s);
        start = i + 1;
    }
    free(out);
    return list;
}

MP_METHOD(store_meta) { return mp_call_handle_json(args, mp_store_meta); }

MP_METHOD(store_gc) {
    unsigned long long h;
    long long committed;
    if (!PyArg_ParseTuple(args, "KL", &h, &committed)) return NULL;
    long long removed = 0;
    CALL_GO(mp_store_gc(h, committed, &removed, &kind, &msg));
    return PyLong_FromLongLong(removed);
}
