// millpond._core: splitting a batch of keyed items by the worker that owns
// each key, for a keyed step of a flow with more than one worker, and
// queueing a worker's share of them by key for its next activation. In a
// Python loop each item paid a method call, a lookup in a cache of owners,
// a setdefault and an append, 0.5-0.6 us on the flow's thread; here the
// owner is computed from the key's bytes (what the cache held it for) and
// the item appended, 0.2-0.3 us.
//
// A key's owner is the one millpond.keygroup and gostore/keygroup compute:
// group = crc32(key as UTF-8) % key_group_count, worker = group * workers /
// key_group_count.
#include "module.h"

#include <stdint.h>

// The CRC-32 of zlib.crc32 and Go's hash/crc32.IEEE (reflected polynomial
// 0xEDB88320), a byte at a time: keys are short.
static uint32_t crc_table[256];

int mp_route_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
    return 0;
}

static uint32_t crc32_ieee(const unsigned char *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

// Whether every item of the list items is a (str, value) 2-tuple: the
// shape a keyed stream's items must have (checked before anything is
// built, so a refused batch changes nothing).
static int all_keyed(PyObject *items) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(item, 0))) {
            return 0;
        }
    }
    return 1;
}

// route_keyed(items, key_group_count, workers) -> list of lists | None.
// Entry w of the result holds, in order, the items of items whose key
// worker w owns. None when an item is not a (str, value) 2-tuple: the
// caller finds it and names it. A key that UTF-8 cannot encode (a lone
// surrogate) raises UnicodeEncodeError, as keygroup.key_group does.
MP_METHOD(route_keyed) {
    PyObject *items;
    Py_ssize_t groups, workers;
    if (!PyArg_ParseTuple(args, "O!nn", &PyList_Type, &items, &groups, &workers)) return NULL;
    if (groups < 1 || workers < 1) {
        PyErr_Format(PyExc_ValueError, "route_keyed: need at least 1 worker and 1 key group, got %zd and %zd", workers,
                     groups);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (!all_keyed(items)) Py_RETURN_NONE;
    PyObject *out = PyList_New(workers);
    if (out == NULL) return NULL;
    for (Py_ssize_t w = 0; w < workers; w++) {
        PyObject *l = PyList_New(0);
        if (l == NULL) goto fail;
        PyList_SET_ITEM(out, w, l);
    }
    // Nothing below runs Python code (UTF-8 of a str and list appends), so
    // items cannot change under the loop.
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        Py_ssize_t len;
        const char *key = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(item, 0), &len);
        if (key == NULL) goto fail;
        Py_ssize_t group = (Py_ssize_t)(crc32_ieee((const unsigned char *)key, len) % (uint32_t)groups);
        if (PyList_Append(PyList_GET_ITEM(out, group * workers / groups), item) < 0) goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

// group_keyed(items, pending) -> bool: append the value of every (str key,
// value) item of the list items to pending[key] (a new list for a key
// pending lacks), in order: what a keyed step queues for its next
// activation. False, with pending untouched, when an item is not a (str,
// value) 2-tuple: the caller finds it and names it. pending's values must
// be lists (the step's own queue: nothing else writes it).
MP_METHOD(group_keyed) {
    PyObject *items, *pending;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &items, &PyDict_Type, &pending)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (!all_keyed(items)) Py_RETURN_FALSE;
    // Dict operations on exact str keys and list appends run no Python
    // code, so items cannot change under the loop.
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        PyObject *key = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1);
        PyObject *queued = PyDict_GetItemWithError(pending, key);  // borrowed
        if (queued != NULL) {
            if (!PyList_CheckExact(queued)) {
                PyErr_Format(PyExc_TypeError, "group_keyed: pending[%R] is not a list", key);
                return NULL;
            }
            if (PyList_Append(queued, value) < 0) return NULL;
            continue;
        }
        if (PyErr_Occurred()) return NULL;
        PyObject *l = PyList_New(1);
        if (l == NULL) return NULL;
        PyList_SET_ITEM(l, 0, Py_NewRef(value));
        int rc = PyDict_SetItem(pending, key, l);
        Py_DECREF(l);
        if (rc < 0) return NULL;
    }
    Py_RETURN_TRUE;
}
