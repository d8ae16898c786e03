// Packing a snapshot straight from the state store's dicts: for every
// touched key, call .snapshot() on its live object, pickle the result
// (pickle.c's writer for plain values, else pickle.dumps) and append the
// row to one malloc'd buffer in the rowbatch format, which the
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

// keep, given what kept holds for key now (old, NULL for nothing).
static int keep_over(mp_carry *carry, PyObject *kept, PyObject *key, PyObject *old, PyObject *pickled) {
    Py_ssize_t was = old ? PyBytes_GET_SIZE(old) + KEPT_OVERHEAD : 0;
    Py_ssize_t now = pickled ? PyBytes_GET_SIZE(pickled) + KEPT_OVERHEAD : 0;
    if (pickled != NULL && carry->held - was + now <= carry->budget) {
        if (PyDict_SetItem(kept, key, pickled) < 0) return -1;
        carry->held += now - was;
        return 1;
    }
    if (old == NULL) return 0;
    carry->held -= was;
    return PyDict_DelItem(kept, key);
}

// Keeps pickled (NULL: nothing) as key's last pickle in kept (a step's
// dict of them) while carry's budget allows (1); otherwise forgets the one
// it kept, which no longer is the key's state (0). -1 with an exception set
// on error.
static int keep(mp_carry *carry, PyObject *kept, PyObject *key, PyObject *pickled) {
    PyObject *old = PyDict_GetItemWithError(kept, key);
    if (old == NULL && PyErr_Occurred()) return -1;
    return keep_over(carry, kept, key, old, pickled);
}

// Keeps the pickle in scratch as key's last one. A key's state often
// pickles to as many bytes epoch after epoch: when the bytes object kept
// for it has that length and nothing but kept holds it, the new pickle is
// copied into it, with no allocation and no change to the dict (that a
// bytes object never changes is a promise to whoever holds it; kept's are
// held by kept alone, private to the store, and never hashed). As keep:
// 1 kept, 0 not, -1 with an exception set on error.
static int keep_scratch(mp_carry *carry, PyObject *kept, PyObject *key, const mp_buf *scratch) {
    PyObject *old = PyDict_GetItemWithError(kept, key);
    if (old == NULL && PyErr_Occurred()) return -1;
    if (old != NULL && PyBytes_CheckExact(old) && Py_REFCNT(old) == 1 &&
        PyBytes_GET_SIZE(old) == (Py_ssize_t)scratch->len) {
        memcpy(PyBytes_AS_STRING(old), scratch->p, scratch->len);
        return 1;
    }
    PyObject *pickled = PyBytes_FromStringAndSize(scratch->p, (Py_ssize_t)scratch->len);
    if (pickled == NULL) return -1;
    int rc = keep_over(carry, kept, key, old, pickled);
    Py_DECREF(pickled);
    return rc;
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
    return kept != NULL && keep(carry, kept, key, NULL) < 0 ? -1 : 0;
}

// Keys are packed a chunk at a time, with the memory their .snapshot()
// reads requested ahead, a level of references per chunk: while a chunk
// is packed, the objects of the chunk PREFETCH_LEVELS ahead are looked up
// and requested, what the objects of each chunk in between refer to is
// requested one level further down than for the chunk after it (the level
// above arrived meanwhile), down to the references of references for the
// chunk packed next. Objects of a state are spread over the heap
// (allocated as its items came), so without this a key waits on memory
// several times over, one miss after another; with it, the snapshot of the
// windowing benchmark's keys packs 15-40% faster (docs/benchmarks.md).
// PREFETCH_CHUNK keys a chunk; at most PREFETCH_BUDGET objects are
// requested for a key, so a large container costs no more than a small one.
enum { PREFETCH_CHUNK = 16, PREFETCH_LEVELS = 2, PREFETCH_BUDGET = 64 };

