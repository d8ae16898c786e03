// A pickle writer for the plain values most states are made of, so a
// snapshot row does not pay for a pickler object and for pickle's lookup of
// every class it names (an aware datetime names three: about 5 us of the
// 6 us a windowing key's state took to pickle).
//
// What it writes is a pickle: pickle.loads (and anything else that reads
// the store) reads it and gets an object equal to the one written, of the
// same types. It covers None, bool, int (64 bits), float, str, bytes,
// tuple, list, dict, set and frozenset of exact built-in types, and the
// datetime module's date, timedelta and datetime (naive or UTC). Anything
// else anywhere in the value, a list, dict or set reached twice (sharing
// and cycles, which only pickle's memo restores), or nesting deeper than
// MAX_DEPTH, makes it give up, and the caller pickles the whole value with
// pickle.dumps as before. No user code runs here: every type handled is
// an exact built-in one, so nothing can change the value while it is
// written.
#include "module.h"

#include <datetime.h>
#include <stdlib.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030B0000  // public from 3.11 on
#define PyFloat_Pack8(x, p, le) _PyFloat_Pack8((x), (unsigned char *)(p), (le))
#endif

enum {
    MAX_DEPTH = 64,
    // Mutable containers remembered to detect sharing; a value with more
    // goes to pickle.dumps, whose memo is a hash table.
    MAX_SHARED = 64,
};

// The classes (and the UTC singleton) a value may name. Each is written
// once and memoized: loads looks a global up in its module every time it
// is named, about 1 us, which a state of many datetimes would pay per item.
enum { G_DATETIME, G_DATE, G_TIMEDELTA, G_UTC, N_GLOBALS };

typedef struct {
    mp_buf *out;
    int proto;
    PyObject *dispatch;  // copyreg.dispatch_table (borrowed)
    PyObject *seen[MAX_SHARED];
    int n_seen;
    int memo[N_GLOBALS];  // memo index + 1 of each global written, 0: not yet
    int n_memo;
} writer;

// 0: supported and written; 1: not supported here; -1: error set.
static int put_value(writer *w, PyObject *obj, int depth);

