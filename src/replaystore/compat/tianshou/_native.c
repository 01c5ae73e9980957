/* replaystore.compat.tianshou._native: the hot parts of a Tianshou buffer (add; prioritized draws and updates) in C.
 *
 * Optional (built by setup.py, like replaystore._ring): without it the buffers use the reference
 * path in Python (counters.advance, a numba loop, and common.write_same_keys, one NumPy assignment
 * per stored array), which gives the same results (tests/compat/test_tianshou_native.py).
 *
 * advance(ids, rew, terminated, truncated, counters)
 *     The manager's per-sub-buffer bookkeeping (Tianshou's _update_state_pre_add loop) for rows
 *     ids[j]. counters = (cap, ins, lengths, ret, eplen, start, last_local, last_global, offset),
 *     contiguous int64 arrays (ret: float64) of one entry per sub-buffer. Returns
 *     (positions, episode_returns, episode_lengths, episode_starts, done), new arrays of len(ids);
 *     False (nothing changed) when an episode start lies beyond the stored transitions (Tianshou's
 *     MalformedBufferError); None (nothing changed) for anything it does not handle exactly as the
 *     reference (other dtypes or layouts, an id out of range): the caller then takes that path.
 *
 * put(meta, batch, pos, done, allowed)
 *     meta[pos] = batch for two Batch trees with the same keys (at the top level: batch's keys in
 *     `allowed`, or all of them when it is None, plus "done" when `done` is given, which then
 *     replaces batch's own) and leaves that are arrays of identical dtypes: row j of each leaf of
 *     batch is copied into row pos[j] of the stored array (pos: an int64 array), or the whole leaf
 *     into row pos (pos: an int; the leaves are then single rows). Every check comes before the
 *     first write; returns True when written, False when not handled (nothing written).
 *
 * bin_draw(tree, uniforms[, beta, scale[, arrays]]) / bin_update(tree, live, positions, weights, alpha, eps)
 *     A prioritized buffer's binary sum tree (replaystore.samplers.sumtree's layout: node i's
 *     children are 2i and 2i + 1, the leaves start at len(tree) // 2, the root is node 1), as the
 *     numba kernels of replaystore.samplers.sumtree_jit, in one call each with nothing around them.
 *     Every inner node holds exactly tree[2i] + tree[2i + 1] (bin_update keeps it so), which lets
 *     both read a node's eight great-grandchildren (one 64-byte line when the tree is aligned) and
 *     sum the two levels between themselves: the same values as the stored ones.
 *     bin_draw scales the uniforms by the total (kept below it) and descends level by level over
 *     the batch; returns (positions, leaf values), or None when the total is not > 0; given beta
 *     (and scale), (positions, (leaf * scale) ** -beta), scale 0 meaning 1 / the smallest leaf
 *     drawn (the weights normalised by their maximum), the power NumPy's (`**`, as Tianshou's);
 *     given arrays too (a tuple, as for gather), (positions, weights, rows): rows the gather of
 *     the drawn positions (the rows prefetched as each descent ends), or None when gather would
 *     decline. bin_update
 *     sets the leaves of the live positions to (|w| + eps) ** alpha in order (the last of
 *     duplicates wins; NumPy's power), recomputes their ancestors from their children, and
 *     returns (max, min) of |w| + eps over all weights; when one is NaN or infinite it writes
 *     nothing.
 *
 * gather(arrays, idx)
 *     (a.take(idx, axis=0) for a in arrays) in one pass over idx (int64) for C-contiguous arrays of
 *     the same length without objects, the rows of later indices prefetched; None (nothing done)
 *     for anything else or an index out of range (the caller's take then raises IndexError).
 *
 * Not thread-safe (nor are Tianshou's buffers); holds the GIL throughout.
 */
#include <math.h>
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <stdint.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#define MAX_LEAVES 64
#define PREFETCH_AHEAD 32  /* rows ahead: further than the CPU's own window reaches */
#define N_COUNTERS 9
#define DEEP_TRIPLES 2  /* a draw's deepest 6 levels read as two lines of eight (see bin_draw) */

static PyObject *str_dict, *str_done;

/* ---- advance ------------------------------------------------------------------------------- */

static int
is_vector(PyObject *a, int type_num, npy_intp min_len)
{
    return PyArray_CheckExact(a) && PyArray_NDIM((PyArrayObject *)a) == 1 &&
           PyArray_TYPE((PyArrayObject *)a) == type_num && PyArray_ISCARRAY((PyArrayObject *)a) &&
           PyArray_ISNOTSWAPPED((PyArrayObject *)a) && PyArray_DIM((PyArrayObject *)a, 0) >= min_len;
}

/* a new reference to `obj` as a 1-d array of `type_num` and length n, or NULL (no error set) */
static PyArrayObject *
as_vector(PyObject *obj, int type_num, npy_intp n)
{
    if (!PyArray_CheckExact(obj))
        return NULL;
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_NDIM(a) != 1 || PyArray_DIM(a, 0) != n)
        return NULL;
    if (is_vector(obj, type_num, n)) {
        Py_INCREF(obj);
        return a;
    }
    /* a safe cast only (int rewards to float64, ...), as the reference's astype would give the
       same values; anything else is the caller's path */
    if (!PyArray_CanCastSafely(PyArray_TYPE(a), type_num))
        return NULL;
    PyObject *out = PyArray_FROMANY(obj, type_num, 1, 1, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST);
    if (out == NULL) {
        PyErr_Clear();
        return NULL;
    }
    return (PyArrayObject *)out;
}

