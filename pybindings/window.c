// The snapshot of a windowing operator's key state, built in C.
//
// A windowing key is snapshotted every epoch it is touched, and its
// .snapshot() (millpond.operators.windowing.ops._WindowStep.snapshot) was
// the largest part of the packer's own work on such a key: a dozen
// attribute reads, conversions and tuples, 0.55-0.6 us of interpreter time
// with the key's objects in cache, against about 0.25 us here. The packer
// (snapshot.c) calls mp_window_snapshot first for every object; for a
// _WindowStep whose parts are all millpond's own classes (event or system
// clock; tumbling, sliding or session windower; fold or collect windows) it
// returns the very tuple the Python method returns, reading the objects'
// slots directly. Anything else (a user's WindowLogic, an unexpected shape)
// is "not handled", found out before any part is kept, and the Python
// method runs as before: it stays the definition, and
// tests/test_window_snapshot.py checks the two agree.
//
// No user code runs here: every object read is of an exact type registered
// by the windowing module, or a built-in value passed through.
#include "module.h"

// What windowing registered (window_register): its classes, the offsets of
// the slots read, and the snapshot format's version number.
static struct {
    PyTypeObject *step, *event_clock, *system_clock, *sliding, *session, *fold, *collect, *meta;
    Py_ssize_t step_clock, step_windower, step_windows, step_metas, step_buffer, step_seq;
    Py_ssize_t clock_max_seen, clock_seen_at, clock_floor;
    Py_ssize_t session_next_id, fold_acc, collect_values;
    PyObject *version, *open_name, *close_name, *merged_name;
} win;

// The object in slot off of obj (borrowed); NULL when the slot is unset.
static inline PyObject *slot(PyObject *obj, Py_ssize_t off) { return *(PyObject **)((char *)obj + off); }

// window_register(step, event_clock, system_clock, sliding, session, fold,
// collect, meta, version): the classes whose objects mp_window_snapshot
// reads (windowing's ops module calls it once, at import).
MP_METHOD(window_register) {
    PyTypeObject *t[8];
    PyObject *version;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!O!", &PyType_Type, &t[0], &PyType_Type, &t[1], &PyType_Type, &t[2],
                          &PyType_Type, &t[3], &PyType_Type, &t[4], &PyType_Type, &t[5], &PyType_Type, &t[6],
                          &PyType_Type, &t[7], &PyLong_Type, &version))
        return NULL;
    struct {
        Py_ssize_t *out;
        PyTypeObject *type;
        const char *name;
    } slots[] = {
        {&win.step_clock, t[0], "clock"},        {&win.step_windower, t[0], "windower"},
        {&win.step_windows, t[0], "windows"},    {&win.step_metas, t[0], "metas"},
        {&win.step_buffer, t[0], "buffer"},      {&win.step_seq, t[0], "seq"},
        {&win.clock_max_seen, t[1], "max_seen"}, {&win.clock_seen_at, t[1], "seen_at"},
        {&win.clock_floor, t[1], "floor"},       {&win.session_next_id, t[4], "next_id"},
        {&win.fold_acc, t[5], "acc"},            {&win.collect_values, t[6], "values"},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
        Py_ssize_t off = mp_slot_offset(slots[i].type, slots[i].name);
        if (off < 0) return NULL;
        *slots[i].out = off;
    }
    if (win.open_name == NULL) {
        win.open_name = PyUnicode_InternFromString("open_time");
        win.close_name = PyUnicode_InternFromString("close_time");
        win.merged_name = PyUnicode_InternFromString("merged_ids");
        if (win.open_name == NULL || win.close_name == NULL || win.merged_name == NULL) return NULL;
    }
    // Types live as long as their module; hold them anyway, as the offsets
    // above are only valid for them.
    PyTypeObject **dst[] = {&win.step, &win.event_clock, &win.system_clock, &win.sliding,
                            &win.session, &win.fold, &win.collect, &win.meta};
    for (int i = 0; i < 8; i++) Py_XSETREF(*dst[i], (PyTypeObject *)Py_NewRef(t[i]));
    Py_XSETREF(win.version, Py_NewRef(version));
    Py_RETURN_NONE;
}