typedef struct {
    // copies: for a key whose state is already pickled (packed ahead, or
    // not touched by the epoch of a topped-up batch), that pickle; NULL
    // for a key that is packed. fresh: the pickle was packed ahead (it is
    // to be kept).
    PyObject *keys[PREFETCH_CHUNK], *objs[PREFETCH_CHUNK], *copies[PREFETCH_CHUNK];
    char fresh[PREFETCH_CHUNK];
    int n;
} chunk;

typedef struct {
    int *left;  // prefetches still allowed for this object
    int depth;  // levels of references to follow before prefetching
} prefetch_walk;

static int prefetch_visit(PyObject *o, void *arg) {
    prefetch_walk *w = arg;
    if (*w->left <= 0) return 1;  // stops the traversal
    if (w->depth == 0) {
        // Not a read of o: asking whether o is a class would wait for the
        // very memory this requests (a class is in the cache anyway).
        __builtin_prefetch(o);
        (*w->left)--;
        return 0;
    }
    // An instance of a class refers to its class: shared by every key, in
    // the cache already, and behind it only the class's own attributes.
    if (PyType_Check(o)) return 0;
    traverseproc traverse = Py_TYPE(o)->tp_traverse;
    prefetch_walk inner = {w->left, w->depth - 1};
    if (traverse != NULL) (void)traverse(o, prefetch_visit, &inner);
    return 0;
}

// Requests the memory of the objects depth+1 references away from each
// object of c (depth 0: what it refers to directly: its slots or
// __dict__, a container's items).
static void prefetch_chunk(chunk *c, int depth) {
    for (int i = 0; i < c->n; i++) {
        PyObject *obj = c->objs[i];
        // (a key that is copied has its objects left alone)
        traverseproc traverse = obj && !c->copies[i] ? Py_TYPE(obj)->tp_traverse : NULL;
        int left = PREFETCH_BUDGET;
        prefetch_walk w = {&left, depth};
        if (traverse != NULL) (void)traverse(obj, prefetch_visit, &w);
    }
}

static void release_chunk(chunk *c) {
    for (int i = 0; i < c->n; i++) {
        Py_DECREF(c->keys[i]);
        Py_XDECREF(c->objs[i]);
        Py_XDECREF(c->copies[i]);
    }
    c->n = 0;
}

// Fills c with the next keys of walked and their objects (from_live: the
// dict's values; else looked up in objs, NULL for a key that is not live),
// requesting each object's memory, and that of the key's kept pickle in
// kept (if not NULL), which packing the key replaces or copies. A key
// whose mark in marks (the step's touched keys; walked itself unless
// from_live, else looked up when look_marks) is a bytes object was packed
// ahead (pack_ahead) and not touched since: that pickle is copied (and
// *ahead counts it). When the batch is topped_up, a key marks does not
// hold (the epoch did not touch it) with a kept pickle is copied from
// that. A copied key's objects are not requested. 0 at the end of walked,
// 1 if there may be more, -1 with an exception set.
static int fill_chunk(chunk *c, PyObject *walked, Py_ssize_t *pos, int from_live, PyObject *objs, PyObject *kept,
                      PyObject *marks, int look_marks, int topped_up, Py_ssize_t *ahead) {
    PyObject *key, *value;
    c->n = 0;
    while (c->n < PREFETCH_CHUNK) {
        if (!PyDict_Next(walked, pos, &key, &value)) return 0;
        PyObject *obj = from_live ? value : PyDict_GetItemWithError(objs, key);
        if (obj == NULL && PyErr_Occurred()) return -1;
        PyObject *last = kept ? PyDict_GetItemWithError(kept, key) : NULL;
        if (last == NULL && PyErr_Occurred()) return -1;
        PyObject *mark = from_live ? NULL : value, *copy = NULL;
        if (from_live && look_marks && obj != NULL) {
            mark = PyDict_GetItemWithError(marks, key);
            if (mark == NULL && PyErr_Occurred()) return -1;
        }
        int fresh = obj != NULL && mark != NULL && PyBytes_CheckExact(mark);
        if (fresh) {
            copy = mark;
            (*ahead)++;
        } else if (obj != NULL && last != NULL && mark == NULL && topped_up) {
            copy = last;
        }
        if (last != NULL) __builtin_prefetch(last);
        if (obj != NULL && copy == NULL) __builtin_prefetch(obj);
        Py_INCREF(key);
        Py_XINCREF(obj);
        c->keys[c->n] = key;
        c->objs[c->n] = obj;
        c->copies[c->n] = Py_XNewRef(copy);
        c->fresh[c->n] = (char)fresh;
        c->n++;
    }
    return 1;
}