static PyObject *
fa_advance(PyObject *self, PyObject *args)
{
    PyObject *ids_o, *rew_o, *term_o, *trunc_o, *counters;
    if (!PyArg_ParseTuple(args, "OOOOO!:advance", &ids_o, &rew_o, &term_o, &trunc_o, &PyTuple_Type, &counters))
        return NULL;
    if (PyTuple_GET_SIZE(counters) != N_COUNTERS || !PyArray_CheckExact(ids_o))
        Py_RETURN_NONE;
    PyObject *c[N_COUNTERS];
    for (int i = 0; i < N_COUNTERS; i++)
        c[i] = PyTuple_GET_ITEM(counters, i);
    if (!PyArray_CheckExact(c[0]) || PyArray_NDIM((PyArrayObject *)c[0]) != 1)
        Py_RETURN_NONE;
    npy_intp nbuf = PyArray_DIM((PyArrayObject *)c[0], 0);
    for (int i = 0; i < N_COUNTERS; i++)
        if (!is_vector(c[i], i == 3 ? NPY_FLOAT64 : NPY_INT64, nbuf) ||
            (i > 0 && !PyArray_ISWRITEABLE((PyArrayObject *)c[i])))
            Py_RETURN_NONE;
    PyArrayObject *ids_a = (PyArrayObject *)ids_o;
    if (!is_vector(ids_o, NPY_INT64, 0))
        Py_RETURN_NONE;
    npy_intp n = PyArray_DIM(ids_a, 0);
    const int64_t *ids = (const int64_t *)PyArray_DATA(ids_a);
    const int64_t *cap = (const int64_t *)PyArray_DATA((PyArrayObject *)c[0]);
    int64_t *ins = (int64_t *)PyArray_DATA((PyArrayObject *)c[1]);
    int64_t *lengths = (int64_t *)PyArray_DATA((PyArrayObject *)c[2]);
    double *ret = (double *)PyArray_DATA((PyArrayObject *)c[3]);
    int64_t *eplen = (int64_t *)PyArray_DATA((PyArrayObject *)c[4]);
    int64_t *start = (int64_t *)PyArray_DATA((PyArrayObject *)c[5]);
    int64_t *last_local = (int64_t *)PyArray_DATA((PyArrayObject *)c[6]);
    int64_t *last_global = (int64_t *)PyArray_DATA((PyArrayObject *)c[7]);
    const int64_t *offset = (const int64_t *)PyArray_DATA((PyArrayObject *)c[8]);
    for (npy_intp j = 0; j < n; j++) {
        int64_t b = ids[j];
        if (b < 0 || b >= nbuf || cap[b] <= 0)
            Py_RETURN_NONE;
    }
    PyArrayObject *rew = as_vector(rew_o, NPY_FLOAT64, n);
    PyArrayObject *term = rew ? as_vector(term_o, NPY_BOOL, n) : NULL;
    PyArrayObject *trunc = term ? as_vector(trunc_o, NPY_BOOL, n) : NULL;
    if (trunc == NULL) {
        Py_XDECREF(rew);
        Py_XDECREF(term);
        Py_RETURN_NONE;
    }
    PyObject *result = NULL;
    for (npy_intp j = 0; j < n; j++) {  /* Tianshou's check, before anything changes */
        int64_t b = ids[j];
        int64_t len1 = lengths[b] + 1 < cap[b] ? lengths[b] + 1 : cap[b];
        if (start[b] > len1) {
            result = Py_False;
            Py_INCREF(result);
            goto done;
        }
    }
    npy_intp dims[1] = {n};
    PyObject *o_pos = PyArray_SimpleNew(1, dims, NPY_INT64);
    PyObject *o_ret = PyArray_SimpleNew(1, dims, NPY_FLOAT64);
    PyObject *o_len = PyArray_SimpleNew(1, dims, NPY_INT64);
    PyObject *o_start = PyArray_SimpleNew(1, dims, NPY_INT64);
    PyObject *o_done = PyArray_SimpleNew(1, dims, NPY_BOOL);
    if (!o_pos || !o_ret || !o_len || !o_start || !o_done) {
        Py_XDECREF(o_pos);
        Py_XDECREF(o_ret);
        Py_XDECREF(o_len);
        Py_XDECREF(o_start);
        Py_XDECREF(o_done);
        goto done;
    }
    int64_t *pos = (int64_t *)PyArray_DATA((PyArrayObject *)o_pos);
    double *out_ret = (double *)PyArray_DATA((PyArrayObject *)o_ret);
    int64_t *out_len = (int64_t *)PyArray_DATA((PyArrayObject *)o_len);
    int64_t *out_start = (int64_t *)PyArray_DATA((PyArrayObject *)o_start);
    npy_bool *out_done = (npy_bool *)PyArray_DATA((PyArrayObject *)o_done);
    const double *r = (const double *)PyArray_DATA(rew);
    const npy_bool *te = (const npy_bool *)PyArray_DATA(term);
    const npy_bool *tr = (const npy_bool *)PyArray_DATA(trunc);
    for (npy_intp j = 0; j < n; j++) {  /* rows in order: repeated ids behave as Tianshou's loop */
        int64_t b = ids[j];
        int64_t cur = ins[b];
        last_local[b] = cur;
        lengths[b] = lengths[b] + 1 < cap[b] ? lengths[b] + 1 : cap[b];
        int64_t nxt = (cur + 1) % cap[b];
        ins[b] = nxt;
        double rsum = ret[b] + r[j];
        int64_t k = eplen[b] + 1;
        int64_t p = cur + offset[b];
        last_global[b] = p;
        pos[j] = p;
        out_start[j] = start[b] + offset[b];
        npy_bool d = (te[j] != 0) | (tr[j] != 0);
        out_done[j] = d;
        if (d) {
            out_ret[j] = rsum;
            out_len[j] = k;
            ret[b] = 0.0;
            eplen[b] = 0;
            start[b] = nxt;
        }
        else {
            out_ret[j] = 0.0;
            out_len[j] = 0;
            ret[b] = rsum;
            eplen[b] = k;
        }
    }
    result = PyTuple_Pack(5, o_pos, o_ret, o_len, o_start, o_done);
    Py_DECREF(o_pos);
    Py_DECREF(o_ret);
    Py_DECREF(o_len);
    Py_DECREF(o_start);
    Py_DECREF(o_done);
done:
    Py_DECREF(rew);
    Py_DECREF(term);
    Py_DECREF(trunc);
    return result;
}

