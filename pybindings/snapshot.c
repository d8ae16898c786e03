// Packing a snapshot straight from the state store's dicts: for every
// touched key, call .snapshot() on its live object, pickle the result and
// append the row to one malloc'd buffer in the rowbatch format, which the
// Go core then takes over (store.c). This is the only packer of snapshot
// rows. Doing the loop in C skips a tuple and a list append per row on the
// hot path of every epoch.
#include "module.h"

#include <stdlib.h>
#include <string.h>

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

// small_pickle writes the pickle of a state that is None, a bool or an int
// that fits 32 bits (counters: the most common state there is) into out,
// and returns its length, or 0 for any other state (pickled by dumps).
// The bytes are what the protocol defines for these values (BININT1,
// BININT2, BININT, NONE, NEWTRUE, NEWFALSE), without the frame header that
// pickle.dumps adds from protocol 4 on, which loads do not need. Calling
// dumps costs a pickler object per row: a third of a word count's snapshot.
static size_t small_pickle(PyObject *state, int protocol, char out[8]) {
    size_t n = 0;
    out[n++] = (char)0x80;
    out[n++] = (char)protocol;
    if (state == Py_None) {
        out[n++] = 'N';
    } else if (state == Py_True) {
        out[n++] = (char)0x88;
    } else if (state == Py_False) {
        out[n++] = (char)0x89;
    } else if (PyLong_CheckExact(state)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(state, &overflow);
        if (overflow || v < INT32_MIN || v > INT32_MAX) return 0;
        if (v >= 0 && v < 256) {
            out[n++] = 'K';
            out[n++] = (char)v;
        } else if (v >= 0 && v < 65536) {
            out[n++] = 'M';
            out[n++] = (char)(v & 0xff);
            out[n++] = (char)(v >> 8);
        } else {
            uint32_t u = (uint32_t)(int32_t)v;
            out[n++] = 'J';
            for (int i = 0; i < 4; i++) out[n++] = (char)(u >> (8 * i));
        }
    } else {
        return 0;
    }
    out[n++] = '.';
    return n;
}

// mp_pack_snapshot(dirty: dict[str, dict[str, None]], live: dict[str,
// dict[str, obj]], dumps, protocol) packs every touched key (a deletion
// for a touched key that is not live) and returns the buffer and its
// length. Any error propagates as is (NULL); the caller redoes the work in
// Python to name the step and key.
char *mp_pack_snapshot(PyObject *dirty, PyObject *live, PyObject *dumps, PyObject *protocol, size_t *out_len) {
    Py_ssize_t count = 0, pos = 0;
    PyObject *step, *keys;
    while (PyDict_Next(dirty, &pos, &step, &keys)) {
        if (!PyDict_Check(keys)) {
            PyErr_SetString(PyExc_TypeError, "pack_snapshot: dirty values must be dicts of touched keys");
            return NULL;
        }
        count += PyDict_GET_SIZE(keys);
    }
    buf_t b = {0};
    if (grow(&b, 16) < 0) return NULL;
    memcpy(b.p, "MPB1", 4);
    b.len = 4;
    put_varint(&b, (uint64_t)count);
    // The opcodes small_pickle writes exist from protocol 2 on.
    long proto = PyLong_Check(protocol) ? PyLong_AsLong(protocol) : -1;
    if (proto == -1 && PyErr_Occurred()) PyErr_Clear();
    int small = proto >= 2 && proto <= 255;
    PyObject *snapshot_name = PyUnicode_InternFromString("snapshot");
    if (snapshot_name == NULL) goto fail;
    pos = 0;
    while (PyDict_Next(dirty, &pos, &step, &keys)) {
        if (PyDict_GET_SIZE(keys) == 0) continue;
        Py_ssize_t sl;
        const char *s = PyUnicode_AsUTF8AndSize(step, &sl);
        if (s == NULL) goto fail;
        PyObject *objs = PyDict_GetItemWithError(live, step);
        if (objs == NULL || !PyDict_Check(objs)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "pack_snapshot: step without live objects");
            goto fail;
        }
        Py_ssize_t kpos = 0, touched = PyDict_GET_SIZE(keys);
        PyObject *key, *unused;
        while (PyDict_Next(keys, &kpos, &key, &unused)) {
            // .snapshot() is user code: if it touched the store, the walk
            // over the touched keys is no longer sound.
            if (PyDict_GET_SIZE(keys) != touched) {
                PyErr_SetString(PyExc_RuntimeError, "state store changed during snapshot (a .snapshot() method touched it)");
                goto fail;
            }
            Py_ssize_t kl;
            const char *k = PyUnicode_AsUTF8AndSize(key, &kl);
            PyObject *obj = k ? PyDict_GetItemWithError(objs, key) : NULL;
            if (k == NULL || (obj == NULL && PyErr_Occurred()) || put_bytes(&b, s, (size_t)sl) < 0 ||
                put_bytes(&b, k, (size_t)kl) < 0) {
                goto fail;
            }
            if (obj == NULL) {  // discarded: a deletion
                if (grow(&b, 1) < 0) goto fail;
                put_varint(&b, 0);
                continue;
            }
            PyObject *state = PyObject_CallMethodNoArgs(obj, snapshot_name);
            char tiny[8];
            size_t tn = small && state ? small_pickle(state, (int)proto, tiny) : 0;
            if (tn > 0) {
                Py_DECREF(state);
                if (grow(&b, tn + 10) < 0) goto fail;
                put_varint(&b, (uint64_t)tn + 1);
                memcpy(b.p + b.len, tiny, tn);
                b.len += tn;
                continue;
            }
            PyObject *argv[2] = {state, protocol};
            PyObject *pickled = state ? PyObject_Vectorcall(dumps, argv, 2, NULL) : NULL;
            Py_XDECREF(state);
            if (pickled == NULL || !PyBytes_Check(pickled)) {
                if (pickled != NULL) PyErr_SetString(PyExc_TypeError, "pack_snapshot: dumps must return bytes");
                Py_XDECREF(pickled);
                goto fail;
            }
            Py_ssize_t vl = PyBytes_GET_SIZE(pickled);
            if (grow(&b, (size_t)vl + 10) < 0) {
                Py_DECREF(pickled);
                goto fail;
            }
            put_varint(&b, (uint64_t)vl + 1);
            memcpy(b.p + b.len, PyBytes_AS_STRING(pickled), (size_t)vl);
            b.len += (size_t)vl;
            Py_DECREF(pickled);
        }
    }
    Py_DECREF(snapshot_name);
    *out_len = b.len;
    return b.p;
fail:
    Py_XDECREF(snapshot_name);
    free(b.p);
    return NULL;
}
