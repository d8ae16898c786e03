// Shared declarations of the C side of millpond._core.
#ifndef MILLPOND_MODULE_H
#define MILLPOND_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#include "gocalls.h"

// Raise the exception registered for an error kind of the Go core with
// msg (freed here); returns NULL.
PyObject *mp_raise(int kind, char *msg);
// A Python object from Go-allocated JSON or text, freed here.
PyObject *mp_take_json(char *json);
PyObject *mp_take_str(char *s);
// Reads a uvarint at p; NULL if it runs past end. Inline: a scan page
// decodes three per row.
static inline const char *mp_get_uvarint(const char *p, const char *end, uint64_t *out) {
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
// Builds live objects from a packed page of rows (snapfile's page format,
// as mp_scan_next and mp_store_get_many return it): for every key with a
// value (deletions are skipped) not in live and not in skip,
// live[key] = builder(loads(value)). With asked (a sorted list of the
// str keys the page answers, or NULL), each key is the object of asked
// with its UTF-8 rather than a new string. Returns how many it built, or
// -1 with an exception set (scan.c).
Py_ssize_t mp_hydrate_page(const char *buf, size_t len, PyObject *asked, PyObject *live, PyObject *skip,
                           PyObject *builder, PyObject *loads);
// The shapes most calls share: fn(handle) with no result, and fn(handle)
// returning a record as JSON. args holds the one handle.
typedef int (*mp_handle_fn)(uintptr_t, int *, char **);
typedef int (*mp_handle_json_fn)(uintptr_t, char **, int *, char **);
PyObject *mp_call_handle(PyObject *args, mp_handle_fn fn);
PyObject *mp_call_handle_json(PyObject *args, mp_handle_json_fn fn);
// A growing malloc'd byte buffer.
typedef struct {
    char *p;
    size_t len, cap;
} mp_buf;
// Makes room for more bytes; -1 with MemoryError set.
int mp_buf_grow(mp_buf *b, size_t more);
// Sets up pickle.c (the datetime C API, copyreg's table); -1 on error.
int mp_pickle_init(void);
// Sets up route.c (its CRC table); -1 on error.
int mp_route_init(void);
// Appends the pickle of obj at protocol proto to out when pickle.c's
// writer handles every part of obj: 0 written, 1 not handled (out as it
// was; the caller uses pickle.dumps), -1 error set.
int mp_fast_pickle(PyObject *obj, int proto, mp_buf *out);
// t as windowing snapshots keep it: a UTC datetime as microseconds since
// 1970, anything else as it is (new reference; NULL with an exception set).
PyObject *mp_snapshot_time(PyObject *t);
// The snapshot of a windowing operator's key state when obj is one whose
// parts are all windowing's own classes (window.c): a new reference, NULL
// with an exception set, or NULL without one when obj.snapshot() must run.
PyObject *mp_window_snapshot(PyObject *obj);
// The snapshot of a key state whose .snapshot() returns one slot of its
// object (slotstate.c; stateful_map's logic): a new reference to the slot,
// or NULL without an exception when obj is of no registered type or the
// slot is unset (obj.snapshot() must run).
PyObject *mp_slot_state(PyObject *obj);
// The offset of type's __slots__ entry name; -1 with TypeError set when
// name is not an object slot of type.
Py_ssize_t mp_slot_offset(PyTypeObject *type, const char *name);
// What a batch-mode snapshot keeps of each key's pickle, so that a whole
// epoch's top-up (the keys the epoch did not touch, which still pack to
// what they packed to last) copies bytes instead of packing every object
// again.
typedef struct {
    PyObject *packed;   // {step: {key: bytes}}: the last pickle of keys not touched since, or NULL
    int topped_up;      // the batch is whole and dirty holds only what the epoch touched
    int marked;         // some marks in dirty may be pickles packed ahead (pack_ahead)
    Py_ssize_t budget;  // bytes packed may hold (pickles and their overhead)
    Py_ssize_t held;    // in and out: bytes it holds
    Py_ssize_t reused;  // out: rows copied from it
    Py_ssize_t ahead;   // out: of those, rows packed ahead (pack_ahead)
} mp_carry;
// Packs a store's touched keys into one malloc'd rowbatch buffer
// (snapshot.c); NULL with an exception set on failure.
char *mp_pack_snapshot(PyObject *dirty, PyObject *live, PyObject *deleted, PyObject *dumps, PyObject *protocol,
                       mp_carry *carry, size_t *out_len);

// CALL_GO runs a call into Go with the GIL released and returns the Go
// error as a Python exception. It declares kind and msg, which the call
// passes to the Go function as its error outputs.
#define CALL_GO(expr)           \
    int kind = 0;               \
    char *msg = NULL;           \
    Py_BEGIN_ALLOW_THREADS      \
    kind = (expr);              \
    Py_END_ALLOW_THREADS        \
    if (kind) return mp_raise(kind, msg);

// The module's functions, one per file of the Go side (store, scan, backup,
// run, cluster, log); module.c lists them in its one method table.
#define MP_METHOD(name) PyObject *py_##name(PyObject *self, PyObject *args)
PyObject *py_pack_ahead(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
MP_METHOD(store_open);
MP_METHOD(store_carries);
MP_METHOD(store_carry_off);
MP_METHOD(store_close);
MP_METHOD(store_snapshot);
MP_METHOD(store_get);
MP_METHOD(store_hydrate_keys);
MP_METHOD(touch_keys);
MP_METHOD(route_keyed);
MP_METHOD(group_keyed);
MP_METHOD(fast_pickle);
MP_METHOD(snapshot_time);
MP_METHOD(window_register);
MP_METHOD(window_snapshot);
MP_METHOD(slot_state_register);
MP_METHOD(store_steps);
MP_METHOD(store_meta);
MP_METHOD(store_gc);
MP_METHOD(scan_open);
MP_METHOD(scan_next);
MP_METHOD(scan_hydrate);
MP_METHOD(scan_close);
MP_METHOD(backup_open);
MP_METHOD(backup_python);
MP_METHOD(backup_close);
MP_METHOD(backup_describe);
MP_METHOD(backup_list);
MP_METHOD(backup_upload);
MP_METHOD(backup_download);
MP_METHOD(backup_delete);
MP_METHOD(backup_check);
MP_METHOD(durable_inspect);
MP_METHOD(durable_verify);
MP_METHOD(durable_flows);
MP_METHOD(run_open);
MP_METHOD(run_info);
MP_METHOD(run_restore);
MP_METHOD(run_progress);
MP_METHOD(run_start);
MP_METHOD(run_close_epoch);
MP_METHOD(run_finish);
MP_METHOD(run_close);
MP_METHOD(run_metrics);
MP_METHOD(run_committed_epoch);
MP_METHOD(run_commits);
MP_METHOD(log_flush);
MP_METHOD(log_stop);
MP_METHOD(log_set_level);
MP_METHOD(watch_interrupts);
MP_METHOD(cluster_open);
MP_METHOD(cluster_send);
MP_METHOD(cluster_drain);
MP_METHOD(cluster_wait);
MP_METHOD(cluster_congested);
MP_METHOD(cluster_report);
MP_METHOD(cluster_stats);
MP_METHOD(cluster_error);
MP_METHOD(cluster_close);
MP_METHOD(cluster_abort);

#endif
