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
 * The trees: one contiguous float64 buffer (a NumPy array) of 4 * base doubles, base a power of two,
 * holding the sum tree and the min tree of one binary layout interleaved: node i's sum at [2i], its
 * minimum at [2i + 1] (root 1, node i's children 2i and 2i + 1, leaves from base). The children of a
 * node, with both their sums and minima, are 32 aligned bytes: one cache line. The update's min-tree
 * path rides on the lines of its sum-tree path, which the draw of the same leaves has just read.
 * (trees.paired makes this buffer; the trees' nodes are its strided views [0::2] and [1::2].)
 *
 * per_draw(pair, masses, n, size, index, weights, f32) -> bool
 *     The PrioritizedSampler's flat draw (kernels.draw, bit for bit): for each of the m float64
 *     masses (a contiguous buffer: a NumPy array), the prefix-sum descent of the sum tree (a mass
 *     above the root's total gives leaf `size`), the leaf clamped to n - 1, its value read as
 *     float32 (f32 true) or float64 into weights[j], stepping left past zero leaves (TorchRL's
 *     rule). index: m int64. The m descents go level by level, each prefetching its next level's
 *     node pair, so their cache misses overlap. False when a zero leaf could not be stepped past.
 *     Checks 1 <= n <= base, size <= base.
 *
 * per_update(pair, leaves, values, raw, m, f32) -> (done, high, raw_max, raw_nan)
 *     Both trees' leaves[j] = values[j] (in order: the last of duplicates wins) and their parents
 *     recomputed level by level (sum: left + right in float64; min: left < right ? left : right),
 *     as kernels.update. values and raw: m float32 (f32 true) or float64. done False, nothing
 *     written, when a leaf is outside [0, base); high: one past the largest leaf; raw_max the
 *     largest raw value (-inf if none), raw_nan whether one is NaN.
 *
 * Holds the GIL throughout (the callers hold TorchRL's buffer locks).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
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

/* Integer arguments args[0..k) into out (addresses as void*, the rest as Py_ssize_t); -1 on error. */
static int
parse_ints(PyObject *const *args, Py_ssize_t k, Py_ssize_t *out)
{
    for (Py_ssize_t i = 0; i < k; i++) {
        out[i] = PyLong_AsSsize_t(args[i]);
        if (out[i] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

#define DRAW_CHUNK 256

/* The interleaved trees (buffer protocol: a NumPy array) of 4 * base float64, base a power of two;
 * its base, or -1 with an exception set and the buffer released. */
static Py_ssize_t
tree_buffer(PyObject *obj, Py_buffer *view, int flags)
{
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    Py_ssize_t base = view->len / 32;
    if (view->len % 32 || base < 1 || (base & (base - 1))) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "the trees must hold 4 * base float64 (sum and min interleaved), base a power of two");
        return -1;
    }
    return base;
}

static PyObject *
per_draw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "per_draw takes 7 arguments");
        return NULL;
    }
    Py_ssize_t a[5];
    if (parse_ints(args + 2, 5, a) < 0)
        return NULL;
    Py_ssize_t n = a[0], size = a[1];
    int64_t *index = (int64_t *)a[2];
    char *wout = (char *)a[3];
    int f32 = a[4] != 0;
    Py_buffer tv, mv;
    Py_ssize_t base = tree_buffer(args[0], &tv, PyBUF_SIMPLE);
    if (base < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &mv, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&tv);
        return NULL;
    }
    const double *pair = (const double *)tv.buf; /* sum of node i: pair[2i] */
    const double *masses = (const double *)mv.buf;
    Py_ssize_t m = mv.len / 8;
    if (mv.len % 8 || n < 1 || n > base || size < 0 || size > base || (m > 0 && (!index || !wout))) {
        PyBuffer_Release(&tv);
        PyBuffer_Release(&mv);
        PyErr_SetString(PyExc_ValueError, "per_draw: bad masses, count or address");
        return NULL;
    }
    const double total = pair[2];
    const double below = nextafter(total, 0.0);
    int ok = 1;
    double t[DRAW_CHUNK];
    int64_t node[DRAW_CHUNK];
    unsigned char outside[DRAW_CHUNK];
    for (Py_ssize_t s = 0; s < m; s += DRAW_CHUNK) {
        Py_ssize_t c = m - s < DRAW_CHUNK ? m - s : DRAW_CHUNK;
        for (Py_ssize_t j = 0; j < c; j++) {
            double v = masses[s + j];
            outside[j] = !(v <= total);
            if (outside[j])
                v = 0.0;
            t[j] = v < below ? v : below;
            node[j] = 1;
        }
        for (Py_ssize_t b = base; b > 1; b >>= 1) {
            for (Py_ssize_t j = 0; j < c; j++) {
                int64_t left = node[j] << 1;
                const double *kids = pair + (left << 1); /* left's sum, min; right's sum, min */
                double left_sum = kids[0];
                int right = (t[j] >= left_sum) & (kids[2] > 0.0);
                /* t -= right ? left_sum : +0.0, without a branch (a random one, mispredicted half
                 * the time); t - 0.0 is t, as the numba kernel's select gives */
                uint64_t bits;
                memcpy(&bits, &left_sum, 8);
                bits &= (uint64_t)0 - (uint64_t)right;
                double sub;
                memcpy(&sub, &bits, 8);
                t[j] -= sub;
                node[j] = left + right;
                if (b > 2)
                    __builtin_prefetch(pair + (node[j] << 2));
            }
        }
        for (Py_ssize_t j = 0; j < c; j++) {
            int64_t i = outside[j] ? (int64_t)size : node[j] - base;
            if (i > n - 1)
                i = n - 1;
            for (;;) {
                double v = pair[2 * (base + i)];
                int zero;
                if (f32) {
                    float w = (float)v; /* (a leaf may round to zero in float32) */
                    ((float *)wout)[s + j] = w;
                    zero = w == 0.0f;
                }
                else {
                    ((double *)wout)[s + j] = v;
                    zero = v == 0.0;
                }
                if (!zero)
                    break;
                if (--i < 0) {
                    ok = 0;
                    i = 0;
                    break;
                }
            }
            index[s + j] = i;
        }
    }
    PyBuffer_Release(&tv);
    PyBuffer_Release(&mv);
    return PyBool_FromLong(ok);
}

static PyObject *
per_update(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "per_update takes 6 arguments");
        return NULL;
    }
    Py_ssize_t a[5];
    if (parse_ints(args + 1, 5, a) < 0)
        return NULL;
    const int64_t *leaves = (const int64_t *)a[0];
    const char *values = (const char *)a[1], *raw = (const char *)a[2];
    Py_ssize_t m = a[3];
    int f32 = a[4] != 0;
    Py_buffer pv;
    Py_ssize_t base = tree_buffer(args[0], &pv, PyBUF_WRITABLE);
    if (base < 0)
        return NULL;
    double *pair = (double *)pv.buf; /* node i: sum pair[2i], min pair[2i + 1] */
    PyObject *result = NULL;
    if (m < 0 || (m > 0 && (!leaves || !values || !raw))) {
        PyErr_SetString(PyExc_ValueError, "per_update: bad count or address");
        goto done;
    }
    int64_t high = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        int64_t leaf = leaves[j];
        if (leaf < 0 || leaf >= base) {
            result = Py_BuildValue("(OndO)", Py_False, (Py_ssize_t)0, 0.0, Py_False);
            goto done;
        }
        if (leaf + 1 > high)
            high = leaf + 1;
    }
    double raw_max = -INFINITY;
    int raw_nan = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        double r = f32 ? (double)((const float *)raw)[j] : ((const double *)raw)[j];
        if (r != r)
            raw_nan = 1;
        else if (r > raw_max)
            raw_max = r;
    }
    int64_t stack_idx[DRAW_CHUNK];
    int64_t *idx = m <= DRAW_CHUNK ? stack_idx : (int64_t *)malloc((size_t)m * sizeof(int64_t));
    if (idx == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        double v = f32 ? (double)((const float *)values)[j] : ((const double *)values)[j];
        idx[j] = leaves[j] + base;
        pair[2 * idx[j]] = v;
        pair[2 * idx[j] + 1] = v;
    }
    for (Py_ssize_t b = base; b > 1; b >>= 1) {
        for (Py_ssize_t j = 0; j < m; j++) {
            int64_t i = idx[j] >> 1;
            idx[j] = i;
            if (b > 2) /* (the node the next level writes: its store would miss) */
                __builtin_prefetch(pair + 2 * (i >> 1), 1);
            const double *kids = pair + 4 * i; /* left's sum, min; right's sum, min */
            pair[2 * i] = kids[0] + kids[2];
            pair[2 * i + 1] = kids[1] < kids[3] ? kids[1] : kids[3];
        }
    }
    if (idx != stack_idx)
        free(idx);
    result = Py_BuildValue("(OLdO)", Py_True, (long long)high, raw_max, raw_nan ? Py_True : Py_False);
done:
    PyBuffer_Release(&pv);
    return result;
}

static PyMethodDef methods[] = {
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL,
     "gather(srcs, dsts, rowbytes, index, n, cap) -> bool: rows index[:n] of every source tensor."},
    {"put", (PyCFunction)(void (*)(void))put, METH_FASTCALL,
     "put(dsts, srcs, rowbytes, start, n): rows [start, start + n) of every destination."},
    {"per_draw", (PyCFunction)(void (*)(void))per_draw, METH_FASTCALL,
     "per_draw(pair, masses, n, size, index, weights, f32) -> bool: the prioritized draw."},
    {"per_update", (PyCFunction)(void (*)(void))per_update, METH_FASTCALL,
     "per_update(pair, leaves, values, raw, m, f32) -> (done, high, raw_max, raw_nan)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModule_Create(&module);
}
