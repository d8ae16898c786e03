// millpond._core: the CPython face of the Go core.
//
// This file holds the module: its one method table, the error kinds and
// the exception classes registered for them, and the helpers every other
// .c file shares. Each of those files wraps the exports of the Go file of
// the same name. Python objects are built here in C; records that the Go
// side describes cross as JSON with snake_case keys and are decoded here,
// so Python code always receives Python objects. Each call into Go runs
// with the GIL released; Go never sees a PyObject.
#include "module.h"

#include <stdlib.h>
#include <string.h>

#include "_cgo_export.h"

static PyObject *CoreError = NULL;
static PyObject *json_loads = NULL;
// Error kinds as the Go side names them (kind i is kind_names[i-1]), and
// the exception class registered for each (NULL: CoreError).
static PyObject *kind_names = NULL;
#define MAX_KINDS 64
static PyObject *kind_types[MAX_KINDS];

PyObject *mp_raise(int kind, char *msg) {
    PyObject *type = (kind > 0 && kind < MAX_KINDS && kind_types[kind]) ? kind_types[kind] : CoreError;
    PyErr_SetString(type, msg ? msg : "unknown error in the Go core");
    free(msg);
    return NULL;
}

PyObject *mp_take_json(char *json) {
    PyObject *text = PyUnicode_FromString(json ? json : "null");
    free(json);
    if (text == NULL) return NULL;
    PyObject *out = PyObject_CallOneArg(json_loads, text);
    Py_DECREF(text);
    return out;
}

PyObject *mp_take_str(char *s) {
    PyObject *o = PyUnicode_FromString(s ? s : "");
    free(s);
    return o;
}

PyObject *mp_call_handle(PyObject *args, mp_handle_fn fn) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    CALL_GO(fn(h, &kind, &msg));
    Py_RETURN_NONE;
}

PyObject *mp_call_handle_json(PyObject *args, mp_handle_json_fn fn) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    char *out = NULL;
    CALL_GO(fn(h, &out, &kind, &msg));
    return mp_take_json(out);
}

