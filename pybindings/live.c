// millpond._core: the recency order of a worker's live state objects (the
// live-key limit of state.py evicts from the front of a step's live dict).
#include "module.h"

// touch_keys(live, keys) -> list of the keys not in live. Each key found
// is moved to the end of live (its most recently used place). Done here
// rather than in a Python loop: a batch of keys costs a pop and an insert
// each, and the loop around them cost several times what they do.
MP_METHOD(touch_keys) {
    PyObject *live, *keys;
    if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &live, &keys)) return NULL;
    PyObject *missing = PyList_New(0);
    if (missing == NULL) return NULL;
    PyObject *it = PyObject_GetIter(keys);
    if (it == NULL) {
        Py_DECREF(missing);
        return NULL;
    }
    PyObject *key;
    while ((key = PyIter_Next(it)) != NULL) {
        int rc;
        PyObject *obj = PyDict_GetItemWithError(live, key);  // borrowed
        if (obj != NULL) {
            Py_INCREF(obj);
            rc = PyDict_DelItem(live, key);
            if (rc == 0) rc = PyDict_SetItem(live, key, obj);
            Py_DECREF(obj);
        } else if (PyErr_Occurred()) {
            rc = -1;
        } else {
            rc = PyList_Append(missing, key);
        }
        Py_DECREF(key);
        if (rc < 0) {
            Py_DECREF(it);
            Py_DECREF(missing);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        Py_DECREF(missing);
        return NULL;
    }
    return missing;
}
