/* replaystore.integrations.torchrl._native: the row copies of the TorchRL buffers' fast paths.
 *
 * Optional (built by setup.py): without it fastpath.py gathers with one torch.index_select per
 * stored tensor and writes with TorchRL's own code, with the same results
 * (tests/test_torchrl_fastpath.py runs both).
 *
 * The tensors are given by address (Tensor.data_ptr()) because torch tensors do not export the
 * buffer protocol and a .numpy() view per tensor per call costs more than the copy. The caller
 * (fastpath.py) guarantees what C cannot see: every address is the start of a live, C-contiguous
 * CPU tensor holding at least `cap` rows (sources) or `n` rows (destinations) of rowbytes[i] bytes.
 * What C checks: the tuples' lengths and types, and every index in [0, cap), before it writes.
 *
 * gather(srcs, dsts, rowbytes, index, n, cap) -> bool
 *     dst_i[j] = src_i[index[j]] (row j of every destination i, rowbytes[i] bytes) for j < n, in
 *     one pass over the index that copies each index's row of every tensor, prefetching the rows
 *     PREFETCH_AHEAD indices ahead, so the cache misses of all tensors overlap (one index_select
 *     per tensor waits for them tensor by tensor). srcs, dsts, rowbytes: tuples of ints of one
 *     length; index: the address of n int64. False (nothing written) when an index is outside
 *     [0, cap); TypeError/ValueError for malformed arguments (a caller bug).
 *
 * put(dsts, srcs, rowbytes, start, n) -> None
 *     Rows [start, start + n) of every destination i = the n rows of source i (one memcpy each).
 *
 * Holds the GIL throughout (the callers hold TorchRL's buffer locks).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_TENSORS 128
#define PREFETCH_AHEAD 16

/* The addresses and row sizes of three tuples of ints of one length; -1 with an exception set. */
static Py_ssize_t
parse_tensors(PyObject *a, PyObject *b, PyObject *sizes, char **pa, char **pb, Py_ssize_t *rowb)
{
    if (!PyTuple_Check(a) || !PyTuple_Check(b) || !PyTuple_Check(sizes)) {
        PyErr_SetString(PyExc_TypeError, "addresses and row sizes must be tuples of ints");
        return -1;
    }
    Py_ssize_t k = PyTuple_GET_SIZE(a);
    if (k != PyTuple_GET_SIZE(b) || k != PyTuple_GET_SIZE(sizes) || k > MAX_TENSORS) {
        PyErr_SetString(PyExc_ValueError, "the tuples must have one length (at most 128)");
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        pa[i] = (char *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(a, i));
        pb[i] = (char *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(b, i));
        rowb[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(sizes, i));
        if (PyErr_Occurred())
            return -1;
        if (rowb[i] < 0 || ((pa[i] == NULL || pb[i] == NULL) && rowb[i] > 0)) {
            PyErr_SetString(PyExc_ValueError, "null address or negative row size");
            return -1;
        }
    }
    return k;
}

static PyObject *
gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "gather takes 6 arguments");
        return NULL;
    }
    char *src[MAX_TENSORS], *dst[MAX_TENSORS];
    Py_ssize_t rowb[MAX_TENSORS];
    Py_ssize_t k = parse_tensors(args[0], args[1], args[2], src, dst, rowb);
    if (k < 0)
        return NULL;
    const int64_t *index = (const int64_t *)PyLong_AsVoidPtr(args[3]);
    Py_ssize_t n = PyLong_AsSsize_t(args[4]);
    Py_ssize_t cap = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (n < 0 || (n > 0 && index == NULL)) {
        PyErr_SetString(PyExc_ValueError, "gather: bad index or count");
        return NULL;
    }
    for (Py_ssize_t j = 0; j < n; j++)
        if (index[j] < 0 || index[j] >= cap)
            Py_RETURN_FALSE;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (j + PREFETCH_AHEAD < n) {
            int64_t ahead = index[j + PREFETCH_AHEAD];
            for (Py_ssize_t i = 0; i < k; i++) {
                const char *row = src[i] + ahead * rowb[i];
                __builtin_prefetch(row);
                if (rowb[i] > 64)
                    __builtin_prefetch(row + rowb[i] - 1);
            }
        }
        int64_t r = index[j];
        for (Py_ssize_t i = 0; i < k; i++) {
            Py_ssize_t b = rowb[i];
            char *d = dst[i] + j * b;
            const char *s = src[i] + r * b;
            switch (b) { /* (the common small rows: fixed-size copies the compiler inlines) */
            case 1: *d = *s; break;
            case 4: memcpy(d, s, 4); break;
            case 8: memcpy(d, s, 8); break;
            case 16: memcpy(d, s, 16); break;
            default: memcpy(d, s, (size_t)b);
            }
        }
    }
    Py_RETURN_TRUE;
}

static PyObject *
put(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "put takes 5 arguments");
        return NULL;
    }
    char *dst[MAX_TENSORS], *src[MAX_TENSORS];
    Py_ssize_t rowb[MAX_TENSORS];
    Py_ssize_t k = parse_tensors(args[0], args[1], args[2], dst, src, rowb);
    if (k < 0)
        return NULL;
    Py_ssize_t start = PyLong_AsSsize_t(args[3]);
    Py_ssize_t n = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (start < 0 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "put: negative start or count");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < k; i++)
        if (rowb[i] > 0 && n > 0)
            memcpy(dst[i] + start * rowb[i], src[i], (size_t)(n * rowb[i]));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL,
     "gather(srcs, dsts, rowbytes, index, n, cap) -> bool: rows index[:n] of every source tensor."},
    {"put", (PyCFunction)(void (*)(void))put, METH_FASTCALL,
     "put(dsts, srcs, rowbytes, start, n): rows [start, start + n) of every destination."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModule_Create(&module);
}
