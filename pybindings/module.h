// Shared declarations of the C side of millpond._core.
#ifndef MILLPOND_MODULE_H
#define MILLPOND_MODULE_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

extern PyObject *mp_CoreError;

PyObject *mp_raise(int kind, char *msg);

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
const char *mp_get_uvarint(const char *p, const char *end, uint64_t *out);
char *mp_pack_rows(PyObject *rows, size_t *out_len);
PyObject *mp_unpack_kv(const char *buf, size_t len);

// Methods defined in recovery.c (internal; millpond.recovery and
// millpond.backup are their documented face).
PyObject *mp_backup_open_py(PyObject *self, PyObject *args);
PyObject *mp_backup_python_py(PyObject *self, PyObject *args);
PyObject *mp_backup_close_py(PyObject *self, PyObject *args);
PyObject *mp_backup_describe_py(PyObject *self, PyObject *args);
PyObject *mp_backup_op_py(PyObject *self, PyObject *args);
PyObject *mp_run_open_py(PyObject *self, PyObject *args);
PyObject *mp_run_info_py(PyObject *self, PyObject *args);
PyObject *mp_run_restore_py(PyObject *self, PyObject *args);
PyObject *mp_run_progress_py(PyObject *self, PyObject *args);
PyObject *mp_run_start_py(PyObject *self, PyObject *args);
PyObject *mp_run_write_py(PyObject *self, PyObject *args);
PyObject *mp_run_close_epoch_py(PyObject *self, PyObject *args);
PyObject *mp_run_finish_py(PyObject *self, PyObject *args);
PyObject *mp_run_close_py(PyObject *self, PyObject *args);
PyObject *mp_run_metrics_py(PyObject *self, PyObject *args);
PyObject *mp_durable_report_py(PyObject *self, PyObject *args);
PyObject *mp_run_commits_py(PyObject *self, PyObject *args);
PyObject *mp_pack_snapshot_py(PyObject *self, PyObject *args);

#define MP_EXTRA_METHODS \
    {"backup_open", mp_backup_open_py, METH_VARARGS, NULL}, \
    {"backup_python", mp_backup_python_py, METH_VARARGS, NULL}, \
    {"backup_close", mp_backup_close_py, METH_VARARGS, NULL}, \
    {"backup_describe", mp_backup_describe_py, METH_VARARGS, NULL}, \
    {"backup_op", mp_backup_op_py, METH_VARARGS, NULL}, \
    {"run_open", mp_run_open_py, METH_VARARGS, NULL}, \
    {"run_info", mp_run_info_py, METH_VARARGS, NULL}, \
    {"run_restore", mp_run_restore_py, METH_VARARGS, NULL}, \
    {"run_progress", mp_run_progress_py, METH_VARARGS, NULL}, \
    {"run_start", mp_run_start_py, METH_VARARGS, NULL}, \
    {"run_write", mp_run_write_py, METH_VARARGS, NULL}, \
    {"run_close_epoch", mp_run_close_epoch_py, METH_VARARGS, NULL}, \
    {"run_finish", mp_run_finish_py, METH_VARARGS, NULL}, \
    {"run_close", mp_run_close_py, METH_VARARGS, NULL}, \
    {"run_metrics", mp_run_metrics_py, METH_VARARGS, NULL}, \
    {"durable_report", mp_durable_report_py, METH_VARARGS, NULL}, \
    {"run_commits", mp_run_commits_py, METH_VARARGS, NULL}, \
    {"pack_snapshot", mp_pack_snapshot_py, METH_VARARGS, NULL},

#endif
