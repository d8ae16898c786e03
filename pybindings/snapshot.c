// Packing a snapshot straight from the state store's dicts: for every
// touched key, call .snapshot() on its live object, pickle the result
// (pickle.c's writer for plain values, else pickle.dumps) and append the row to one malloc'd buffer in the rowbatch format, which the
// Go core then takes over (store.c). This is the only packer of snapshot
// rows. Doing the loop in C skips a tuple and a list append per row on the
// hot path of every epoch.
#include "module.h"

#include <stdlib.h>
#include <string.h>

static void put_varint(mp_buf *b, uint64_t v) {
    while (v >= 0x80) {
        b->p[b->len++] = (char)(v | 0x80);
        v >>= 7;
    }
    b->p[b->len++] = (char)v;
}

// n bytes behind their length plus extra (values count from 1: a 0 is a
// deletion).
static int put_prefixed(mp_buf *b, const char *s, size_t n, size_t extra) {
    if (mp_buf_grow(b, n + 10) < 0) return -1;
    put_varint(b, n + extra);
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static int put_bytes(mp_buf *b, const char *s, size_t n) { return put_prefixed(b, s, n, 0); }

static int put_value(mp_buf *b, const char *s, size_t n) { return put_prefixed(b, s, n, 1); }

// The C writer gives up on a state only after walking it; a step whose
// states are not plain (a class of the user's deep inside) would pay that
// walk on top of pickle.dumps for every key. After this many keys of a
// step in a row that it gave up on, the rest of the step's keys in this
// snapshot go straight to dumps.
enum { GIVE_UP_AFTER = 8 };

// Bytes a kept pickle costs beyond its own: the bytes object's header and
// its dict entry, about.
enum { KEPT_OVERHEAD = 64 };

// Keeps pickled (NULL: nothing) as key's last pickle in kept (a step's
// dict of them) while carry's budget allows; otherwise forgets the one it
// kept, which no longer is the key's state. -1 with an exception set on
// error.
static int keep(mp_carry *carry, PyObject *kept, PyObject *key, PyObject *pickled) {
    PyObject *old = PyDict_GetItemWithError(kept, key);
    if (old == NULL && PyErr_Occurred()) return -1;
    Py_ssize_t was = old ? PyBytes_GET_SIZE(old) + KEPT_OVERHEAD : 0;
    Py_ssize_t now = pickled ? PyBytes_GET_SIZE(pickled) + KEPT_OVERHEAD : 0;
    if (pickled != NULL && carry->held - was + now <= carry->budget) {
        if (PyDict_SetItem(kept, key, pickled) < 0) return -1;
        carry->held += now - was;
        return 0;
    }
    if (old == NULL) return 0;
    carry->held -= was;
    return PyDict_DelItem(kept, key);
}

// The dict of kept pickles of step (made on first use).
static PyObject *kept_of(mp_carry *carry, PyObject *step) {
    PyObject *kept = PyDict_GetItemWithError(carry->packed, step);
    if (kept != NULL || PyErr_Occurred()) return kept;
    kept = PyDict_New();
    if (kept == NULL) return NULL;
    int rc = PyDict_SetItem(carry->packed, step, kept);
    Py_DECREF(kept);  // the step's dict holds it
    return rc < 0 ? NULL : kept;
}

// Appends a deletion's value marker, and forgets what was kept of key.
static int put_deletion(mp_buf *b, mp_carry *carry, PyObject *kept, PyObject *key) {
    if (mp_buf_grow(b, 1) < 0) return -1;
    put_varint(b, 0);
    return kept != NULL ? keep(carry, kept, key, NULL) : 0;
}

// mp_pack_snapshot(dirty: dict[str, dict[str, None]], live: dict[str,
// dict[str, obj]], deleted, dumps, protocol) packs every touched key (a
// deletion for a touched key that is not live) and returns the buffer and
// its length. With deleted ({step: set of keys}, else NULL) the batch is
// the whole state instead: every live key of each step of dirty, in the
// live dict's order, each object taken as the dict is walked (no lookup),
// then a deletion for each key in deleted[step]. Any error propagates as
// is (NULL); the caller redoes the work in Python to name the step and
// key. With carry (else NULL), each key packed is kept there, and when
// carry->topped_up a live key that dirty does not hold (the epoch did not
// touch it) is copied from there if it is kept.
char *mp_pack_snapshot(PyObject *dirty, PyObject *live, PyObject *deleted, PyObject *dumps, PyObject *protocol,
                       mp_carry *carry, size_t *out_len) {
    Py_ssize_t count = 0, pos = 0;
    PyObject *step, *keys;
    while (PyDict_Next(dirty, &pos, &step, &keys)) {
        if (!PyDict_Check(keys)) {
            PyErr_SetString(PyExc_TypeError, "pack_snapshot: dirty values must be dicts of touched keys");
            return NULL;
        }
        if (deleted == NULL) {
            count += PyDict_GET_SIZE(keys);
            continue;
        }
        PyObject *objs = PyDict_GetItemWithError(live, step);
        PyObject *gone = PyDict_GetItemWithError(deleted, step);
        if (objs == NULL || !PyDict_Check(objs) || (gone != NULL && !PyAnySet_Check(gone))) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "pack_snapshot: step without live objects");
            return NULL;
        }
        count += PyDict_GET_SIZE(objs) + (gone ? PySet_GET_SIZE(gone) : 0);
    }
    mp_buf b = {0};
    // A state's pickle is written here first (pickle.c), then copied
    // behind its length.
    mp_buf scratch = {0};
    if (mp_buf_grow(&b, 16) < 0) return NULL;
    memcpy(b.p, "MPB1", 4);
    b.len = 4;
    put_varint(&b, (uint64_t)count);
    // mp_fast_pickle leaves a protocol it cannot write to dumps.
    long proto = PyLong_Check(protocol) ? PyLong_AsLong(protocol) : -1;
    if (proto == -1 && PyErr_Occurred()) PyErr_Clear();
    if (proto > 255) proto = -1;
    PyObject *snapshot_name = PyUnicode_InternFromString("snapshot");
    if (snapshot_name == NULL) goto fail;
    pos = 0;
    while (PyDict_Next(dirty, &pos, &step, &keys)) {
        int from_live = deleted != NULL;
        if (!from_live && PyDict_GET_SIZE(keys) == 0) continue;
        Py_ssize_t sl;
        const char *s = PyUnicode_AsUTF8AndSize(step, &sl);
        if (s == NULL) goto fail;
        PyObject *objs = PyDict_GetItemWithError(live, step);
        if (objs == NULL || !PyDict_Check(objs)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "pack_snapshot: step without live objects");
            goto fail;
        }
        // The keys packed: the touched ones, or every live one.
        PyObject *walked = from_live ? objs : keys;
        Py_ssize_t kpos = 0, touched = PyDict_GET_SIZE(walked);
        int misses = 0;
        PyObject *kept = NULL;
        if (carry != NULL && (kept = kept_of(carry, step)) == NULL) goto fail;
        int topped_up = from_live && carry != NULL && carry->topped_up;
        PyObject *key, *value;
        while (PyDict_Next(walked, &kpos, &key, &value)) {
            // .snapshot() is user code: if it touched the store, the walk
            // over the touched keys is no longer sound.
            if (PyDict_GET_SIZE(walked) != touched) {
                PyErr_SetString(PyExc_RuntimeError, "state store changed during snapshot (a .snapshot() method touched it)");
                goto fail;
            }
            Py_ssize_t kl;
            const char *k = PyUnicode_AsUTF8AndSize(key, &kl);
            PyObject *obj = k == NULL ? NULL : from_live ? value : PyDict_GetItemWithError(objs, key);
            if (k == NULL || (obj == NULL && PyErr_Occurred()) || put_bytes(&b, s, (size_t)sl) < 0 ||
                put_bytes(&b, k, (size_t)kl) < 0) {
                goto fail;
            }
            if (obj == NULL) {  // discarded: a deletion
                if (put_deletion(&b, carry, kept, key) < 0) goto fail;
                continue;
            }
            if (topped_up) {
                // A key the epoch did not touch still packs to what it
                // packed to last time: copy that if it was kept.
                int in = PyDict_Contains(keys, key);
                if (in < 0) goto fail;
                PyObject *last = in ? NULL : PyDict_GetItemWithError(kept, key);
                if (last != NULL) {
                    if (put_value(&b, PyBytes_AS_STRING(last), (size_t)PyBytes_GET_SIZE(last)) < 0) goto fail;
                    carry->reused++;
                    continue;
                }
                if (PyErr_Occurred()) goto fail;
            }
            PyObject *state = PyObject_CallMethodNoArgs(obj, snapshot_name);
            int rc = state && misses < GIVE_UP_AFTER ? mp_fast_pickle(state, (int)proto, &scratch) : 1;
            if (rc <= 0) {
                Py_DECREF(state);
                if (rc < 0 || put_value(&b, scratch.p, scratch.len) < 0) goto fail;
                if (kept != NULL) {
                    PyObject *pickled = PyBytes_FromStringAndSize(scratch.p, (Py_ssize_t)scratch.len);
                    rc = pickled ? keep(carry, kept, key, pickled) : -1;
                    Py_XDECREF(pickled);
                    if (rc < 0) goto fail;
                }
                scratch.len = 0;
                misses = 0;
                continue;
            }
            misses++;
            PyObject *argv[2] = {state, protocol};
            PyObject *pickled = state ? PyObject_Vectorcall(dumps, argv, 2, NULL) : NULL;
            Py_XDECREF(state);
            if (pickled == NULL || !PyBytes_Check(pickled)) {
                if (pickled != NULL) PyErr_SetString(PyExc_TypeError, "pack_snapshot: dumps must return bytes");
                Py_XDECREF(pickled);
                goto fail;
            }
            rc = put_value(&b, PyBytes_AS_STRING(pickled), (size_t)PyBytes_GET_SIZE(pickled));
            if (rc == 0 && kept != NULL) rc = keep(carry, kept, key, pickled);
            Py_DECREF(pickled);
            if (rc < 0) goto fail;
        }
        // A whole batch's deletions follow its live keys.
        PyObject *gone = from_live ? PyDict_GetItemWithError(deleted, step) : NULL;
        if (gone == NULL && PyErr_Occurred()) goto fail;
        PyObject *it = gone ? PyObject_GetIter(gone) : NULL;
        if (gone != NULL && it == NULL) goto fail;
        while (it != NULL && (key = PyIter_Next(it)) != NULL) {
            Py_ssize_t kl;
            const char *k = PyUnicode_AsUTF8AndSize(key, &kl);
            int rc = k == NULL || put_bytes(&b, s, (size_t)sl) < 0 || put_bytes(&b, k, (size_t)kl) < 0 ||
                             put_deletion(&b, carry, kept, key) < 0
                         ? -1
                         : 0;
            Py_DECREF(key);
            if (rc < 0) {
                Py_DECREF(it);
                goto fail;
            }
        }
        Py_XDECREF(it);
        if (PyErr_Occurred()) goto fail;
    }
    Py_DECREF(snapshot_name);
    free(scratch.p);
    *out_len = b.len;
    return b.p;
fail:
    Py_XDECREF(snapshot_name);
    free(scratch.p);
    free(b.p);
    return NULL;
}