// set_error_types(types: dict[str, type]): the exception class to raise
// for each error kind, by name.
static PyObject *py_set_error_types(PyObject *self, PyObject *arg) {
    if (!PyDict_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "set_error_types needs a dict of kind name -> exception class");
        return NULL;
    }
    PyObject *name, *type;
    Py_ssize_t pos = 0;
    while (PyDict_Next(arg, &pos, &name, &type)) {
        Py_ssize_t i = PySequence_Index(kind_names, name);
        if (i < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "unknown error kind %R; the core's kinds are %R", name, kind_names);
            return NULL;
        }
        if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, (PyTypeObject *)PyExc_BaseException)) {
            PyErr_Format(PyExc_TypeError, "error kind %R needs an exception class, got %R", name, type);
            return NULL;
        }
        if (i + 1 >= MAX_KINDS) continue;
        Py_INCREF(type);
        Py_XSETREF(kind_types[i + 1], type);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_error_types", py_set_error_types, METH_O,
     "set_error_types(types: dict[str, type[BaseException]]) -> None\n\n"
     "Raise types[kind] for errors of that kind (names in ERROR_KINDS); unregistered kinds raise CoreError."},
    // Stores (store.go, store.c)
    {"store_open", py_store_open, METH_VARARGS,
     "store_open(dir, flow_id, worker_index, worker_count, key_group_count, execution, resume_epoch) -> handle\n\n"
     "Open (or create) a worker's local store on its own, taking its lock."},
    {"store_close", py_store_close, METH_VARARGS,
     "store_close(handle) -> None\n\nClose a store handle (a store a run owns stays open). Closing twice is fine."},
    {"store_snapshot", py_store_snapshot, METH_VARARGS,
     "store_snapshot(handle, epoch, dirty, live, dumps, protocol, whole, packed=None, topped_up=False, budget=0,\n"
     "               held=0, deleted=None, marked=False)\n"
     "    -> (rows, pack_seconds, write_seconds, reused, held, ahead, carried)\n\n"
     "Pack every touched key (dirty: {step: {key: mark}}; live: {step: {key: obj}}) into one buffer, calling\n"
     "obj.snapshot() and dumps(state, protocol), and hand it to the core, which writes it at epoch (through the\n"
     "run that owns the store, if any). A touched key that is not live is a deletion. With deleted ({step: set}),\n"
     "the batch is every live key of each step of dirty, in live order, then a deletion for each key of\n"
     "deleted[step]. On any error in packing, nothing is written and the error propagates. With packed\n"
     "({step: {key: bytes}}), each key packed has its pickle kept there while the kept bytes (counted with 64\n"
     "bytes of overhead each, held so far) stay within budget, and with topped_up a live key dirty does not hold\n"
     "is written from its kept pickle if it has one (reused counts them). With marked, a touched key whose mark is\n"
     "a pickle (pack_ahead made it) is written from it (ahead counts them; reused too) and kept as above.\n"
     "whole is 0 (touched keys), 1 (the whole state, with deleted) or 2: touched keys, written as the whole state\n"
     "by merging them into the state the run that owns the store carries (store_carries), or as they are when it\n"
     "carries none; carried counts the rows the run added, rows all rows written."},
    {"store_carries", py_store_carries, METH_VARARGS,
     "store_carries(handle) -> bool\n\nWhether the run that owns the store carries its worker's whole state (batch\n"
     "mode, from a fresh start or the last whole batch), so that store_snapshot(whole=2) writes an epoch whole."},
    {"store_carry_off", py_store_carry_off, METH_VARARGS,
     "store_carry_off(handle) -> None\n\nMake the run that owns the store drop its worker's carried state and carry none\n"
     "for the rest of the run (a store bounded in memory)."},
    {"pack_ahead", (PyCFunction)(void (*)(void))py_pack_ahead, METH_FASTCALL,
     "pack_ahead(marks, acct, dumps, protocol, key, obj) -> bool\n\n"
     "Pack key's state now and make the pickle key's mark in marks (a step's touched keys), which the next\n"
     "store_snapshot writes as it is unless the key is touched again; acct is [held, budget, packs], updated.\n"
     "False when the budget has no room or the state fails to pack (left for store_snapshot, which names it)."},
    {"store_get", py_store_get, METH_VARARGS,
     "store_get(handle, step_id, key) -> None | (epoch, bytes | None)\n\nThe newest row of a key (None for a deletion)."},
    {"store_hydrate_keys", py_store_hydrate_keys, METH_VARARGS,
     "store_hydrate_keys(handle, step_id, keys, live, skip, builder, loads, absent=None) -> int\n\n"
     "For every key of the list not in live or skip whose newest row holds a value: live[key] =\n"
     "builder(loads(value)), the rows read in one call to the core; return how many. Keys without a row or\n"
     "deleted are left out. With absent (a set), every key of the list live does not hold afterwards is added\n"
     "to it. If builder or loads raises, the exception propagates (objects built before stay)."},
    {"touch_keys", py_touch_keys, METH_VARARGS,
     "touch_keys(live, keys) -> list[str]\n\n"
     "Move every key of keys found in the dict live to its end (the most recently used place); return the\n"
     "keys not found, in order."},
    {"route_keyed", py_route_keyed, METH_VARARGS,
     "route_keyed(items, key_group_count, workers) -> list[list] | None\n\n"
     "Split a list of (str key, value) items by owning worker (millpond.keygroup.worker_for_key): entry w of\n"
     "the result holds, in order, worker w's items. None when an item is not a (str, value) 2-tuple."},
    {"group_keyed", py_group_keyed, METH_VARARGS,
     "group_keyed(items, pending) -> bool\n\n"
     "Append the value of every (str key, value) item of the list to pending[key] (a new list for a new key),\n"
     "in order. False, with pending untouched, when an item is not a (str, value) 2-tuple."},
    {"fast_pickle", py_fast_pickle, METH_VARARGS,
     "fast_pickle(obj, protocol) -> bytes | None\n\n"
     "The pickle snapshots write for obj when their C writer handles all of it (plain built-in values,\n"
     "dates, naive and UTC datetimes, timedeltas; no list, dict or set reached twice); None when pickle.dumps\n"
     "must. pickle.loads of the bytes gives an object equal to obj, of the same types."},
    {"snapshot_time", py_snapshot_time, METH_O,
     "snapshot_time(t) -> int | object\n\n"
     "A datetime whose tzinfo is timezone.utc as microseconds since 1970 (what windowing snapshots keep);\n"
     "any other value as it is."},
    {"window_register", py_window_register, METH_VARARGS,
     "window_register(step, event_clock, system_clock, sliding, session, fold, collect, meta, version) -> None\n\n"
     "The windowing classes whose objects snapshots read in C (window_snapshot); windowing calls it at import."},
    {"slot_state_register", py_slot_state_register, METH_VARARGS,
     "slot_state_register(type, name) -> None\n\n"
     "Snapshots pack an object of exactly type as its slot name (what its .snapshot() returns) without\n"
     "calling the method; an unset slot still calls it."},
    {"window_snapshot", py_window_snapshot, METH_O,
     "window_snapshot(step) -> tuple | NotImplemented\n\n"
     "What a snapshot writes for a windowing key's state, built in C: the tuple its .snapshot() returns, or\n"
     "NotImplemented when one of its parts is not windowing's own and .snapshot() must run."},
    {"store_steps", py_store_steps, METH_VARARGS, "store_steps(handle) -> list[str]\n\nThe step ids with rows."},
    {"store_meta", py_store_meta, METH_VARARGS,
     "store_meta(handle) -> dict[str, int]\n\nThe store's metadata and row counts."},
    {"store_gc", py_store_gc, METH_VARARGS,
     "store_gc(handle, committed_epoch) -> int\n\nRemove rows superseded at or before the epoch; return how many."},
    // Scans (scan.go, scan.c)
    {"scan_open", py_scan_open, METH_VARARGS,
     "scan_open(store_handle, step_id, chunk_rows) -> handle\n\nStream the newest row of every key of a step."},
    {"scan_next", py_scan_next, METH_VARARGS,
     "scan_next(scan) -> list[tuple[str, bytes | None]] | None\n\nThe next page of (key, value), None at the end."},
    {"scan_hydrate", py_scan_hydrate, METH_VARARGS,
     "scan_hydrate(scan, live, skip, builder, loads) -> int | None\n\n"
     "For every key of the next page not in live or skip: live[key] = builder(loads(value)); return how many,\n"
     "None at the end."},
    {"scan_close", py_scan_close, METH_VARARGS, "scan_close(scan) -> None"},
    // Backups (backup.go, backup.c; report.go)
    {"backup_open", py_backup_open, METH_VARARGS,
     "backup_open(uri, access_key_id='', secret_access_key='', session_token='') -> handle\n\n"
     "Open the backup a URI names (a path, file://, s3://)."},
    {"backup_python", py_backup_python, METH_VARARGS,
     "backup_python(obj, description) -> handle\n\nA backup whose operations call obj's list_keys/upload/download/delete."},
    {"backup_close", py_backup_close, METH_VARARGS, "backup_close(handle) -> None"},
    {"backup_describe", py_backup_describe, METH_VARARGS, "backup_describe(handle) -> str"},
    {"backup_list", py_backup_list, METH_VARARGS,
     "backup_list(handle, prefix) -> list[tuple[str, int]]\n\n(key, size) of every object under prefix, sorted."},
    {"backup_upload", py_backup_upload, METH_VARARGS, "backup_upload(handle, local_path, key) -> None"},
    {"backup_download", py_backup_download, METH_VARARGS,
     "backup_download(handle, key, local_path) -> None\n\nA missing key raises the 'not_found' kind."},
    {"backup_delete", py_backup_delete, METH_VARARGS, "backup_delete(handle, key) -> None"},
    {"backup_check", py_backup_check, METH_VARARGS,
     "backup_check(handle) -> None\n\nRaise if the store is not reachable or usable."},
    {"durable_inspect", py_durable_inspect, METH_VARARGS,
     "durable_inspect(backup_handle, flow_id, count_keys, key) -> dict\n\nA flow's executions, commits and objects (key: the backup key, b'' for none)."},
    {"durable_verify", py_durable_verify, METH_VARARGS,
     "durable_verify(backup_handle, flow_id, key) -> list[dict]\n\nEvery problem found: {'key': ..., 'problem': ...} (key: the backup key, b'' for none)."},
    {"durable_flows", py_durable_flows, METH_VARARGS,
     "durable_flows(backup_handle) -> list[str]\n\nThe flow ids with recovery data in the backup."},
    // Recovery runs (run.go, run.c)
    {"run_open", py_run_open, METH_VARARGS,
     "run_open(local_dir, flow_id, worker_count, key_group_count, backup_handle, snapshot_mode, max_epochs_in_flight,\n"
     "         retain_epochs, retain_seconds, compact_ratio, compact_min_bytes, key, cluster=0, first_worker=0,\n"
     "         workers=0) -> handle\n\n"
     "Read the durable state and prepare the next execution (snapshot_mode: 'batch' or 'immediate'; key: the\n"
     "backup key that authenticates records, b'' for none; cluster: a cluster handle when this process is one of\n"
     "several, hosting workers first_worker .. first_worker+workers-1 of worker_count)."},
    {"run_info", py_run_info, METH_VARARGS,
     "run_info(handle) -> dict[str, int]\n\nexecution, resume_epoch, committed_epoch, commit_worker_count."},
    {"run_restore", py_run_restore, METH_VARARGS,
     "run_restore(handle, worker) -> (store_handle, dict)\n\nRestore a worker's store (fast or full resume)."},
    {"run_progress", py_run_progress, METH_VARARGS,
     "run_progress(handle) -> dict[str, int]\n\nRestore counters: objects and bytes done and in all, rows restored and in the objects."},
    {"run_start", py_run_start, METH_VARARGS,
     "run_start(handle) -> None\n\nRecord the execution and start the commit pipeline."},
    {"run_close_epoch", py_run_close_epoch, METH_VARARGS,
     "run_close_epoch(handle, worker, epoch, last=False) -> None\n\nHand a worker's snapshotted epoch to be committed."},
    {"run_finish", py_run_finish, METH_VARARGS,
     "run_finish(handle, aborted) -> None\n\nWait for closed epochs to commit, then stop background work."},
    {"run_close", py_run_close, METH_VARARGS, "run_close(handle) -> None\n\nStop the run and close its stores."},
    {"run_metrics", py_run_metrics, METH_VARARGS, "run_metrics(handle) -> dict\n\nCommit, upload and maintenance figures."},
    {"run_committed_epoch", py_run_committed_epoch, METH_VARARGS,
     "run_committed_epoch(handle) -> int\n\nThe newest epoch the run knows committed (cheap; for polling)."},
    {"run_commits", py_run_commits, METH_VARARGS,
     "run_commits(handle) -> list[dict]\n\nThe commits since the last call (epoch, objects, rows, bytes, latency)."},
    // The log bridge (log.go, log.c)
    {"log_flush", py_log_flush, METH_NOARGS,
     "log_flush() -> None\n\nWait until the Go core's queued log records reached the logger millpond.core."},
    {"log_stop", py_log_stop, METH_NOARGS,
     "log_stop() -> None\n\nFlush, then stop forwarding for good (at interpreter exit)."},
    {"log_set_level", py_log_set_level, METH_VARARGS,
     "log_set_level(level) -> None\n\nPass on records at this logging level and above."},
    // Interrupts (interrupt.go, interrupt.c)
    {"watch_interrupts", py_watch_interrupts, METH_VARARGS,
     "watch_interrupts(fd) -> None\n\nRead signal numbers from fd (a pipe given to signal.set_wakeup_fd) and cancel\n"
     "the core's calls in flight on SIGINT or SIGTERM; the core owns fd from now on."},
    // Cluster membership (cluster.go, cluster.c)
    {"cluster_open", py_cluster_open, METH_VARARGS,
     "cluster_open(options_json, secret) -> handle\n\nJoin the cluster: options index, addresses, identity,\n"
     "start_timeout_seconds, peer_timeout_seconds, max_in_flight_bytes, inbox_limit_bytes, tls_cert, tls_key,\n"
     "tls_ca (paths; cert and key turn TLS on, the CA makes it mutual); returns once every\n"
     "process is connected and agrees on identity (secret: b'' for none, loopback only)."},
    {"cluster_send", py_cluster_send, METH_VARARGS,
     "cluster_send(handle, process, data) -> None\n\nQueue an encoded exchange batch for a process; never blocks."},
    {"cluster_drain", py_cluster_drain, METH_VARARGS,
     "cluster_drain(handle) -> list[tuple[int, bytes]]\n\nEvery batch received so far, as (sender, data), in order per sender."},
    {"cluster_wait", py_cluster_wait, METH_VARARGS,
     "cluster_wait(handle, timeout_seconds) -> None\n\nBlock until a batch or a progress message arrives, or the timeout."},
    {"cluster_congested", py_cluster_congested, METH_VARARGS,
     "cluster_congested(handle) -> bool\n\nTrue while a peer's outbound queue is over its limit (stop reading sources)."},
    {"cluster_report", py_cluster_report, METH_VARARGS,
     "cluster_report(handle, epoch, phase, ready, done_json) -> list[int] | None\n\n"
     "Report this process's view at a quiescent point; the inputs ended everywhere once the cluster decided."},
    {"cluster_stats", py_cluster_stats, METH_VARARGS,
     "cluster_stats(handle) -> dict\n\nPer-peer transport figures and epoch decision figures."},
    {"cluster_error", py_cluster_error, METH_VARARGS,
     "cluster_error(handle) -> str\n\nWhy the cluster stopped, '' while it is healthy."},
    {"cluster_close", py_cluster_close, METH_VARARGS,
     "cluster_close(handle) -> None\n\nLeave the cluster in good order and release the handle."},
    {"cluster_abort", py_cluster_abort, METH_VARARGS,
     "cluster_abort(handle, reason) -> None\n\nLeave the cluster because this process failed; the peers stop naming it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "millpond._core",
    "The Go core of millpond (state store, snapshots, durable recovery). Internal: millpond.state,\n"
    "millpond.backup and millpond.engine are its users; see _core.pyi for its types.",
    -1, methods,
};

