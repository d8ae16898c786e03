// millpond._core: the log bridge's Python side (log.go). Records of the Go
// core reach the logger millpond.core, rendered as "message key=value ...",
// with the attributes also kept as a dict in the record's core_attrs.
#include "module.h"

#include <string.h>

#include "_cgo_export.h"

static PyObject *core_logger = NULL;

int mp_log_init(void) {
    PyObject *logging = PyImport_ImportModule("logging");
    if (logging == NULL) return -1;
    core_logger = PyObject_CallMethod(logging, "getLogger", "s", "millpond.core");
    Py_DECREF(logging);
    return core_logger ? 0 : -1;
}

static int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

// Builds {key: value} from "k\0v\0k\0v" (len bytes).
static PyObject *attr_dict(const char *attrs, size_t len) {
    PyObject *d = PyDict_New();
    const char *p = attrs, *end = attrs + len;
    while (d != NULL && attrs != NULL && p < end) {
        const char *k = p;
        p += strlen(p) + 1;
        if (p > end) break;
        const char *v = p;
        p += strlen(p) + 1;
        PyObject *val = PyUnicode_DecodeUTF8(v, (Py_ssize_t)strlen(v), "replace");
        if (val == NULL || PyDict_SetItemString(d, k, val) < 0) Py_CLEAR(d);
        Py_XDECREF(val);
    }
    return d;
}

void mp_log_emit(int level, char *text, char *attrs, size_t attrs_len) {
    if (!Py_IsInitialized() || finalizing()) return;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *attr = attr_dict(attrs, attrs_len);
    PyObject *extra = attr ? Py_BuildValue("{sO}", "core_attrs", attr) : NULL;
    PyObject *kwargs = extra ? Py_BuildValue("{sO}", "extra", extra) : NULL;
    PyObject *msg = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    PyObject *call_args = msg ? Py_BuildValue("(iO)", level, msg) : NULL;
    PyObject *log = PyObject_GetAttrString(core_logger, "log");
    PyObject *res = (log && call_args && kwargs) ? PyObject_Call(log, call_args, kwargs) : NULL;
    if (res == NULL) PyErr_WriteUnraisable(core_logger);
    Py_XDECREF(res);
    Py_XDECREF(log);
    Py_XDECREF(call_args);
    Py_XDECREF(msg);
    Py_XDECREF(kwargs);
    Py_XDECREF(extra);
    Py_XDECREF(attr);
    PyGILState_Release(g);
}

PyObject *py_log_flush(PyObject *self, PyObject *unused) {
    Py_BEGIN_ALLOW_THREADS
    mp_log_flush();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyObject *py_log_stop(PyObject *self, PyObject *unused) {
    Py_BEGIN_ALLOW_THREADS
    mp_log_stop();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

MP_METHOD(log_set_level) {
    int level;
    if (!PyArg_ParseTuple(args, "i", &level)) return NULL;
    mp_log_set_level(level);
    Py_RETURN_NONE;
}
