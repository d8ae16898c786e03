// millpond._core: backups (backup.go) and the reports on their recovery
// data (report.go).
#include "module.h"

#include <stdlib.h>
#include <string.h>

#include "_cgo_export.h"

MP_METHOD(backup_open) {
    const char *uri, *key = "", *secret = "", *token = "";
    if (!PyArg_ParseTuple(args, "s|sss", &uri, &key, &secret, &token)) return NULL;
    uintptr_t h = 0;
    CALL_GO(mp_backup_open((char *)uri, (char *)key, (char *)secret, (char *)token, &h, &kind, &msg));
    return PyLong_FromUnsignedLongLong(h);
}

MP_METHOD(backup_python) {
    PyObject *obj;
    const char *desc;
    if (!PyArg_ParseTuple(args, "Os", &obj, &desc)) return NULL;
    Py_INCREF(obj);  // released by mp_pybackup_release when the handle closes
    uintptr_t h = 0;
    mp_backup_python(obj, (char *)desc, &h);
    return PyLong_FromUnsignedLongLong(h);
}

MP_METHOD(backup_close) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    mp_backup_close(h);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

MP_METHOD(backup_describe) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    char *out = NULL;
    CALL_GO(mp_backup_describe(h, &out, &kind, &msg));
    return mp_take_str(out);
}

MP_METHOD(backup_list) {
    unsigned long long h;
    const char *prefix;
    if (!PyArg_ParseTuple(args, "Ks", &h, &prefix)) return NULL;
    char *out = NULL;
    size_t len = 0;
    CALL_GO(mp_backup_list(h, (char *)prefix, &out, &len, &kind, &msg));
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

MP_METHOD(backup_upload) {
    unsigned long long h;
    const char *path, *key;
    if (!PyArg_ParseTuple(args, "Kss", &h, &path, &key)) return NULL;
    CALL_GO(mp_backup_upload(h, (char *)path, (char *)key, &kind, &msg));
    Py_RETURN_NONE;
}

MP_METHOD(backup_download) {
    unsigned long long h;
    const char *key, *path;
    if (!PyArg_ParseTuple(args, "Kss", &h, &key, &path)) return NULL;
    CALL_GO(mp_backup_download(h, (char *)key, (char *)path, &kind, &msg));
    Py_RETURN_NONE;
}

MP_METHOD(backup_delete) {
    unsigned long long h;
    const char *key;
    if (!PyArg_ParseTuple(args, "Ks", &h, &key)) return NULL;
    CALL_GO(mp_backup_delete(h, (char *)key, &kind, &msg));
    Py_RETURN_NONE;
}

MP_METHOD(backup_check) { return mp_call_handle(args, mp_backup_check); }

MP_METHOD(durable_inspect) {
    unsigned long long h;
    const char *flow;
    int keys;
    const char *key;
    Py_ssize_t key_len;
    if (!PyArg_ParseTuple(args, "Kspy#", &h, &flow, &keys, &key, &key_len)) return NULL;
    char *out = NULL;
    CALL_GO(mp_durable_inspect(h, (char *)flow, keys, (char *)key, (long long)key_len, &out, &kind, &msg));
    return mp_take_json(out);
}

MP_METHOD(durable_verify) {
    unsigned long long h;
    const char *flow;
    const char *key;
    Py_ssize_t key_len;
    if (!PyArg_ParseTuple(args, "Ksy#", &h, &flow, &key, &key_len)) return NULL;
    char *out = NULL;
    CALL_GO(mp_durable_verify(h, (char *)flow, (char *)key, (long long)key_len, &out, &kind, &msg));
    return mp_take_json(out);
}

MP_METHOD(durable_flows) { return mp_call_handle_json(args, mp_durable_flows); }