int mp_buf_grow(mp_buf *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    char *np = realloc(b->p, cap);
    if (np == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = np;
    b->cap = cap;
    return 0;
}

static int put(writer *w, const void *s, size_t n) {
    if (mp_buf_grow(w->out, n) < 0) return -1;
    memcpy(w->out->p + w->out->len, s, n);
    w->out->len += n;
    return 0;
}

static int put_op(writer *w, unsigned char op) { return put(w, &op, 1); }

static int put_le(writer *w, uint64_t v, int n) {
    unsigned char b[8];
    for (int i = 0; i < n; i++) b[i] = (unsigned char)(v >> (8 * i));
    return put(w, b, (size_t)n);
}

static int put_int(writer *w, long long v) {
    if (v >= 0 && v < 256) return put_op(w, 'K') < 0 ? -1 : put_le(w, (uint64_t)v, 1);
    if (v >= 0 && v < 65536) return put_op(w, 'M') < 0 ? -1 : put_le(w, (uint64_t)v, 2);
    if (v >= INT32_MIN && v <= INT32_MAX) return put_op(w, 'J') < 0 ? -1 : put_le(w, (uint64_t)(uint32_t)(int32_t)v, 4);
    // LONG1: the fewest little-endian two's complement bytes that hold v.
    int n = 4;
    while (n < 8 && !(v >= -(1LL << (8 * n - 1)) && v < (1LL << (8 * n - 1)))) n++;
    unsigned char hdr[2] = {0x8a, (unsigned char)n};
    return put(w, hdr, 2) < 0 ? -1 : put_le(w, (uint64_t)v, n);
}

// A str or bytes payload with the short form's opcode when it fits a byte.
static int put_sized(writer *w, unsigned char short_op, unsigned char op4, unsigned char op8, const char *s, size_t n) {
    int rc;
    if (n < 256) {
        unsigned char hdr[2] = {short_op, (unsigned char)n};
        rc = put(w, hdr, 2);
    } else if (n <= UINT32_MAX) {
        rc = put_op(w, op4) < 0 ? -1 : put_le(w, n, 4);
    } else {
        rc = put_op(w, op8) < 0 ? -1 : put_le(w, n, 8);
    }
    return rc < 0 ? -1 : put(w, s, n);
}

static int put_str(writer *w, const char *s) { return put_sized(w, 0x8c, 'X', 0x8d, s, strlen(s)); }

// datetime.<name> as STACK_GLOBAL (protocol 4 resolves a dotted name),
// memoized (MEMOIZE) the first time and fetched (BINGET) after that. The
// writer memoizes nothing else, so the memo holds only these, in order.
static int put_global(writer *w, int which) {
    static const char *const names[N_GLOBALS] = {"datetime", "date", "timedelta", "timezone.utc"};
    if (w->memo[which]) {
        unsigned char get[2] = {'h', (unsigned char)(w->memo[which] - 1)};
        return put(w, get, 2);
    }
    if (put_str(w, "datetime") < 0 || put_str(w, names[which]) < 0) return -1;
    unsigned char ops[2] = {0x93, 0x94};  // STACK_GLOBAL, MEMOIZE
    if (put(w, ops, 2) < 0) return -1;
    w->memo[which] = ++w->n_memo;
    return 0;
}

// A list, dict or set seen before in this value: only pickle's memo keeps
// the sharing (and stops a cycle), so give up.
static int remember(writer *w, PyObject *obj) {
    for (int i = 0; i < w->n_seen; i++)
        if (w->seen[i] == obj) return 1;
    if (w->n_seen == MAX_SHARED) return 1;
    w->seen[w->n_seen++] = obj;
    return 0;
}

// The items of a sequence between MARK and the closing opcode.
static int put_items(writer *w, PyObject *const *items, Py_ssize_t n, int depth) {
    for (Py_ssize_t i = 0; i < n; i++) {
        int rc = put_value(w, items[i], depth);
        if (rc) return rc;
    }
    return 0;
}

static int put_tuple(writer *w, PyObject *t, int depth) {
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    if (n == 0) return put_op(w, ')');
    if (n > 3 && put_op(w, '(') < 0) return -1;
    int rc = put_items(w, &PyTuple_GET_ITEM(t, 0), n, depth);
    if (rc) return rc;
    static const unsigned char by_len[4] = {0, 0x85, 0x86, 0x87};
    return put_op(w, n <= 3 ? by_len[n] : 't');
}

static int put_list(writer *w, PyObject *l, int depth) {
    Py_ssize_t n = PyList_GET_SIZE(l);
    if (put_op(w, ']') < 0) return -1;
    if (n == 0) return 0;
    if (put_op(w, '(') < 0) return -1;
    // No user code runs while the items are written, so the list keeps
    // its size and items.
    int rc = put_items(w, &PyList_GET_ITEM(l, 0), n, depth);
    return rc ? rc : put_op(w, 'e');
}

static int put_dict(writer *w, PyObject *d, int depth) {
    if (put_op(w, '}') < 0) return -1;
    if (PyDict_GET_SIZE(d) == 0) return 0;
    if (put_op(w, '(') < 0) return -1;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v)) {
        int rc = put_value(w, k, depth);
        if (rc == 0) rc = put_value(w, v, depth);
        if (rc) return rc;
    }
    return put_op(w, 'u');
}

static int put_set(writer *w, PyObject *s, int depth, int frozen) {
    if (!frozen && put_op(w, 0x8f) < 0) return -1;  // EMPTY_SET
    if (!frozen && PySet_GET_SIZE(s) == 0) return 0;
    if (put_op(w, '(') < 0) return -1;
    // Iterating an exact set runs no user code (its items' hashes are
    // stored), and a set that changed size would raise here.
    PyObject *it = PyObject_GetIter(s);
    if (it == NULL) return -1;
    PyObject *item;
    int rc = 0;
    while (rc == 0 && (item = PyIter_Next(it)) != NULL) {
        rc = put_value(w, item, depth);
        Py_DECREF(item);
    }
    Py_DECREF(it);
    if (rc) return rc;
    if (PyErr_Occurred()) return -1;
    return put_op(w, frozen ? 0x91 : 0x90);  // FROZENSET, ADDITEMS
}

// A class of the datetime module that nobody gave a reducer of their own
// (copyreg.pickle), so pickle itself would use its __reduce__.
static int plain_datetime_type(writer *w, PyObject *obj) {
    if (w->dispatch == NULL) return 1;
    int has = PyDict_Contains(w->dispatch, (PyObject *)Py_TYPE(obj));
    if (has < 0) PyErr_Clear();
    return has == 0;
}

