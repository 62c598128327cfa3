/* openmrc._order: put a list of fixed-width records in order of their first item, in place.
 *
 * The simulator's ordered mode (openmrc/sim/engine.py) keeps each nanosecond's events as one flat list,
 * origin, callback, argument, origin, callback, argument, ..., and runs them by origin, each origin's events
 * in the order they came. Ordering such a list in Python means making a key object per event and sorting
 * those (some 125 ns an event); here the origins are read as C integers, the records' places sorted by
 * (origin, place) and the list's item pointers moved into that order: no object is made, none changes
 * hands (a permutation of the list's own references), and no Python code runs meanwhile.
 *
 * Nearly every list is short (tens of records) and nearly in order: an insertion sort, after a check
 * that finds most lists already in order. Long ones (a simulation's set-up can put a whole fabric's
 * events at one time) are sorted with qsort (places break ties, so the order is the same stable one).
 *
 * Built by scripts/build_native.py with the mypyc modules; the engine falls back to its own Python
 * ordering (the reference) when this module is absent or built from another source.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    long key;
    Py_ssize_t place;
} entry;

#define ON_STACK 256 /* records ordered without allocating */
#define INSERTION_MAX 64

static int by_key_then_place(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->place < y->place ? -1 : (x->place > y->place);
}

static PyObject *order_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "order_records(records, width) takes 2 arguments");
        return NULL;
    }
    PyObject *records = args[0];
    if (!PyList_CheckExact(records)) {
        PyErr_Format(PyExc_TypeError, "records must be a list, not %.100s", Py_TYPE(records)->tp_name);
        return NULL;
    }
    Py_ssize_t width = PyLong_AsSsize_t(args[1]);
    if (width == -1 && PyErr_Occurred()) return NULL;
    if (width < 1) {
        PyErr_Format(PyExc_ValueError, "width must be at least 1, not %zd", width);
        return NULL;
    }
    Py_ssize_t len = PyList_GET_SIZE(records);
    if (len % width) {
        PyErr_Format(PyExc_ValueError, "%zd items are not whole records of %zd", len, width);
        return NULL;
    }
    Py_ssize_t m = len / width;
    if (m < 2) Py_RETURN_NONE;

    PyObject **items = ((PyListObject *)records)->ob_item;
    entry stack_entries[ON_STACK];
    entry *e = m <= ON_STACK ? stack_entries : PyMem_Malloc((size_t)m * sizeof(entry));
    if (e == NULL) return PyErr_NoMemory();
    int sorted = 1;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *first = items[i * width];
        if (!PyLong_Check(first)) {
            PyErr_Format(PyExc_TypeError, "record %zd begins with %.100s, not an int", i,
                         Py_TYPE(first)->tp_name);
            goto fail;
        }
        long key;
        int overflow = 0;
#if PY_VERSION_HEX < 0x030C0000
        Py_ssize_t size = Py_SIZE(first); /* (CPython's int layout up to 3.11) */
        if (size == 0 || size == 1)       /* no digit or one: nearly every origin, read directly */
            key = size ? (long)((PyLongObject *)first)->ob_digit[0] : 0;
        else
#endif
            key = PyLong_AsLongAndOverflow(first, &overflow);
        if (overflow || key < 0) {
            PyErr_Format(PyExc_ValueError, "record %zd begins with %R: not an int in 0..%ld", i, first,
                         LONG_MAX);
            goto fail;
        }
        e[i].key = key;
        e[i].place = i;
        if (i && key < e[i - 1].key) sorted = 0;
    }
    if (!sorted) {
        if (m <= INSERTION_MAX) {
            for (Py_ssize_t i = 1; i < m; i++) {
                entry x = e[i];
                Py_ssize_t j = i;
                for (; j > 0 && e[j - 1].key > x.key; j--) e[j] = e[j - 1];
                e[j] = x;
            }
        } else {
            qsort(e, (size_t)m, sizeof(entry), by_key_then_place);
        }
        size_t bytes = (size_t)len * sizeof(PyObject *);
        PyObject *stack_copy[ON_STACK * 3];
        PyObject **copy = len <= ON_STACK * 3 ? stack_copy : PyMem_Malloc(bytes);
        if (copy == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        memcpy(copy, items, bytes);
        for (Py_ssize_t i = 0; i < m; i++)
            memcpy(items + i * width, copy + e[i].place * width, (size_t)width * sizeof(PyObject *));
        if (copy != stack_copy) PyMem_Free(copy);
    }
    if (e != stack_entries) PyMem_Free(e);
    Py_RETURN_NONE;
fail:
    if (e != stack_entries) PyMem_Free(e);
    return NULL;
}

static PyMethodDef methods[] = {
    {"order_records", (PyCFunction)(void (*)(void))order_records, METH_FASTCALL,
     "order_records(records, width): order the list's records (each `width` consecutive items) by their\n"
     "first item, an int from 0, records with equal first items keeping their order; in place."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "openmrc._order",
                                    "Ordering a list's fixed-width records by their first item, in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__order(void) { return PyModule_Create(&module); }