// Reads n NUL-terminated names the Go side lists (malloc'd) into a tuple.
static PyObject *read_names(char *names, int n) {
    PyObject *tuple = PyTuple_New(n);
    const char *p = names;
    for (int i = 0; tuple != NULL && i < n; i++) {
        PyObject *s = PyUnicode_FromString(p);
        if (s == NULL) {
            Py_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(tuple, i, s);
        p += strlen(p) + 1;
    }
    free(names);
    return tuple;
}

int mp_log_init(void);

PyMODINIT_FUNC PyInit__core(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *json = PyImport_ImportModule("json");
    json_loads = json ? PyObject_GetAttrString(json, "loads") : NULL;
    Py_XDECREF(json);
    CoreError = PyErr_NewExceptionWithDoc("millpond._core.CoreError",
                                          "An error of the Go core whose kind has no registered class.", NULL, NULL);
    int n_kinds = 0, n_modes = 0;
    char *kinds = mp_error_kinds(&n_kinds);
    kind_names = n_kinds < MAX_KINDS ? read_names(kinds, n_kinds) : (free(kinds), (PyObject *)NULL);
    char *modes = mp_snapshot_modes(&n_modes);
    PyObject *mode_names = read_names(modes, n_modes);
    int bad = json_loads == NULL || CoreError == NULL || kind_names == NULL || mode_names == NULL ||
              mp_log_init() < 0 || mp_pickle_init() < 0 || mp_route_init() < 0 ||
              PyModule_AddObjectRef(m, "CoreError", CoreError) < 0 ||
              PyModule_AddObjectRef(m, "ERROR_KINDS", kind_names) < 0 ||
              PyModule_AddObjectRef(m, "SNAPSHOT_MODES", mode_names) < 0;
    Py_XDECREF(mode_names);
    if (bad) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ImportError, "millpond._core failed to initialize");
        Py_DECREF(m);
        return NULL;
    }
    // millpond._corebridge registers the exception classes and the log's
    // shutdown, however the module is first imported.
    PyObject *bridge = PyImport_ImportModule("millpond._corebridge");
    PyObject *done = bridge ? PyObject_CallMethod(bridge, "setup", "O", m) : NULL;
    Py_XDECREF(bridge);
    if (done == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(done);
    return m;
}
