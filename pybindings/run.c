// millpond._core: recovery runs (run.go).
#include "module.h"

#include <stdlib.h>

#include "_cgo_export.h"

MP_METHOD(run_open) {
    const char *dir, *flow, *mode;
    int workers, groups, inflight, retain;
    unsigned long long bh;
    double retain_seconds, ratio;
    long long cmin;
    const char *key;
    Py_ssize_t key_len;
    unsigned long long cluster = 0;
    int first = 0, hosted = 0;
    if (!PyArg_ParseTuple(args, "ssiiKsiiddLy#|Kii", &dir, &flow, &workers, &groups, &bh, &mode, &inflight, &retain,
                          &retain_seconds, &ratio, &cmin, &key, &key_len, &cluster, &first, &hosted))
        return NULL;
    uintptr_t h = 0;
    CALL_GO(mp_run_open((char *)dir, (char *)flow, workers, groups, bh, (char *)mode, inflight, retain, retain_seconds,
                        ratio, cmin, (char *)key, (long long)key_len, cluster, first, hosted, &h, &kind, &msg));
    return PyLong_FromUnsignedLongLong(h);
}

MP_METHOD(run_info) { return mp_call_handle_json(args, mp_run_info); }

MP_METHOD(run_restore) {
    unsigned long long h;
    int w;
    if (!PyArg_ParseTuple(args, "Ki", &h, &w)) return NULL;
    uintptr_t store = 0;
    char *info = NULL;
    CALL_GO(mp_run_restore(h, w, &store, &info, &kind, &msg));
    PyObject *d = mp_take_json(info);
    if (d == NULL) return NULL;
    return Py_BuildValue("(KN)", (unsigned long long)store, d);
}

MP_METHOD(run_progress) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    long long v[6] = {0};
    mp_run_progress(h, v);
    return Py_BuildValue("{sLsLsLsLsLsL}", "objects_done", v[0], "objects_total", v[1], "bytes_done", v[2],
                         "bytes_total", v[3], "rows_restored", v[4], "rows_total", v[5]);
}

MP_METHOD(run_start) { return mp_call_handle(args, mp_run_start); }

MP_METHOD(run_close_epoch) {
    unsigned long long h;
    int w;
    long long epoch;
    int last = 0;
    if (!PyArg_ParseTuple(args, "KiL|p", &h, &w, &epoch, &last)) return NULL;
    CALL_GO(mp_run_close_epoch(h, w, epoch, last, &kind, &msg));
    Py_RETURN_NONE;
}

MP_METHOD(run_finish) {
    unsigned long long h;
    int aborted;
    if (!PyArg_ParseTuple(args, "Kp", &h, &aborted)) return NULL;
    CALL_GO(mp_run_finish(h, aborted, &kind, &msg));
    Py_RETURN_NONE;
}

MP_METHOD(run_close) { return mp_call_handle(args, mp_run_close); }

MP_METHOD(run_metrics) { return mp_call_handle_json(args, mp_run_metrics); }

MP_METHOD(run_committed_epoch) {
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "K", &h)) return NULL;
    long long epoch = 0;
    CALL_GO(mp_run_committed_epoch(h, &epoch, &kind, &msg));
    return PyLong_FromLongLong(epoch);
}

MP_METHOD(run_commits) { return mp_call_handle_json(args, mp_run_commits); }