/* ---- put ----------------------------------------------------------------------------------- */

typedef struct {
    char *dst;  /* the stored array's data */
    const char *src;  /* the batch leaf's data */
    npy_intp rowbytes;
    char scratch[16];  /* a NumPy scalar's value (single rows) */
} Leaf;

typedef struct {
    Leaf leaf[MAX_LEAVES];
    int count;
    npy_intp n;  /* rows per leaf */
    int single;  /* pos is one row: the leaves are single rows */
    npy_intp lo, hi;  /* the smallest and largest position */
    PyTypeObject *batch_type;
} Plan;

/* 1: added to the plan; 0: not handled */
static int
plan_scalar(Plan *plan, PyArrayObject *m, PyObject *s_o)
{
    /* a NumPy scalar (as a single-row Batch holds for nested keys) into a 1-d stored array */
    if (!plan->single || PyArray_NDIM(m) != 1 || !PyArray_IS_C_CONTIGUOUS(m) || !PyArray_ISWRITEABLE(m) ||
        plan->hi >= PyArray_DIM(m, 0))
        return 0;
    PyArray_Descr *md = PyArray_DESCR(m);
    if (PyDataType_REFCHK(md) || PyArray_ITEMSIZE(m) > 16 || PyTypeNum_ISFLEXIBLE(md->type_num))
        return 0;
    PyArray_Descr *sd = PyArray_DescrFromScalar(s_o);
    if (sd == NULL) {
        PyErr_Clear();
        return 0;
    }
    int same = PyArray_EquivTypes(md, sd) && !PyDataType_REFCHK(sd);
    Py_DECREF(sd);
    if (!same)
        return 0;
    Leaf *leaf = &plan->leaf[plan->count++];
    PyArray_ScalarAsCtype(s_o, leaf->scratch);
    leaf->dst = PyArray_BYTES(m);
    leaf->src = leaf->scratch;
    leaf->rowbytes = PyArray_ITEMSIZE(m);
    return 1;
}

static int
plan_leaf(Plan *plan, PyObject *m_o, PyObject *s_o)
{
    if (!PyArray_CheckExact(m_o) || plan->count >= MAX_LEAVES)
        return 0;
    if (PyArray_IsScalar(s_o, Generic))
        return plan_scalar(plan, (PyArrayObject *)m_o, s_o);
    if (!PyArray_CheckExact(s_o))
        return 0;
    PyArrayObject *m = (PyArrayObject *)m_o, *s = (PyArrayObject *)s_o;
    PyArray_Descr *md = PyArray_DESCR(m);
    if (PyDataType_REFCHK(md) || !PyArray_EquivTypes(md, PyArray_DESCR(s)))
        return 0;
    if (!PyArray_IS_C_CONTIGUOUS(m) || !PyArray_ISWRITEABLE(m) || !PyArray_IS_C_CONTIGUOUS(s))
        return 0;
    int nd = PyArray_NDIM(m);
    if (nd < 1 || plan->hi >= PyArray_DIM(m, 0))
        return 0;
    int first = plan->single ? 0 : 1;  /* the batch leaf's first row dimension */
    if (PyArray_NDIM(s) != nd - 1 + first)
        return 0;
    if (!plan->single && PyArray_DIM(s, 0) != plan->n)
        return 0;
    npy_intp rowbytes = PyArray_ITEMSIZE(m);
    for (int i = 1; i < nd; i++) {
        if (PyArray_DIM(s, i - 1 + first) != PyArray_DIM(m, i))
            return 0;
        rowbytes *= PyArray_DIM(m, i);
    }
    /* the batch must not overlap the stored array (NumPy's assignment would buffer it) */
    const char *sb = PyArray_BYTES(s), *mb = PyArray_BYTES(m);
    npy_intp sbytes = PyArray_NBYTES(s), mbytes = PyArray_NBYTES(m);
    if (sb < mb + mbytes && mb < sb + sbytes)
        return 0;
    Leaf *leaf = &plan->leaf[plan->count++];
    leaf->dst = PyArray_BYTES(m);
    leaf->src = sb;
    leaf->rowbytes = rowbytes;
    return 1;
}

