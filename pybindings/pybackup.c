// Calls into Python backup objects from Go goroutines. Go never touches a
// PyObject itself: it calls these functions, which take the GIL.
#include "module.h"

#include <stdlib.h>
#include <string.h>

static char *dup_error(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    const char *name = type ? ((PyTypeObject *)type)->tp_name : "Error";
    PyObject *s = value ? PyObject_Str(value) : NULL;
    const char *text = s ? PyUnicode_AsUTF8(s) : NULL;
    if (text == NULL) {
        PyErr_Clear();
        text = "";
    }
    size_t n = strlen(name) + strlen(text) + 3;
    char *out = malloc(n);
    if (out) snprintf(out, n, "%s: %s", name, text);
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return out;
}

// Builds "key\tsize\0" entries from list_keys(prefix). Sizes are not part
// of the Python protocol; they are reported as -1.
static int list_keys(PyObject *obj, const char *prefix, char **out, size_t *out_len) {
    PyObject *res = PyObject_CallMethod(obj, "list_keys", "s", prefix);
    if (res == NULL) return -1;
    PyObject *it = PyObject_GetIter(res);
    Py_DECREF(res);
    if (it == NULL) return -1;
    size_t cap = 256, len = 0;
    char *buf = malloc(cap);
    PyObject *item;
    while (buf && (item = PyIter_Next(it)) != NULL) {
        Py_ssize_t kl;
        const char *k = PyUnicode_Check(item) ? PyUnicode_AsUTF8AndSize(item, &kl) : NULL;
        if (k == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "list_keys() must return str keys");
            Py_DECREF(item);
            Py_DECREF(it);
            free(buf);
            return -1;
        }
        while (len + (size_t)kl + 8 > cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        if (buf) {
            memcpy(buf + len, k, (size_t)kl);
            len += (size_t)kl;
            memcpy(buf + len, "\t-1", 4);
            len += 4;  // includes the NUL separator
        }
        Py_DECREF(item);
    }
    Py_DECREF(it);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (PyErr_Occurred()) {
        free(buf);
        return -1;
    }
    *out = buf;
    *out_len = len;
    return 0;
}

int mp_pybackup_call(void *objp, int op, char *a, char *b, char **out, size_t *out_len, char **err, int *not_found) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *obj = (PyObject *)objp;
    PyObject *res = NULL;
    int rc = 0;
    *out = NULL;
    *out_len = 0;
    *not_found = 0;
    PyObject *pathlib = NULL, *Path = NULL, *path = NULL;
    if (op == MP_BACKUP_UPLOAD || op == MP_BACKUP_DOWNLOAD) {
        pathlib = PyImport_ImportModule("pathlib");
        Path = pathlib ? PyObject_GetAttrString(pathlib, "Path") : NULL;
        path = Path ? PyObject_CallFunction(Path, "s", op == MP_BACKUP_UPLOAD ? a : b) : NULL;
        if (path == NULL) rc = -1;
    }
    if (rc == 0) {
        switch (op) {
            case MP_BACKUP_LIST:
                rc = list_keys(obj, a, out, out_len);
                break;
            case MP_BACKUP_UPLOAD:
                res = PyObject_CallMethod(obj, "upload", "Os", path, b);
                rc = res ? 0 : -1;
                break;
            case MP_BACKUP_DOWNLOAD:
                res = PyObject_CallMethod(obj, "download", "sO", a, path);
                rc = res ? 0 : -1;
                break;
            case MP_BACKUP_DELETE:
                res = PyObject_CallMethod(obj, "delete", "s", a);
                rc = res ? 0 : -1;
                break;
            default:
                PyErr_SetString(PyExc_ValueError, "unknown backup operation");
                rc = -1;
        }
    }
    Py_XDECREF(res);
    Py_XDECREF(path);
    Py_XDECREF(Path);
    Py_XDECREF(pathlib);
    if (rc != 0) {
        // The Backup protocol says a missing key is FileNotFoundError (or
        // KeyError): decided by the class, never by the message.
        *not_found = PyErr_ExceptionMatches(PyExc_FileNotFoundError) || PyErr_ExceptionMatches(PyExc_KeyError);
        *err = dup_error();
    }
    PyGILState_Release(g);
    return rc;
}

void mp_pybackup_release(void *objp) {
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF((PyObject *)objp);
    PyGILState_Release(g);
}
