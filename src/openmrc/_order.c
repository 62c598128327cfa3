/* openmrc._order: put a list of fixed-width records in order of their first item, in place.
 *
 * The simulator's ordered mode (openmrc/sim/engine.py) keeps each nanosecond's events as one flat list,
 * origin, callback, argument, origin, callback, argument, ..., and runs them by origin, each origin's events
 * in the order they came. Ordering such a list in Python means making a key object per event and sorting
 * those (some 125 ns an event); here the origins are read as C integers, the records' places sorted by
 * (origin, place) and the list's item pointers moved into that order: no object is made, none changes
 * hands (a permutation of the list's own references), and no Python code runs meanwhile.
 *
 * Nearly every list is short (tens of records) and nearly in order (an origin's events come in order; a
 * third of the records come after one of a later origin, a few places out): a check that finds a list
 * in order, else an insertion sort, which costs as many moves as places the records are out; past a budget
 * of moves (a list far out of order, of a simulation's set-up say) qsort orders the rest, the places
 * breaking ties so that the order is the same stable one. Only the records from the first one moved are
 * written back.
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
        /* Insertion: linear in the records and in how far each is out of place, and nearly every list
         * is nearly in order; past a budget of moves (a list far out of order), qsort takes what is left. */
        Py_ssize_t budget = 8 * m + 256, first_moved = m;
        for (Py_ssize_t i = 1; i < m && budget >= 0; i++) {
            entry x = e[i];
            Py_ssize_t j = i;
            for (; j > 0 && e[j - 1].key > x.key; j--) e[j] = e[j - 1];
            e[j] = x;
            budget -= i - j;
            if (j < i && j < first_moved) first_moved = j;
        }
        if (budget < 0) {
            qsort(e, (size_t)m, sizeof(entry), by_key_then_place);
            first_moved = 0;
        }
        /* the records from the first one moved: copied aside, then written back in order */
        Py_ssize_t from = first_moved * width, n_items = len - from;
        size_t bytes = (size_t)n_items * sizeof(PyObject *);
        PyObject *stack_copy[ON_STACK * 3];
        PyObject **copy = n_items <= ON_STACK * 3 ? stack_copy : PyMem_Malloc(bytes);
        if (copy == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        memcpy(copy, items + from, bytes);
        PyObject **out = items + from;
        if (width == 3) {
            for (Py_ssize_t i = first_moved; i < m; i++, out += 3) {
                PyObject **rec = copy + (e[i].place * 3 - from);
                out[0] = rec[0];
                out[1] = rec[1];
                out[2] = rec[2];
            }
        } else {
            for (Py_ssize_t i = first_moved; i < m; i++, out += width)
                memcpy(out, copy + (e[i].place * width - from), (size_t)width * sizeof(PyObject *));
        }
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
