// millpond._core: cluster membership (cluster.go).
#include "module.h"

#include <stdlib.h>
#include <string.h>

#include "_cgo_export.h"

MP_METHOD(cluster_open) {
    const char *opts, *secret;
    Py_ssize_t secret_len;
    if (!PyArg_ParseTuple(args, "sy#", &opts, &secret, &secret_len)) return NULL;
    uintptr_t h = 0;
    CALL_GO(mp_cluster_open((char *)opts, (char *)secret, (long long)secret_len, &h, &kind, &msg));
    return PyLong_FromUnsignedLongLong(h);
}

// Send and drain only move bytes between queues (neither blocks): they
// keep the GIL, which releasing would cost more than the call.

MP_METHOD(cluster_send) {
    unsigned long long h;
    int to;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "Kiy*", &h, &to, &data)) return NULL;
    int kind = 0;
    char *msg = NULL;
    kind = mp_cluster_send(h, to, (char *)data.buf, (long long)data.len, &kind, &msg);
    PyBuffer_Release(&data);
    if (kind) return mp_raise(kind, msg);
    Py_RETURN_NONE;
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

MP_METHOD(cluster_drain) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    char *buf = NULL, *msg = NULL;
    long long len = 0;
    int count = 0, kind = 0;
    kind = mp_cluster_drain(h, &buf, &len, &count, &kind, &msg);
    if (kind) return mp_raise(kind, msg);
    PyObject *list = PyList_New(count);
    if (list == NULL) {
        free(buf);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)buf, *end = p + len;
    for (int i = 0; i < count; i++) {
        if (end - p < 8) goto malformed;
        uint32_t from = get_u32(p), n = get_u32(p + 4);
        p += 8;
        if ((uint64_t)(end - p) < n) goto malformed;
        PyObject *item = Py_BuildValue("(iy#)", (int)from, (const char *)p, (Py_ssize_t)n);
        if (item == NULL) {
            Py_DECREF(list);
            free(buf);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
        p += n;
    }
    free(buf);
    return list;
malformed:
    Py_DECREF(list);
    free(buf);
    PyErr_SetString(PyExc_RuntimeError, "millpond._core: malformed batch list from the Go core");
    return NULL;
}

MP_METHOD(cluster_wait) {
    unsigned long long h;
    double timeout;
    if (!PyArg_ParseTuple(args, "Kd", &h, &timeout)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    mp_cluster_wait(h, timeout);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

MP_METHOD(cluster_congested) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    return PyBool_FromLong(mp_cluster_congested(h));
}

MP_METHOD(cluster_report) {
    unsigned long long h;
    long long epoch;
    int phase, ready;
    const char *done_json;
    if (!PyArg_ParseTuple(args, "KLips", &h, &epoch, &phase, &ready, &done_json)) return NULL;
    int decided = 0;
    char *done = NULL;
    CALL_GO(mp_cluster_report(h, epoch, phase, ready, (char *)done_json, &decided, &done, &kind, &msg));
    if (!decided) Py_RETURN_NONE;
    return mp_take_json(done);
}

MP_METHOD(cluster_stats) { return mp_call_handle_json(args, mp_cluster_stats); }

MP_METHOD(cluster_error) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    return mp_take_str(mp_cluster_error(h));
}

MP_METHOD(cluster_close) { return mp_call_handle(args, mp_cluster_close); }

MP_METHOD(cluster_abort) {
    unsigned long long h;
    const char *reason;
    if (!PyArg_ParseTuple(args, "Ks", &h, &reason)) return NULL;
    CALL_GO(mp_cluster_abort(h, (char *)reason, &kind, &msg));
    Py_RETURN_NONE;
}