static PyObject *
get_dict(PyObject *obj)
{
    PyObject *d = PyObject_GetAttr(obj, str_dict);
    if (d == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (!PyDict_CheckExact(d)) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* both trees' dicts; top: the batch's keys filtered by `allowed`, "done" from `done` */
static int
plan_tree(Plan *plan, PyObject *md, PyObject *sd, int top, PyObject *done, PyObject *allowed)
{
    Py_ssize_t considered;
    if (top && (done != Py_None || allowed != Py_None)) {
        considered = 0;
        PyObject *k, *v;
        Py_ssize_t it = 0;
        while (PyDict_Next(sd, &it, &k, &v)) {
            if (done != Py_None && PyUnicode_Check(k) && PyUnicode_Compare(k, str_done) == 0)
                continue;
            if (allowed != Py_None) {
                int in = PySet_Contains(allowed, k);
                if (in < 0) {
                    PyErr_Clear();
                    return 0;
                }
                if (!in)
                    continue;
            }
            considered++;
        }
        if (done != Py_None)
            considered++;
    }
    else {
        considered = PyDict_GET_SIZE(sd);
    }
    if (considered != PyDict_GET_SIZE(md))
        return 0;
    PyObject *k, *mv;
    Py_ssize_t it = 0;
    while (PyDict_Next(md, &it, &k, &mv)) {
        PyObject *sv;
        if (top && done != Py_None && PyUnicode_Check(k) && PyUnicode_Compare(k, str_done) == 0) {
            sv = done;
        }
        else {
            if (top && allowed != Py_None) {
                int in = PySet_Contains(allowed, k);
                if (in <= 0) {
                    PyErr_Clear();
                    return 0;
                }
            }
            sv = PyDict_GetItemWithError(sd, k);
            if (sv == NULL) {
                PyErr_Clear();
                return 0;
            }
        }
        if (PyArray_CheckExact(mv)) {
            if (!plan_leaf(plan, mv, sv))
                return 0;
        }
        else if (Py_TYPE(mv) == plan->batch_type && Py_TYPE(sv) == plan->batch_type) {
            PyObject *mdd = get_dict(mv), *sdd = mdd ? get_dict(sv) : NULL;
            int ok = sdd != NULL && plan_tree(plan, mdd, sdd, 0, Py_None, Py_None);
            Py_XDECREF(mdd);
            Py_XDECREF(sdd);
            if (!ok)
                return 0;
        }
        else {
            return 0;
        }
    }
    return 1;
}

static PyObject *
fa_put(PyObject *self, PyObject *args)
{
    PyObject *meta, *batch, *pos_o, *done, *allowed;
    if (!PyArg_ParseTuple(args, "OOOOO:put", &meta, &batch, &pos_o, &done, &allowed))
        return NULL;
    if (allowed != Py_None && !PyAnySet_Check(allowed))
        Py_RETURN_FALSE;
    Plan plan;
    plan.count = 0;
    plan.batch_type = Py_TYPE(meta);
    if (Py_TYPE(batch) != plan.batch_type)
        Py_RETURN_FALSE;
    const int64_t *pos = NULL;
    int64_t one = 0;
    if (PyLong_CheckExact(pos_o)) {
        one = PyLong_AsLongLong(pos_o);
        if (one == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        plan.single = 1;
        plan.n = 1;
        pos = &one;
    }
    else if (is_vector(pos_o, NPY_INT64, 1)) {
        plan.single = 0;
        plan.n = PyArray_DIM((PyArrayObject *)pos_o, 0);
        pos = (const int64_t *)PyArray_DATA((PyArrayObject *)pos_o);
    }
    else {
        Py_RETURN_FALSE;
    }
    plan.lo = plan.hi = pos[0];
    for (npy_intp j = 1; j < plan.n; j++) {
        if (pos[j] < plan.lo)
            plan.lo = pos[j];
        if (pos[j] > plan.hi)
            plan.hi = pos[j];
    }
    if (plan.lo < 0)
        Py_RETURN_FALSE;
    PyObject *md = get_dict(meta), *sd = md ? get_dict(batch) : NULL;
    int ok = sd != NULL && plan_tree(&plan, md, sd, 1, done, allowed);
    Py_XDECREF(md);
    Py_XDECREF(sd);
    if (!ok)
        Py_RETURN_FALSE;
    /* every check passed: write */
    for (int i = 0; i < plan.count; i++) {
        Leaf *leaf = &plan.leaf[i];
        npy_intp rb = leaf->rowbytes;
        for (npy_intp j = 0; j < plan.n; j++)
            memcpy(leaf->dst + pos[j] * rb, leaf->src + j * rb, (size_t)rb);
    }
    Py_RETURN_TRUE;
}


static Py_ssize_t gather_plan(PyObject *arrays, const char **src, npy_intp *rowbytes, npy_intp *rows_out);
static PyObject *gather_alloc(PyObject *arrays, Py_ssize_t k, npy_intp n, char **dst);
static void copy_rows(const char **src, char **dst, const npy_intp *rowbytes, Py_ssize_t k, const int64_t *idx,
                      npy_intp n, npy_intp rows);

/* ---- the binary sum tree (samplers.sumtree's layout: node i's children 2i, 2i+1, leaves from len/2) */

/* a **= e with NumPy's operator (its power ufunc, or its fast paths for e = 0.5, 2, -1, ...), as
   Tianshou's `weights ** alpha`: the same values as Tianshou's and the reference's; 0 or -1 (error set) */
static int
inplace_power(PyArrayObject *a, double e)
{
    PyObject *eo = PyFloat_FromDouble(e);
    if (eo == NULL)
        return -1;
    PyObject *r = PyNumber_InPlacePower((PyObject *)a, eo, Py_None);
    Py_DECREF(eo);
    if (r == NULL)
        return -1;
    int ok = r == (PyObject *)a;
    Py_DECREF(r);
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "inplace_power: not in place");
        return -1;
    }
    return 0;
}

/* b when r (0 or 1), else a: a bitwise select, no branch (the sides of a descent are random) */
static inline double
pick(double a, double b, int64_t r)
{
    uint64_t ua, ub, m = (uint64_t)0 - (uint64_t)r;
    memcpy(&ua, &a, 8);
    memcpy(&ub, &b, 8);
    ua = (ua & ~m) | (ub & m);
    memcpy(&a, &ua, 8);
    return a;
}

static PyObject *
fa_bin_draw(PyObject *self, PyObject *args)
{
    PyObject *tree_o, *u_o, *arrays = NULL;
    double beta = NAN, scale = 0.0;
    if (!PyArg_ParseTuple(args, "OO|ddO!:bin_draw", &tree_o, &u_o, &beta, &scale, &PyTuple_Type, &arrays))
        return NULL;
    const char *src[MAX_LEAVES];
    char *dst[MAX_LEAVES];
    npy_intp rowbytes[MAX_LEAVES];
    npy_intp rows = 0;
    Py_ssize_t k = arrays ? gather_plan(arrays, src, rowbytes, &rows) : 0;
    if (!is_vector(tree_o, NPY_FLOAT64, 2) || !is_vector(u_o, NPY_FLOAT64, 0)) {
        PyErr_SetString(PyExc_TypeError, "bin_draw: contiguous float64 tree and uniforms");
        return NULL;
    }
    const double *tree = (const double *)PyArray_DATA((PyArrayObject *)tree_o);
    npy_intp base = PyArray_DIM((PyArrayObject *)tree_o, 0) / 2;
    npy_intp n = PyArray_DIM((PyArrayObject *)u_o, 0);
    const double *u = (const double *)PyArray_DATA((PyArrayObject *)u_o);
    double total = tree[1];
    if (!(total > 0.0))
        Py_RETURN_NONE;
    double below = nextafter(total, 0.0);
    npy_intp dims[1] = {n};
    PyObject *o_pos = PyArray_SimpleNew(1, dims, NPY_INT64);
    PyObject *o_leaf = o_pos ? PyArray_SimpleNew(1, dims, NPY_FLOAT64) : NULL;
    if (o_leaf == NULL) {
        Py_XDECREF(o_pos);
        return NULL;
    }
    int64_t *node = (int64_t *)PyArray_DATA((PyArrayObject *)o_pos);
    double *t = (double *)PyArray_DATA((PyArrayObject *)o_leaf);
    for (npy_intp j = 0; j < n; j++) {
        double x = u[j] * total;
        t[j] = x > below ? below : (x > 0.0 ? x : 0.0);
        node[j] = 1;
    }
    /* level by level over the batch (independent loads overlap their misses), branch-free as
       samplers.sumtree_jit: right when past the left sum and the right child has mass. The
       levels one at a time from the root, then the deepest ones (out of cache on a large
       tree) three at a time: node i's eight great-grandchildren 8i .. 8i + 7 are one cache line
       (the tree is 64-byte aligned by its owner) and the two levels between are their pairwise
       sums, computed here as the updates compute them (tree[k] = tree[2k] + tree[2k + 1], in the
       same order): the same values as the stored ones, so the same descent, one line read for
       three levels. (Three at a time from the root was measured too: more arithmetic per level,
       slower while the levels are in cache.) The last step ends at the leaves. */
    int levels = 0;
    while (((npy_intp)1 << levels) < base)
        levels++;
    int triples = levels / 3 < DEEP_TRIPLES ? levels / 3 : DEEP_TRIPLES, singles = levels - 3 * triples;
    for (int lv = 0; lv < singles; lv++) {
        int shift = lv + 1 < singles ? 1 : 3;  /* (what the next step reads) */
        for (npy_intp j = 0; j < n; j++) {
            if (j + PREFETCH_AHEAD < n)  /* (further ahead than the CPU's window reaches) */
                __builtin_prefetch(tree + (node[j + PREFETCH_AHEAD] << shift));
            int64_t left = node[j] << 1;
            double ls = tree[left];
            int64_t right = (t[j] >= ls) & (tree[left + 1] > 0.0);
            t[j] -= (double)right * ls;
            node[j] = left + right;
        }
    }
    for (int tr = 0; tr < triples; tr++) {
        int last = tr + 1 == triples;
        for (npy_intp j = 0; j < n; j++) {
            if (j + PREFETCH_AHEAD < n)
                __builtin_prefetch(tree + (node[j + PREFETCH_AHEAD] << 3));
            const double *l = tree + (node[j] << 3);
            double x = t[j];
            double s01 = l[0] + l[1], s23 = l[2] + l[3], s45 = l[4] + l[5], s67 = l[6] + l[7];
            double s03 = s01 + s23, s47 = s45 + s67;
            int64_t r1 = (x >= s03) & (s47 > 0.0);
            x -= (double)r1 * s03;
            double ls = pick(s01, s45, r1), rs = pick(s23, s67, r1);
            int64_t r2 = (x >= ls) & (rs > 0.0);
            x -= (double)r2 * ls;
            int64_t h = 4 * r1 + 2 * r2;
            int64_t r3 = (x >= l[h]) & (l[h + 1] > 0.0);
            x -= (double)r3 * l[h];
            t[j] = x;
            node[j] = (node[j] << 3) + h + r3;
            if (last) {  /* the drawn rows requested now: they arrive while the other draws
                            descend (the copy below finds them in cache) */
                npy_intp q = node[j] - base;
                if (q < rows)
                    for (Py_ssize_t a = 0; a < k; a++)
                        __builtin_prefetch(src[a] + q * rowbytes[a]);
            }
        }
    }
    double lo = INFINITY;
    for (npy_intp j = 0; j < n; j++) {
        node[j] -= base;
        t[j] = tree[base + node[j]];
        lo = t[j] < lo ? t[j] : lo;
    }
    if (beta == beta) {  /* importance weights instead of leaves: (leaf * scale) ** -beta, where a
                            scale of 0 means 1 / the smallest leaf drawn (normalised by the maximum) */
        double s = scale > 0.0 ? scale : 1.0 / lo;
        for (npy_intp j = 0; j < n; j++)
            t[j] *= s;
        if (inplace_power((PyArrayObject *)o_leaf, -beta) < 0) {
            Py_DECREF(o_pos);
            Py_DECREF(o_leaf);
            return NULL;
        }
    }
    PyObject *result;
    if (arrays == NULL) {
        result = PyTuple_Pack(2, o_pos, o_leaf);
    }
    else {  /* and the drawn rows of every array (None: arrays not handled, or a row missing) */
        int ok = k > 0;
        for (npy_intp j = 0; ok && j < n; j++)
            ok = node[j] < rows;
        PyObject *got = ok ? gather_alloc(arrays, k, n, dst) : Py_None;
        if (got == NULL) {
            Py_DECREF(o_pos);
            Py_DECREF(o_leaf);
            return NULL;
        }
        if (ok)
            copy_rows(src, dst, rowbytes, k, node, n, rows);
        else
            Py_INCREF(got);
        result = PyTuple_Pack(3, o_pos, o_leaf, got);
        Py_DECREF(got);
    }
    Py_DECREF(o_pos);
    Py_DECREF(o_leaf);
    return result;
}

static PyObject *
fa_bin_update(PyObject *self, PyObject *args)
{
    PyObject *tree_o, *live_o, *pos_o, *w_o;
    double alpha, eps;
    if (!PyArg_ParseTuple(args, "OOOOdd:bin_update", &tree_o, &live_o, &pos_o, &w_o, &alpha, &eps))
        return NULL;
    if (!is_vector(tree_o, NPY_FLOAT64, 2) || !PyArray_ISWRITEABLE((PyArrayObject *)tree_o) ||
        !is_vector(pos_o, NPY_INT64, 0) || !is_vector(live_o, NPY_BOOL, 0)) {
        PyErr_SetString(PyExc_TypeError, "bin_update: a writeable float64 tree, int64 positions, bool live");
        return NULL;
    }
    double *tree = (double *)PyArray_DATA((PyArrayObject *)tree_o);
    npy_intp base = PyArray_DIM((PyArrayObject *)tree_o, 0) / 2;
    npy_intp n = PyArray_DIM((PyArrayObject *)pos_o, 0);
    npy_intp nlive = PyArray_DIM((PyArrayObject *)live_o, 0);
    const int64_t *pos = (const int64_t *)PyArray_DATA((PyArrayObject *)pos_o);
    const npy_bool *live = (const npy_bool *)PyArray_DATA((PyArrayObject *)live_o);
    for (npy_intp j = 0; j < n; j++)
        if (pos[j] < 0 || pos[j] >= nlive || pos[j] >= base) {
            PyErr_SetString(PyExc_IndexError, "bin_update: a position out of range");
            return NULL;
        }
    PyArrayObject *w = (PyArrayObject *)PyArray_FROMANY(w_o, NPY_FLOAT64, 1, 1, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST);
    if (w == NULL)
        return NULL;
    if (PyArray_DIM(w, 0) != n) {
        Py_DECREF(w);
        PyErr_SetString(PyExc_ValueError, "bin_update: as many weights as positions");
        return NULL;
    }
    const double *wd = (const double *)PyArray_DATA(w);
    npy_intp dims[1] = {n};
    PyArrayObject *pw = (PyArrayObject *)PyArray_SimpleNew(1, dims, NPY_FLOAT64);
    if (pw == NULL) {
        Py_DECREF(w);
        return NULL;
    }
    double *pd = (double *)PyArray_DATA(pw);
    double hi = -INFINITY, lo = INFINITY;
    int nan = 0;
    for (npy_intp j = 0; j < n; j++) {
        double p = fabs(wd[j]) + eps;
        pd[j] = p;
        nan |= p != p;
        hi = p > hi ? p : hi;
        lo = p < lo ? p : lo;
    }
    Py_DECREF(w);
    if (nan)
        hi = lo = NAN;
    if (n == 0 || !(hi < INFINITY)) {  /* (NaN too): nothing written */
        Py_DECREF(pw);
        return Py_BuildValue("(dd)", hi, lo);
    }
    if (alpha != 1.0 && inplace_power(pw, alpha) < 0) {  /* NumPy's power, as Tianshou's `w ** alpha` */
        Py_DECREF(pw);
        return NULL;
    }
    int64_t *idx = (int64_t *)PyMem_Malloc(sizeof(int64_t) * n);
    if (idx == NULL) {
        Py_DECREF(pw);
        return PyErr_NoMemory();
    }
    npy_intp m = 0;
    for (npy_intp j = 0; j < n; j++) {  /* in order: the last of duplicates wins */
        if (j + PREFETCH_AHEAD < n) {
            __builtin_prefetch(live + pos[j + PREFETCH_AHEAD]);
            __builtin_prefetch(tree + base + pos[j + PREFETCH_AHEAD], 1);
        }
        if (!live[pos[j]])
            continue;
        tree[base + pos[j]] = pd[j];
        idx[m++] = base + pos[j];
    }
    Py_DECREF(pw);
    /* every parent recomputed from its children (tree[i] = tree[2i] + tree[2i + 1]): */
    npy_intp b = base;
    if (base >= 8 && (base >> 3) > m) {
        /* the three levels above the leaves from each updated leaf's line of eight, summed as
           the level passes below sum them (so the same values), the eight leaves read once */
        for (npy_intp j = 0; j < m; j++) {
            if (j + PREFETCH_AHEAD < m) {
                int64_t g2 = idx[j + PREFETCH_AHEAD] >> 3;
                __builtin_prefetch(tree + 4 * g2, 1);
                __builtin_prefetch(tree + 2 * g2, 1);
                __builtin_prefetch(tree + g2, 1);
            }
            int64_t g = idx[j] >> 3;
            const double *l = tree + 8 * g;
            double s01 = l[0] + l[1], s23 = l[2] + l[3], s45 = l[4] + l[5], s67 = l[6] + l[7];
            double *q = tree + 4 * g;
            q[0] = s01;
            q[1] = s23;
            q[2] = s45;
            q[3] = s67;
            tree[2 * g] = s01 + s23;
            tree[2 * g + 1] = s45 + s67;
            tree[g] = tree[2 * g] + tree[2 * g + 1];
            idx[j] = g;
        }
        b = base >> 3;
    }
    /* then level by level over the updated ones while a level has more nodes than they are,
       then whole levels (in order: no repeated ancestors) */
    for (; b > 1 && (b >> 1) > m; b >>= 1)
        for (npy_intp j = 0; j < m; j++) {
            if (j + PREFETCH_AHEAD < m)
                __builtin_prefetch(tree + (idx[j + PREFETCH_AHEAD] >> 1), 1);
            int64_t i = idx[j] >> 1;
            idx[j] = i;
            tree[i] = tree[2 * i] + tree[2 * i + 1];
        }
    for (; b > 1; b >>= 1)
        for (npy_intp i = b >> 1; i < b; i++)
            tree[i] = tree[2 * i] + tree[2 * i + 1];
    PyMem_Free(idx);
    return Py_BuildValue("(dd)", hi, lo);
}

/* ---- gather ---------------------------------------------------------------------------------- */

/* rows idx[0..n) of one array (rows of `rb` bytes; negative indices count from the end) into dst,
   the row of a later index prefetched; a constant row size lets the compiler copy it inline */
#define COPY_ROWS(RB)                                                                       \
    for (npy_intp j = 0; j < n; j++) {                                                      \
        if (j + PREFETCH_AHEAD < n) {                                                       \
            int64_t q = idx[j + PREFETCH_AHEAD];                                            \
            __builtin_prefetch(s + (q + (q < 0 ? rows : 0)) * (RB));                        \
        }                                                                                   \
        int64_t p = idx[j];                                                                 \
        memcpy(d + j * (RB), s + (p + (p < 0 ? rows : 0)) * (RB), (size_t)(RB));            \
    }

static void
copy_rows(const char **src, char **dst, const npy_intp *rowbytes, Py_ssize_t k, const int64_t *idx, npy_intp n,
          npy_intp rows)
{
    for (Py_ssize_t a = 0; a < k; a++) {  /* array by array: one constant row size per loop */
        const char *s = src[a];
        char *d = dst[a];
        npy_intp rb = rowbytes[a];
        switch (rb) {
        case 1: COPY_ROWS(1) break;
        case 2: COPY_ROWS(2) break;
        case 4: COPY_ROWS(4) break;
        case 8: COPY_ROWS(8) break;
        case 16: COPY_ROWS(16) break;
        case 32: COPY_ROWS(32) break;
        default: COPY_ROWS(rb) break;
        }
    }
}

/* the arrays' layout for copy_rows: the number of arrays (0: not handled, nothing set), their
   data, row sizes and common length */
static Py_ssize_t
gather_plan(PyObject *arrays, const char **src, npy_intp *rowbytes, npy_intp *rows_out)
{
    Py_ssize_t k = PyTuple_GET_SIZE(arrays);
    if (k == 0 || k > MAX_LEAVES)
        return 0;
    npy_intp rows = -1;
    for (Py_ssize_t a = 0; a < k; a++) {
        PyObject *o = PyTuple_GET_ITEM(arrays, a);
        if (!PyArray_CheckExact(o))
            return 0;
        PyArrayObject *m = (PyArrayObject *)o;
        if (PyArray_NDIM(m) < 1 || !PyArray_IS_C_CONTIGUOUS(m) || PyDataType_REFCHK(PyArray_DESCR(m)))
            return 0;
        if (rows < 0)
            rows = PyArray_DIM(m, 0);
        if (PyArray_DIM(m, 0) != rows)
            return 0;
        rowbytes[a] = PyArray_ITEMSIZE(m);
        for (int i = 1; i < PyArray_NDIM(m); i++)
            rowbytes[a] *= PyArray_DIM(m, i);
        src[a] = PyArray_BYTES(m);
    }
    *rows_out = rows;
    return k;
}

/* a tuple of new arrays of n rows shaped as `arrays`' rows, their data in dst; NULL on error */
static PyObject *
gather_alloc(PyObject *arrays, Py_ssize_t k, npy_intp n, char **dst)
{
    PyObject *out = PyTuple_New(k);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t a = 0; a < k; a++) {
        PyArrayObject *m = (PyArrayObject *)PyTuple_GET_ITEM(arrays, a);
        npy_intp dims[NPY_MAXDIMS];
        dims[0] = n;
        for (int i = 1; i < PyArray_NDIM(m); i++)
            dims[i] = PyArray_DIM(m, i);
        PyArray_Descr *descr = PyArray_DESCR(m);
        Py_INCREF(descr);
        PyObject *r = PyArray_NewFromDescr(&PyArray_Type, descr, PyArray_NDIM(m), dims, NULL, NULL, 0, NULL);
        if (r == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, a, r);
        dst[a] = PyArray_BYTES((PyArrayObject *)r);
    }
    return out;
}

