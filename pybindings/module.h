// Shared declarations of the C side of millpond._core.
#ifndef MILLPOND_MODULE_H
#define MILLPOND_MODULE_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

extern PyObject *mp_CoreError;

PyObject *mp_raise(int kind, char *msg);
const char *mp_get_uvarint(const char *p, const char *end, uint64_t *out);
char *mp_pack_rows(PyObject *rows, size_t *out_len);
PyObject *mp_unpack_kv(const char *buf, size_t len);

// Method-table entries defined in other .c files of the package.
#define MP_EXTRA_METHODS

#endif