// .snapshot() is user code: if it touched the store, the walk over the
// touched keys (of size n when it began) is no longer sound. 0 with an
// exception set if it did.
static int store_unchanged(PyObject *walked, Py_ssize_t n) {
    if (PyDict_GET_SIZE(walked) == n) return 1;
    PyErr_SetString(PyExc_RuntimeError, "state store changed during snapshot (a .snapshot() method touched it)");
    return 0;
}

// What packing one step's keys needs.
typedef struct {
    mp_buf *b, *scratch;
    const char *step;
    Py_ssize_t step_len;
    mp_carry *carry;
    PyObject *kept;       // the step's kept pickles, or NULL
    int misses;           // keys in a row the C writer gave up on
    int proto;            // for mp_fast_pickle (-1: dumps only)
    PyObject *protocol, *dumps, *snapshot_name;
} step_ctx;

// The protocol mp_fast_pickle is asked to write: -1 (dumps only) for one
// it cannot take.
static int pickle_protocol(PyObject *protocol) {
    long proto = PyLong_Check(protocol) ? PyLong_AsLong(protocol) : -1;
    if (proto == -1 && PyErr_Occurred()) PyErr_Clear();
    return proto > 255 ? -1 : (int)proto;
}

// The interned name "snapshot" (borrowed), made once; NULL with an
// exception set if it cannot be.
static PyObject *snapshot_method(void) {
    static PyObject *name;
    if (name == NULL) name = PyUnicode_InternFromString("snapshot");
    return name;
}

// Pickles obj's state: mp_window_snapshot (window.c) for a windowing
// key's, mp_slot_state (slotstate.c) for stateful_map's, else its
// .snapshot(), pickled by mp_fast_pickle into c->scratch (0) or, for a
// state it leaves alone, by dumps into *pickled (1, a new reference). -1
// with an exception set.
static int pickle_state(step_ctx *c, PyObject *obj, PyObject **pickled) {
    PyObject *state = mp_window_snapshot(obj);
    if (state == NULL && !PyErr_Occurred()) state = mp_slot_state(obj);
    if (state == NULL && !PyErr_Occurred()) state = PyObject_CallMethodNoArgs(obj, c->snapshot_name);
    int rc = state && c->misses < GIVE_UP_AFTER ? mp_fast_pickle(state, c->proto, c->scratch) : 1;
    if (rc <= 0) {
        Py_DECREF(state);
        if (rc < 0) return -1;
        c->misses = 0;
        return 0;
    }
    c->misses++;
    PyObject *argv[2] = {state, c->protocol};
    PyObject *out = state ? PyObject_Vectorcall(c->dumps, argv, 2, NULL) : NULL;
    Py_XDECREF(state);
    if (out == NULL || !PyBytes_Check(out)) {
        if (out != NULL) PyErr_SetString(PyExc_TypeError, "pack_snapshot: dumps must return bytes");
        Py_XDECREF(out);
        return -1;
    }
    *pickled = out;
    return 1;
}