// A tuple of the n new references in parts when complete (they are all
// set); otherwise NULL, releasing those that are (an exception is set, or
// the part that is missing was not handled).
static PyObject *tuple_of(PyObject **parts, int n, int complete) {
    PyObject *out = complete ? PyTuple_New(n) : NULL;
    for (int i = 0; i < n; i++) {
        if (out != NULL) {
            PyTuple_SET_ITEM(out, i, parts[i]);
        } else {
            Py_XDECREF(parts[i]);
        }
    }
    return out;
}

// The clock's snapshot (new reference), NULL with an exception set, or NULL
// without one for a clock this does not know. Here and below, a slot that is
// unset is "not handled" too: the Python method then raises what it raises.
static PyObject *clock_snapshot(PyObject *clock) {
    if (Py_IS_TYPE(clock, win.system_clock)) return Py_NewRef(Py_None);
    if (!Py_IS_TYPE(clock, win.event_clock)) return NULL;
    PyObject *parts[3] = {slot(clock, win.clock_max_seen), slot(clock, win.clock_seen_at),
                          slot(clock, win.clock_floor)};
    if (!parts[0] || !parts[1] || !parts[2]) return NULL;  // unset: the method says what
    PyObject *out = PyTuple_New(3);
    for (int i = 0; out != NULL && i < 3; i++) {
        PyObject *t = mp_snapshot_time(parts[i]);
        if (t == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, t);
    }
    return out;
}

// The windower's snapshot: what its .snapshot() returns (None for fixed
// windows, the next session id for sessions); NULL without an exception for
// a windower this does not know.
static PyObject *windower_snapshot(PyObject *windower) {
    if (Py_IS_TYPE(windower, win.sliding)) return Py_NewRef(Py_None);
    if (!Py_IS_TYPE(windower, win.session)) return NULL;
    return Py_XNewRef(slot(windower, win.session_next_id));
}

// A window logic's snapshot: the fold's accumulator itself, the collected
// values as a tuple; NULL without an exception for any other logic.
static PyObject *logic_snapshot(PyObject *logic) {
    if (Py_IS_TYPE(logic, win.fold)) {
        return Py_XNewRef(slot(logic, win.fold_acc));
    }
    if (Py_IS_TYPE(logic, win.collect)) {
        PyObject *values = slot(logic, win.collect_values);
        return values != NULL && PyList_CheckExact(values) ? PyList_AsTuple(values) : NULL;
    }
    return NULL;
}

// tuple(sorted(ids)) for a set of ints, () for an empty one; NULL without an
// exception for anything else (sorting other values could run their code).
static PyObject *merged_snapshot(PyObject *ids) {
    if (!PySet_CheckExact(ids)) return NULL;
    if (PySet_GET_SIZE(ids) == 0) return PyTuple_New(0);
    PyObject *list = PySequence_List(ids);
    if (list == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        if (!PyLong_CheckExact(PyList_GET_ITEM(list, i))) {
            Py_DECREF(list);
            return NULL;
        }
    }
    PyObject *out = PyList_Sort(list) < 0 ? NULL : PyList_AsTuple(list);
    Py_DECREF(list);
    return out;
}

// One open window: (wid, open, close, merged, logic's snapshot).
static PyObject *window_entry(PyObject *wid, PyObject *meta, PyObject *logic) {
    if (!Py_IS_TYPE(meta, win.meta)) return NULL;
    PyObject *parts[5] = {Py_NewRef(wid), NULL, NULL, NULL, NULL};
    PyObject *open = PyObject_GetAttr(meta, win.open_name);
    PyObject *close = open ? PyObject_GetAttr(meta, win.close_name) : NULL;
    PyObject *merged = close ? PyObject_GetAttr(meta, win.merged_name) : NULL;
    if (merged != NULL) {
        parts[1] = mp_snapshot_time(open);
        parts[2] = parts[1] ? mp_snapshot_time(close) : NULL;
        parts[3] = parts[2] ? merged_snapshot(merged) : NULL;
        parts[4] = parts[3] ? logic_snapshot(logic) : NULL;
    }
    Py_XDECREF(open);
    Py_XDECREF(close);
    Py_XDECREF(merged);
    return tuple_of(parts, 5, parts[4] != NULL);
}

