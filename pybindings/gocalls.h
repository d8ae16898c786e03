// The C functions that Go calls (no Python types here: Go files include
// this header). Each takes the GIL itself: Go calls them from goroutines.
#ifndef MILLPOND_GOCALLS_H
#define MILLPOND_GOCALLS_H

#include <stddef.h>

// Operations on a Python backup object (pybackup.c).
enum { MP_BACKUP_LIST = 0, MP_BACKUP_UPLOAD = 1, MP_BACKUP_DOWNLOAD = 2, MP_BACKUP_DELETE = 3 };

// Calls a method of a Python backup object; on failure returns non-zero
// with the error in *err and *not_found set when the object said the key
// does not exist (FileNotFoundError or KeyError).
int mp_pybackup_call(void *obj, int op, char *a, char *b, char **out, size_t *out_len, char **err, int *not_found);
// Drops the backup handle's reference to the object.
void mp_pybackup_release(void *obj);
// Hands one log record to Python's logging (log.c).
void mp_log_emit(int level, char *text, char *attrs, size_t attrs_len);

#endif