// Appends key's row: a deletion when obj is NULL, a copy of copy when
// that is not NULL (a pickle of the key's state: kept, from a key not
// touched since it was last packed, or fresh, packed ahead, which is kept
// from now on), else obj's state pickled. -1 with an exception set.
static int pack_key(step_ctx *c, PyObject *key, PyObject *obj, PyObject *copy, int fresh) {
    Py_ssize_t kl;
    const char *k = PyUnicode_AsUTF8AndSize(key, &kl);
    if (k == NULL || put_bytes(c->b, c->step, (size_t)c->step_len) < 0 || put_bytes(c->b, k, (size_t)kl) < 0) return -1;
    if (obj == NULL) return put_deletion(c->b, c->carry, c->kept, key);  // discarded
    if (copy != NULL) {
        if (put_value(c->b, PyBytes_AS_STRING(copy), (size_t)PyBytes_GET_SIZE(copy)) < 0) return -1;
        c->carry->reused++;
        return fresh && c->kept != NULL && keep(c->carry, c->kept, key, copy) < 0 ? -1 : 0;
    }
    PyObject *pickled = NULL;
    int rc = pickle_state(c, obj, &pickled);
    if (rc == 0) {
        rc = put_value(c->b, c->scratch->p, c->scratch->len) < 0 ||
                     (c->kept != NULL && keep_scratch(c->carry, c->kept, key, c->scratch) < 0)
                 ? -1
                 : 0;
        c->scratch->len = 0;
        return rc;
    }
    if (rc < 0) return -1;
    rc = put_value(c->b, PyBytes_AS_STRING(pickled), (size_t)PyBytes_GET_SIZE(pickled)) < 0 ||
                 (c->kept != NULL && keep(c->carry, c->kept, key, pickled) < 0)
             ? -1
             : 0;
    Py_DECREF(pickled);
    return rc;
}

// mp_pack_snapshot(dirty: dict[str, dict[str, mark]], live: dict[str,
// dict[str, obj]], deleted, dumps, protocol) packs every touched key (a
// deletion for a touched key that is not live) and returns the buffer and
// its length. With deleted ({step: set of keys}, else NULL) the batch is
// the whole state instead: every live key of each step of dirty, in the
// live dict's order, each object taken as the dict is walked (no lookup),
// then a deletion for each key in deleted[step]. Any error propagates as
// is (NULL); the caller redoes the work in Python to name the step and
// key. A key whose mark is a pickle (carry->marked says some may be;
// pack_ahead made them) is written from it. With carry->packed (else
// NULL), each key packed or written from its mark is kept there, and when
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
    int proto = pickle_protocol(protocol);
    PyObject *snapshot_name = snapshot_method();
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
        PyObject *kept = NULL;
        if (carry->packed != NULL && (kept = kept_of(carry, step)) == NULL) goto fail;
        // A topped-up batch copies the keys the epoch did not touch.
        int topped_up = from_live && kept != NULL && carry->topped_up;
        int look_marks = topped_up || carry->marked;
        step_ctx c = {&b, &scratch, s, sl, carry, kept, 0, proto, protocol, dumps, snapshot_name};
        enum { RING = PREFETCH_LEVELS + 1 };
        chunk ring[RING] = {{{0}}};
        int more = 1, rc = 0;
        for (int i = 0; i < RING - 1 && more > 0; i++) {
            more = fill_chunk(&ring[i], walked, &kpos, from_live, objs, kept, keys, look_marks, topped_up,
                              &carry->ahead);
        }
        for (int t = 0; rc == 0 && more >= 0; t++) {
            chunk *now = &ring[t % RING];
            if (now->n == 0) break;
            chunk *next = &ring[(t + RING - 1) % RING];
            if (more > 0) {
                more = fill_chunk(next, walked, &kpos, from_live, objs, kept, keys, look_marks, topped_up,
                                  &carry->ahead);
            }
            for (int d = 0; d < PREFETCH_LEVELS; d++) prefetch_chunk(&ring[(t + PREFETCH_LEVELS - 1 - d) % RING], d);
            for (int i = 0; i < now->n && rc == 0; i++) {
                rc = store_unchanged(walked, touched) ? pack_key(&c, now->keys[i], now->objs[i], now->copies[i], now->fresh[i]) : -1;
            }
            release_chunk(now);
        }
        // (after the last key too: the walk ran ahead of the packing)
        if (rc == 0 && more >= 0 && !store_unchanged(walked, touched)) rc = -1;
        for (int i = 0; i < RING; i++) release_chunk(&ring[i]);
        if (rc < 0 || more < 0) goto fail;
        // A whole batch's deletions follow its live keys.
        PyObject *gone = from_live ? PyDict_GetItemWithError(deleted, step) : NULL;
        if (gone == NULL && PyErr_Occurred()) goto fail;
        PyObject *it = gone ? PyObject_GetIter(gone) : NULL;
        if (gone != NULL && it == NULL) goto fail;
        PyObject *key;
        while (it != NULL && (key = PyIter_Next(it)) != NULL) {
            Py_ssize_t kl;
            const char *k = PyUnicode_AsUTF8AndSize(key, &kl);
            rc = k == NULL || put_bytes(&b, s, (size_t)sl) < 0 || put_bytes(&b, k, (size_t)kl) < 0 ||
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
    free(scratch.p);
    *out_len = b.len;
    return b.p;
fail:
    free(scratch.p);
    free(b.p);
    return NULL;
}