static PyObject *
fa_gather(PyObject *self, PyObject *args)
{
    PyObject *arrays, *idx_o;
    if (!PyArg_ParseTuple(args, "O!O:gather", &PyTuple_Type, &arrays, &idx_o))
        return NULL;
    if (!is_vector(idx_o, NPY_INT64, 0))
        Py_RETURN_NONE;
    const char *src[MAX_LEAVES];
    char *dst[MAX_LEAVES];
    npy_intp rowbytes[MAX_LEAVES];
    npy_intp rows;
    Py_ssize_t k = gather_plan(arrays, src, rowbytes, &rows);
    if (k == 0)
        Py_RETURN_NONE;
    npy_intp n = PyArray_DIM((PyArrayObject *)idx_o, 0);
    const int64_t *idx = (const int64_t *)PyArray_DATA((PyArrayObject *)idx_o);
    for (npy_intp j = 0; j < n; j++)  /* out of range (negative ones count from the end, as take) */
        if (idx[j] >= rows || idx[j] < -rows)
            Py_RETURN_NONE;
    PyObject *out = gather_alloc(arrays, k, n, dst);
    if (out != NULL)
        copy_rows(src, dst, rowbytes, k, idx, n, rows);
    return out;
}

static PyMethodDef methods[] = {
    {"advance", fa_advance, METH_VARARGS, "A manager's counters advanced for one add (see the module doc)."},
    {"put", fa_put, METH_VARARGS, "meta[pos] = batch for trees of the same keys and dtypes (see the module doc)."},
    {"gather", fa_gather, METH_VARARGS, "Rows idx of every array (see the module doc)."},
    {"bin_draw", fa_bin_draw, METH_VARARGS, "Draw positions from a binary sum tree (see the module doc)."},
    {"bin_update", fa_bin_update, METH_VARARGS, "Set priorities in a binary sum tree (see the module doc)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "replaystore.compat.tianshou._native",
    "A Tianshou buffer's add in C (optional; the Python reference path gives the same results).", -1, methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    import_array();
    str_dict = PyUnicode_InternFromString("__dict__");
    str_done = PyUnicode_InternFromString("done");
    if (str_dict == NULL || str_done == NULL)
        return NULL;
    return PyModule_Create(&module);
}
