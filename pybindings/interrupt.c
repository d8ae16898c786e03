// millpond._core: interrupts of calls into the core (interrupt.go).
#include "module.h"

#include "_cgo_export.h"

MP_METHOD(watch_interrupts) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd)) return NULL;
    mp_watch_interrupts(fd);
    Py_RETURN_NONE;
}