// pack_ahead(marks, acct, dumps, protocol, key, obj) -> bool: packs key's
// state now, right after its activation changed it, while its objects are
// in the cache: the same key packed at the end of the epoch, among all the
// others, costs several times more (docs/recovery.md). The pickle becomes
// key's mark in marks (the step's touched keys, whose entry for key the
// activation has just written), so the epoch's snapshot copies it, unless
// the key is touched again first (its mark is None again). acct is
// [bytes the marks hold, their budget, keys packed]: a pickle the budget
// has no room for is not made a mark (False). Nor is one whose state fails
// to snapshot or pickle: the snapshot packs it, and names the step and key.
PyObject *py_pack_ahead(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "pack_ahead takes 6 arguments");
        return NULL;
    }
    PyObject *marks = args[0], *acct = args[1], *dumps = args[2], *protocol = args[3], *key = args[4],
             *obj = args[5];
    if (!PyDict_CheckExact(marks) || !PyList_CheckExact(acct) || PyList_GET_SIZE(acct) != 3 ||
        !PyUnicode_CheckExact(key)) {
        PyErr_SetString(PyExc_TypeError, "pack_ahead(marks: dict, acct: [int, int, int], dumps, protocol, key: str, obj)");
        return NULL;
    }
    PyObject *snapshot_name = snapshot_method();
    if (snapshot_name == NULL) return NULL;
    Py_ssize_t held = PyLong_AsSsize_t(PyList_GET_ITEM(acct, 0));
    Py_ssize_t budget = PyLong_AsSsize_t(PyList_GET_ITEM(acct, 1));
    Py_ssize_t packs = PyLong_AsSsize_t(PyList_GET_ITEM(acct, 2));
    if (PyErr_Occurred()) return NULL;
    if (held >= budget) Py_RETURN_FALSE;
    mp_buf scratch = {0};
    step_ctx c = {.scratch = &scratch, .proto = pickle_protocol(protocol), .protocol = protocol, .dumps = dumps,
                  .snapshot_name = snapshot_name};
    PyObject *pickled = NULL;
    int rc = pickle_state(&c, obj, &pickled);
    if (rc == 0) pickled = PyBytes_FromStringAndSize(scratch.p, (Py_ssize_t)scratch.len);
    free(scratch.p);
    if (rc < 0 || pickled == NULL) {
        // Only an Exception is left to the snapshot: anything else
        // (KeyboardInterrupt, SystemExit) goes on up.
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(pickled) + KEPT_OVERHEAD;
    if (held + size > budget) {
        Py_DECREF(pickled);
        Py_RETURN_FALSE;
    }
    rc = PyDict_SetItem(marks, key, pickled);
    Py_DECREF(pickled);
    if (rc < 0) return NULL;
    PyObject *h = PyLong_FromSsize_t(held + size), *n = PyLong_FromSsize_t(packs + 1);
    if (h == NULL || n == NULL) {
        Py_XDECREF(h);
        Py_XDECREF(n);
        return NULL;
    }
    if (PyList_SetItem(acct, 0, h) < 0 || PyList_SetItem(acct, 2, n) < 0) return NULL;  // (stolen either way)
    Py_RETURN_TRUE;
}