// date, timedelta and naive or UTC datetime, as their __reduce__ has them:
// the class and its state bytes, or timedelta's three fields.
static int put_datetime(writer *w, PyObject *obj) {
    if (Py_IS_TYPE(obj, PyDateTimeAPI->DeltaType)) {
        if (put_global(w, G_TIMEDELTA) < 0 || put_int(w, PyDateTime_DELTA_GET_DAYS(obj)) < 0 ||
            put_int(w, PyDateTime_DELTA_GET_SECONDS(obj)) < 0 ||
            put_int(w, PyDateTime_DELTA_GET_MICROSECONDS(obj)) < 0)
            return -1;
        unsigned char tail[2] = {0x87, 'R'};
        return put(w, tail, 2);
    }
    if (Py_IS_TYPE(obj, PyDateTimeAPI->DateType)) {
        if (put_global(w, G_DATE) < 0 ||
            put_sized(w, 'C', 'B', 0x8e, (const char *)((PyDateTime_Date *)obj)->data, _PyDateTime_DATE_DATASIZE) < 0)
            return -1;
        unsigned char tail[2] = {0x85, 'R'};
        return put(w, tail, 2);
    }
    // a datetime: naive, or aware in the timezone.utc singleton
    PyObject *tz = PyDateTime_DATE_GET_TZINFO(obj);
    if (tz != Py_None && tz != PyDateTime_TimeZone_UTC) return 1;
    unsigned char data[_PyDateTime_DATETIME_DATASIZE];
    memcpy(data, ((PyDateTime_DateTime *)obj)->data, sizeof data);
    if (PyDateTime_DATE_GET_FOLD(obj)) data[2] |= 128;  // how __reduce_ex__(4+) keeps fold
    if (put_global(w, G_DATETIME) < 0 || put_sized(w, 'C', 'B', 0x8e, (const char *)data, sizeof data) < 0)
        return -1;
    if (tz == Py_None) {
        unsigned char tail[2] = {0x85, 'R'};
        return put(w, tail, 2);
    }
    if (put_global(w, G_UTC) < 0) return -1;
    unsigned char tail[2] = {0x86, 'R'};
    return put(w, tail, 2);
}

static int put_value(writer *w, PyObject *obj, int depth) {
    if (obj == Py_None) return put_op(w, 'N');
    if (obj == Py_True) return put_op(w, 0x88);
    if (obj == Py_False) return put_op(w, 0x89);
    PyTypeObject *t = Py_TYPE(obj);
    if (t == &PyLong_Type) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow) return 1;
        return put_int(w, v);
    }
    if (t == &PyFloat_Type) {
        unsigned char b[9] = {'G'};
        if (PyFloat_Pack8(PyFloat_AS_DOUBLE(obj), (char *)b + 1, 0) < 0) return -1;
        return put(w, b, 9);
    }
    // Opcodes past here (bytes, sets, short strings, STACK_GLOBAL) come
    // with protocols 3 and 4; older ones go to pickle.dumps.
    if (w->proto < 4) return 1;
    if (t == &PyUnicode_Type) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(obj, &n);
        if (s == NULL) {  // lone surrogates: pickle writes them its own way
            PyErr_Clear();
            return 1;
        }
        return put_sized(w, 0x8c, 'X', 0x8d, s, (size_t)n);
    }
    if (t == &PyBytes_Type) return put_sized(w, 'C', 'B', 0x8e, PyBytes_AS_STRING(obj), (size_t)PyBytes_GET_SIZE(obj));
    if (++depth > MAX_DEPTH) return 1;
    if (t == &PyTuple_Type) return put_tuple(w, obj, depth);
    if (t == &PyFrozenSet_Type) return put_set(w, obj, depth, 1);
    if (t == &PyList_Type || t == &PyDict_Type || t == &PySet_Type) {
        if (remember(w, obj)) return 1;
        if (t == &PyList_Type) return put_list(w, obj, depth);
        if (t == &PyDict_Type) return put_dict(w, obj, depth);
        return put_set(w, obj, depth, 0);
    }
    if ((Py_IS_TYPE(obj, PyDateTimeAPI->DateTimeType) || Py_IS_TYPE(obj, PyDateTimeAPI->DateType) ||
         Py_IS_TYPE(obj, PyDateTimeAPI->DeltaType)) &&
        plain_datetime_type(w, obj))
        return put_datetime(w, obj);
    return 1;
}

