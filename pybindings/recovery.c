// millpond._core: recovery runs and backups (see recovery.go, backup.go).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#include "_cgo_export.h"
#include "module.h"

// Returns a Python str from a Go-allocated C string and frees it.
static PyObject *take_str(char *s) {
    PyObject *o = PyUnicode_FromString(s ? s : "");
    free(s);
    return o;
}

PyObject *mp_backup_open_py(PyObject *self, PyObject *args) {
    const char *uri, *key = "", *secret = "", *token = "";
    if (!PyArg_ParseTuple(args, "s|sss", &uri, &key, &secret, &token)) return NULL;
    uintptr_t h = 0;
    CALL_GO(mp_backup_open((char *)uri, (char *)key, (char *)secret, (char *)token, &h, &kind, &msg));
    return PyLong_FromUnsignedLongLong(h);
}

PyObject *mp_backup_python_py(PyObject *self, PyObject *args) {
    PyObject *obj;
    const char *desc;
    if (!PyArg_ParseTuple(args, "Os", &obj, &desc)) return NULL;
    Py_INCREF(obj);  // released by mp_pybackup_release when the handle closes
    uintptr_t h = 0;
    mp_backup_python(obj, (char *)desc, &h);
    return PyLong_FromUnsignedLongLong(h);
}

PyObject *mp_backup_close_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    mp_backup_close(h);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyObject *mp_backup_describe_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    char *out = NULL;
    CALL_GO(mp_backup_describe(h, &out, &kind, &msg));
    return take_str(out);
}

PyObject *mp_backup_op_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    int op;
    const char *a, *b;
    if (!PyArg_ParseTuple(args, "Kiss", &h, &op, &a, &b)) return NULL;
    char *out = NULL;
    size_t len = 0;
    CALL_GO(mp_backup_op(h, op, (char *)a, (char *)b, &out, &len, &kind, &msg));
    if (op != 0) Py_RETURN_NONE;
    PyObject *list = PyList_New(0);
    size_t start = 0;
    for (size_t i = 0; list != NULL && i < len; i++) {
        if (out[i] != 0) continue;
        const char *line = out + start;
        const char *tab = memchr(line, '\t', i - start);
        if (tab != NULL) {
            PyObject *t = Py_BuildValue("(s#L)", line, (Py_ssize_t)(tab - line), atoll(tab + 1));
            if (t == NULL || PyList_Append(list, t) < 0) Py_CLEAR(list);
            Py_XDECREF(t);
        }
        start = i + 1;
    }
    free(out);
    return list;
}

PyObject *mp_run_open_py(PyObject *self, PyObject *args) {
    const char *dir, *flow;
    int workers, groups, mode, inflight, retain;
    unsigned long long bh;
    double retain_seconds, ratio;
    long long cmin;
    if (!PyArg_ParseTuple(args, "ssiiKiiiddL", &dir, &flow, &workers, &groups, &bh, &mode, &inflight, &retain,
                          &retain_seconds, &ratio, &cmin))
        return NULL;
    uintptr_t h = 0;
    CALL_GO(mp_run_open((char *)dir, (char *)flow, workers, groups, bh, mode, inflight, retain, retain_seconds, ratio,
                        cmin, &h, &kind, &msg));
    return PyLong_FromUnsignedLongLong(h);
}

PyObject *mp_run_info_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    long long v[4] = {0};
    CALL_GO(mp_run_info(h, v, &kind, &msg));
    return Py_BuildValue("(LLLL)", v[0], v[1], v[2], v[3]);
}

PyObject *mp_run_restore_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    int w;
    if (!PyArg_ParseTuple(args, "Ki", &h, &w)) return NULL;
    uintptr_t store = 0;
    char *info = NULL;
    CALL_GO(mp_run_restore(h, w, &store, &info, &kind, &msg));
    PyObject *s = take_str(info);
    if (s == NULL) return NULL;
    return Py_BuildValue("(KN)", (unsigned long long)store, s);
}

PyObject *mp_run_progress_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    long long v[5] = {0};
    mp_run_progress(h, v);
    return Py_BuildValue("(LLLLL)", v[0], v[1], v[2], v[3], v[4]);
}

PyObject *mp_run_start_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    CALL_GO(mp_run_start(h, &kind, &msg));
    Py_RETURN_NONE;
}

PyObject *mp_run_write_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    int w;
    long long epoch;
    PyObject *rows;
    int whole = 0;
    if (!PyArg_ParseTuple(args, "KiLO|p", &h, &w, &epoch, &rows, &whole)) return NULL;
    size_t len = 0;
    char *buf = mp_pack_rows(rows, &len);
    if (buf == NULL) return NULL;
    long long written = 0;
    int kind = 0;
    char *msg = NULL;
    Py_BEGIN_ALLOW_THREADS
    kind = mp_run_write(h, w, epoch, buf, len, whole, &written, &kind, &msg);
    free(buf);
    Py_END_ALLOW_THREADS
    if (kind) return mp_raise(kind, msg);
    return PyLong_FromLongLong(written);
}

PyObject *mp_run_close_epoch_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    int w;
    long long epoch;
    int last = 0;
    if (!PyArg_ParseTuple(args, "KiL|p", &h, &w, &epoch, &last)) return NULL;
    CALL_GO(mp_run_close_epoch(h, w, epoch, last, &kind, &msg));
    Py_RETURN_NONE;
}

PyObject *mp_run_finish_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    int aborted;
    if (!PyArg_ParseTuple(args, "Kp", &h, &aborted)) return NULL;
    CALL_GO(mp_run_finish(h, aborted, &kind, &msg));
    Py_RETURN_NONE;
}

PyObject *mp_run_close_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    CALL_GO(mp_run_close(h, &kind, &msg));
    Py_RETURN_NONE;
}

PyObject *mp_run_metrics_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    char *out = NULL;
    CALL_GO(mp_run_metrics(h, &out, &kind, &msg));
    return take_str(out);
}

PyObject *mp_durable_report_py(PyObject *self, PyObject *args) {
    unsigned long long bh;
    int op, keys;
    const char *flow;
    if (!PyArg_ParseTuple(args, "Kisp", &bh, &op, &flow, &keys)) return NULL;
    char *out = NULL;
    CALL_GO(mp_durable_report(bh, op, (char *)flow, keys, &out, &kind, &msg));
    return take_str(out);
}

PyObject *mp_run_commits_py(PyObject *self, PyObject *args) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    char *out = NULL;
    CALL_GO(mp_run_commits(h, &out, &kind, &msg));
    return take_str(out);
}
