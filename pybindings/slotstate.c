// Key states that are one slot of their logic object, read by the packer.
//
// stateful_map's logic (millpond.operators._StatefulMapLogic) snapshots to
// its state slot: its .snapshot() is `return self.state`. Calling it from
// C cost a method lookup and a Python frame, 0.2-0.3 us a key, which a word
// count with recovery pays for every key of every epoch (its epochs are
// whole). The operators module registers the class and the slot at import;
// the packer (snapshot.c) then reads the slot of an object of exactly that
// type. A subclass, or an unset slot, is left to the method.
#include "module.h"

#include <structmember.h>

Py_ssize_t mp_slot_offset(PyTypeObject *type, const char *name) {
    PyObject *d = PyDict_GetItemString(type->tp_dict, name);  // borrowed
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, name);
        return -1;
    }
    return ((PyMemberDescrObject *)d)->d_member->offset;
}

enum { MAX_SLOT_STATES = 4 };

static struct {
    PyTypeObject *type;
    Py_ssize_t off;
} slot_states[MAX_SLOT_STATES];
static int n_slot_states;

// slot_state_register(type, name): objects of exactly type snapshot to
// their slot name. Registering a type again replaces its slot.
MP_METHOD(slot_state_register) {
    PyTypeObject *type;
    const char *name;
    if (!PyArg_ParseTuple(args, "O!s", &PyType_Type, &type, &name)) return NULL;
    Py_ssize_t off = mp_slot_offset(type, name);
    if (off < 0) return NULL;
    int i = 0;
    while (i < n_slot_states && slot_states[i].type != type) i++;
    if (i == MAX_SLOT_STATES) {
        PyErr_Format(PyExc_RuntimeError, "slot_state_register: at most %d types", MAX_SLOT_STATES);
        return NULL;
    }
    if (i == n_slot_states) {
        // Held for the offset's sake: it is only valid for this type.
        slot_states[i].type = (PyTypeObject *)Py_NewRef(type);
        n_slot_states++;
    }
    slot_states[i].off = off;
    Py_RETURN_NONE;
}

PyObject *mp_slot_state(PyObject *obj) {
    for (int i = 0; i < n_slot_states; i++) {
        if (Py_IS_TYPE(obj, slot_states[i].type)) {
            PyObject *v = *(PyObject **)((char *)obj + slot_states[i].off);
            return v == NULL ? NULL : Py_NewRef(v);
        }
    }
    return NULL;
}