static PyObject *dispatch_table = NULL;
static PyObject *unix_epoch = NULL, *one_microsecond = NULL, *tzinfo_name = NULL;

// Days from 1970-01-01 to a proleptic Gregorian date.
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

// snapshot_time(t) -> int | t: a UTC datetime (tzinfo is timezone.utc) as
// microseconds since 1970, what windowing snapshots keep (an int pickles
// in a fraction of a datetime's time); any other value as it is. A
// subclass of datetime goes through (t - 1970) // 1 us, so its own
// arithmetic decides, as in the Python this replaces.
PyObject *mp_snapshot_time(PyObject *t) {
    if (PyDateTime_CheckExact(t)) {
        if (PyDateTime_DATE_GET_TZINFO(t) != PyDateTime_TimeZone_UTC) return Py_NewRef(t);
        int64_t days = days_from_civil(PyDateTime_GET_YEAR(t), PyDateTime_GET_MONTH(t), PyDateTime_GET_DAY(t));
        int64_t secs = ((days * 24 + PyDateTime_DATE_GET_HOUR(t)) * 60 + PyDateTime_DATE_GET_MINUTE(t)) * 60 +
                       PyDateTime_DATE_GET_SECOND(t);
        return PyLong_FromLongLong(secs * 1000000 + PyDateTime_DATE_GET_MICROSECOND(t));
    }
    if (!PyDateTime_Check(t)) return Py_NewRef(t);
    PyObject *tz = PyObject_GetAttr(t, tzinfo_name);
    if (tz == NULL) return NULL;
    Py_DECREF(tz);
    if (tz != PyDateTime_TimeZone_UTC) return Py_NewRef(t);
    PyObject *delta = PyNumber_Subtract(t, unix_epoch);
    PyObject *micros = delta ? PyNumber_FloorDivide(delta, one_microsecond) : NULL;
    Py_XDECREF(delta);
    return micros;
}

MP_METHOD(snapshot_time) { return mp_snapshot_time(args); }  // METH_O: args is t

int mp_pickle_init(void) {
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL) return -1;
    PyObject *copyreg = PyImport_ImportModule("copyreg");
    dispatch_table = copyreg ? PyObject_GetAttrString(copyreg, "dispatch_table") : NULL;
    Py_XDECREF(copyreg);
    if (dispatch_table != NULL && !PyDict_Check(dispatch_table)) Py_CLEAR(dispatch_table);
    unix_epoch = PyDateTimeAPI->DateTime_FromDateAndTime(1970, 1, 1, 0, 0, 0, 0, PyDateTime_TimeZone_UTC,
                                                         PyDateTimeAPI->DateTimeType);
    one_microsecond = PyDelta_FromDSU(0, 0, 1);
    tzinfo_name = PyUnicode_InternFromString("tzinfo");
    return dispatch_table == NULL || unix_epoch == NULL || one_microsecond == NULL || tzinfo_name == NULL ? -1 : 0;
}

int mp_fast_pickle(PyObject *obj, int proto, mp_buf *out) {
    if (proto < 2 || proto > 255) return 1;
    size_t start = out->len;
    writer w = {.out = out, .proto = proto, .dispatch = dispatch_table};
    unsigned char hdr[2] = {0x80, (unsigned char)proto};
    int rc = put(&w, hdr, 2);
    if (rc == 0) rc = put_value(&w, obj, 0);
    if (rc == 0) rc = put_op(&w, '.');
    if (rc != 0) out->len = start;
    return rc;
}

// fast_pickle(obj, protocol) -> bytes | None: what snapshots write for obj
// when this writer handles it, else None (the caller uses pickle.dumps).
MP_METHOD(fast_pickle) {
    PyObject *obj;
    int proto;
    if (!PyArg_ParseTuple(args, "Oi", &obj, &proto)) return NULL;
    mp_buf b = {0};
    int rc = mp_fast_pickle(obj, proto, &b);
    PyObject *res = NULL;
    if (rc == 0) {
        res = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.len);
    } else if (rc == 1) {
        res = Py_NewRef(Py_None);
    }
    free(b.p);
    return res;
}