// The open windows, in the windows dict's order; () when there are none.
static PyObject *windows_snapshot(PyObject *windows, PyObject *metas) {
    if (!PyDict_CheckExact(windows) || !PyDict_CheckExact(metas)) return NULL;
    Py_ssize_t n = PyDict_GET_SIZE(windows);
    PyObject *out = PyTuple_New(n);
    if (out == NULL || n == 0) return out;
    Py_ssize_t pos = 0, i = 0;
    PyObject *wid, *logic;
    while (PyDict_Next(windows, &pos, &wid, &logic)) {
        PyObject *meta = PyDict_GetItemWithError(metas, wid);  // borrowed
        PyObject *entry = NULL;
        if (meta != NULL) {
            entry = window_entry(wid, meta, logic);
        } else if (!PyErr_Occurred()) {
            PyErr_SetObject(PyExc_KeyError, wid);  // as metas[wid] raises
        }
        if (entry == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i++, entry);
    }
    return out;
}

// The buffered items: ((time, seq, value), ...) from the heap's (datetime,
// seq, value) entries, in the heap's order; () when there are none.
static PyObject *buffer_snapshot(PyObject *buffer) {
    if (!PyList_CheckExact(buffer)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(buffer);
    PyObject *out = PyTuple_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *e = PyList_GET_ITEM(buffer, i);
        PyObject *t = NULL;
        if (PyTuple_CheckExact(e) && PyTuple_GET_SIZE(e) == 3) {
            PyObject *ts = mp_snapshot_time(PyTuple_GET_ITEM(e, 0));
            t = ts ? PyTuple_New(3) : NULL;
            if (t != NULL) {
                PyTuple_SET_ITEM(t, 0, ts);
                PyTuple_SET_ITEM(t, 1, Py_NewRef(PyTuple_GET_ITEM(e, 1)));
                PyTuple_SET_ITEM(t, 2, Py_NewRef(PyTuple_GET_ITEM(e, 2)));
            } else {
                Py_XDECREF(ts);
            }
        }
        if (t == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, t);
    }
    return out;
}

PyObject *mp_window_snapshot(PyObject *obj) {
    if (win.step == NULL || !Py_IS_TYPE(obj, win.step)) return NULL;
    PyObject *clock = slot(obj, win.step_clock), *windower = slot(obj, win.step_windower);
    PyObject *windows = slot(obj, win.step_windows), *metas = slot(obj, win.step_metas);
    PyObject *buffer = slot(obj, win.step_buffer), *seq = slot(obj, win.step_seq);
    if (!clock || !windower || !windows || !metas || !buffer || !seq) return NULL;  // the method says what
    PyObject *parts[6] = {Py_NewRef(win.version), clock_snapshot(clock), NULL, NULL, NULL, Py_NewRef(seq)};
    if (parts[1] != NULL) parts[2] = windower_snapshot(windower);
    if (parts[2] != NULL) parts[3] = windows_snapshot(windows, metas);
    if (parts[3] != NULL) parts[4] = buffer_snapshot(buffer);
    return tuple_of(parts, 6, parts[4] != NULL);
}

// window_snapshot(step) -> tuple | NotImplemented: what the packer writes
// for a windowing key's state; NotImplemented when it leaves the state to
// the object's .snapshot().
MP_METHOD(window_snapshot) {  // METH_O: args is the object
    PyObject *out = mp_window_snapshot(args);
    if (out == NULL && !PyErr_Occurred()) Py_RETURN_NOTIMPLEMENTED;
    return out;
}
