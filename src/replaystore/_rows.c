/* replaystore._rows: the per-call hot path of small inserts and samples, compiled.
 *
 * Optional: replaystore.rows holds the pure-Python version of every function here, with the same
 * contract, and is used when this module is not built. Both take NumPy arrays through the buffer
 * protocol only (no NumPy headers), check everything before they write anything, and answer
 * "not handled" (False / None) instead of raising, so the caller can fall back to its general
 * path, which raises the precise error.
 *
 * Thread-safety: none of its own; callers hold the table's lock.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <stdint.h>

#define MAX_FIELDS 64
#define PREFETCH_AHEAD 8  /* rows ahead to prefetch in gathers: enough to overlap ~8 misses */

/* A table's metadata rows (replaystore.rows): mw int64 words per slot (META_W, or META_W_NARROW
 * for a table that keeps no per-item priority): times_sampled and version as two int32 (int32
 * columns 0 and 1 of the row), then (wide rows only) the priority's float64 bits. The key is not
 * in the row (in ring mode it is the slot's ring arithmetic, else the table's key column).
 * A sample row (count_samples' and gather_rows' out) is 4 int64: key, times sampled, version,
 * priority bits (UNKEPT_BITS, 1.0, for a narrow row); these functions leave its key (column 0)
 * to fill_keys. */
#define META_W 2
#define META_W_NARROW 1
#define META_OK(w) ((w) == META_W || (w) == META_W_NARROW)
#define META_TS32 0
#define META_VER32 1
#define META_PRIO 1
#define UNKEPT_BITS INT64_C(0x3FF0000000000000) /* replaystore.rows.UNKEPT_PRIORITY (1.0) */
/* both cache lines of a row (a row never straddles two lines now: one prefetch when mw is 1) */
#define PREFETCH_META(p, mw) do { __builtin_prefetch((p), 1); __builtin_prefetch((p) + (mw) - 1, 1); } while (0)

static inline void
meta_set(int64_t *row, Py_ssize_t mw, int32_t version, int64_t pbits)
{
    int32_t pair[2] = {0, version};  /* (times sampled, version): word 0, one store */
    memcpy(row, pair, 8);
    if (mw > META_PRIO)
        row[META_PRIO] = pbits;
}

static inline void
meta_count(int64_t *row)
{
    int32_t *ts = (int32_t *)row + META_TS32;
    if (*ts != INT32_MAX)  /* (saturates) */
        *ts += 1;
}

static inline void
meta_widen(int64_t *dst, const int64_t *row, Py_ssize_t mw)
{
    const int32_t *r32 = (const int32_t *)row;
    dst[1] = r32[META_TS32];
    dst[2] = r32[META_VER32];
    dst[3] = mw > META_PRIO ? row[META_PRIO] : UNKEPT_BITS;
}

/* The loops over metadata rows, each inlined for a constant width (META_DISPATCH): a runtime row
 * width in these loops measured ~100 ns slower on copy_rows of 8 rows than the constant one. */
#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* copy_rows_impl starts on a cache line: the placement of the same code moved copy_rows of 8 rows
 * by ~20% (525 vs 650 ns on the AMD EPYC of the issue 36 measurements, docs/benchmarks.md); at
 * this placement it measured as before the narrow row. A layout effect, not a fix for all of them. */
#define HOT_ALIGN __attribute__((aligned(64)))
#define META_DISPATCH(mw, call_with_w) do { if ((mw) == META_W) { const Py_ssize_t W_ = META_W; call_with_w; } \
                                             else { const Py_ssize_t W_ = META_W_NARROW; call_with_w; } } while (0)

ALWAYS_INLINE void
meta_fill(int64_t *rows, Py_ssize_t mw, Py_ssize_t n, int32_t version, int64_t pbits)
{
    for (Py_ssize_t i = 0; i < n; i++)
        meta_set(rows + mw * i, mw, version, pbits);
}

ALWAYS_INLINE void
meta_count_widen(int64_t *rows, Py_ssize_t mw, const int64_t *sl, Py_ssize_t n, int64_t *dst)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n)
            PREFETCH_META(rows + mw * sl[i + PREFETCH_AHEAD], mw);
        meta_count(rows + mw * sl[i]);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        meta_widen(dst + 4 * i, rows + mw * sl[i], mw);
}

ALWAYS_INLINE long long
meta_touch(const double *uu, Py_ssize_t n, const int64_t *rows, Py_ssize_t cap, Py_ssize_t mw)
{
    long long total = 0;
    double scale = (double)cap;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n) {
            Py_ssize_t a = (Py_ssize_t)(uu[i + PREFETCH_AHEAD] * scale);
            if (a >= 0 && a < cap)
                __builtin_prefetch(rows + mw * a);
        }
        Py_ssize_t k = (Py_ssize_t)(uu[i] * scale);
        if (k >= 0 && k < cap)
            total += rows[mw * k];
    }
    return total;
}

/* Strip a native byte-order prefix ('@', '=', '<' on little-endian) from a buffer format. */
static const char *
bare_format(const char *fmt)
{
    if (fmt == NULL)
        return "B";
    if (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == '<')
        return fmt + 1;
    return fmt;
}

static int
is_c_contiguous(const Py_buffer *b)
{
    return PyBuffer_IsContiguous(b, 'C');
}

/* Write the Python scalar `v` into `dst` (one element of format `fmt`); 0: done, -1: not handled.
 * Accepts what NumPy casts "same_kind" from the scalar's default dtype: bool into any number,
 * int into ints and floats (in range), float into floats. */
static int
write_py_scalar(PyObject *v, const char *fmt, Py_ssize_t itemsize, char *dst)
{
    char f = fmt[0];
    if (fmt[1] != '\0')
        return -1;
    if (PyBool_Check(v)) {
        long b = (v == Py_True);
        switch (f) {
        case '?': *(unsigned char *)dst = (unsigned char)b; return 0;
        case 'f': *(float *)dst = (float)b; return 0;
        case 'd': *(double *)dst = (double)b; return 0;
        case 'b': case 'B': *(unsigned char *)dst = (unsigned char)b; return 0;
        case 'h': case 'H': *(uint16_t *)dst = (uint16_t)b; return 0;
        case 'i': case 'I': *(uint32_t *)dst = (uint32_t)b; return 0;
        case 'l': case 'L': case 'q': case 'Q':
            if (itemsize == 8) { *(uint64_t *)dst = (uint64_t)b; return 0; }
            if (itemsize == 4) { *(uint32_t *)dst = (uint32_t)b; return 0; }
            return -1;
        default: return -1;
        }
    }
    if (PyFloat_CheckExact(v)) {
        double x = PyFloat_AS_DOUBLE(v);
        if (f == 'd') { *(double *)dst = x; return 0; }
        if (f == 'f') {
            /* NumPy refuses (OverflowError) a finite value beyond float32's range: let it say so */
            if (x == x && (x > 3.4028234663852886e38 || x < -3.4028234663852886e38)
                && x != Py_HUGE_VAL && x != -Py_HUGE_VAL)
                return -1;
            *(float *)dst = (float)x;
            return 0;
        }
        return -1;
    }
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return -1;
        }
        switch (f) {
        case 'd': *(double *)dst = (double)x; return 0;
        case 'f': *(float *)dst = (float)x; return 0;
        case 'b': if (x < -128 || x > 127) return -1; *(int8_t *)dst = (int8_t)x; return 0;
        case 'B': if (x < 0 || x > 255) return -1; *(uint8_t *)dst = (uint8_t)x; return 0;
        case 'h': if (x < -32768 || x > 32767) return -1; *(int16_t *)dst = (int16_t)x; return 0;
        case 'H': if (x < 0 || x > 65535) return -1; *(uint16_t *)dst = (uint16_t)x; return 0;
        case 'i': if (x < INT32_MIN || x > INT32_MAX) return -1; *(int32_t *)dst = (int32_t)x; return 0;
        case 'I': if (x < 0 || x > (long long)UINT32_MAX) return -1; *(uint32_t *)dst = (uint32_t)x; return 0;
        case 'l': case 'q':
            if (itemsize == 8) { *(int64_t *)dst = (int64_t)x; return 0; }
            if (itemsize == 4 && x >= INT32_MIN && x <= INT32_MAX) { *(int32_t *)dst = (int32_t)x; return 0; }
            return -1;
        case 'L': case 'Q':
            if (x < 0) return -1;
            if (itemsize == 8) { *(uint64_t *)dst = (uint64_t)x; return 0; }
            return -1;
        default: return -1;
        }
    }
    return -1;
}

typedef struct {
    Py_buffer dst;
    Py_buffer src;
    int has_src;  /* src is a buffer (else a Python scalar written element-wise) */
    PyObject *scalar;
} FieldPlan;

static void
release_plans(FieldPlan *plans, Py_ssize_t k)
{
    for (Py_ssize_t i = 0; i < k; i++) {
        PyBuffer_Release(&plans[i].dst);
        if (plans[i].has_src)
            PyBuffer_Release(&plans[i].src);
    }
}

/* copy_rows(columns, sources, start, n, batched[, hi_word, written_hi]) -> bool
 *
 * columns: tuple of C-contiguous writable arrays, each (capacity, *shape_i).
 * sources: tuple of the same length: arrays of exactly the column's dtype and shape (n, *shape_i)
 *   when batched, shape_i when not (then n must be 1); a Python scalar for a 0-d field of a single
 *   row. Rows [start, start + n) of each column receive them. Returns False, having written
 *   nothing, when any source does not match exactly (or is not C-contiguous) or the rows are out
 *   of range; True when every field was copied. With hi_word (a writable int64 array, its first
 * element a shared table's written_hi word) that word is raised to written_hi (one past the newest
 * key whose row this write begins; a larger value stays) before any payload byte is written, ordered by a release fence (a
 * sample copying outside a shared table's lock then sees that its key's slot may be torn:
 * replaystore.shared.reads); nothing is written when the copy is refused.
 */
ALWAYS_INLINE int
copy_rows_body(PyObject *columns, PyObject *sources, Py_ssize_t start, Py_ssize_t n, int batched,
               int64_t *hi_word, long long written_hi)
{
    if (!PyTuple_Check(columns) || !PyTuple_Check(sources))
        return 0;
    Py_ssize_t k = PyTuple_GET_SIZE(columns);
    if (k != PyTuple_GET_SIZE(sources) || k > MAX_FIELDS || n < 0 || (!batched && n != 1))
        return 0;
    FieldPlan plans[MAX_FIELDS];
    Py_ssize_t done = 0;
    int ok = 1;
    for (Py_ssize_t i = 0; i < k && ok; i++) {
        FieldPlan *p = &plans[i];
        p->has_src = 0;
        p->scalar = NULL;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(columns, i), &p->dst,
                               PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
            PyErr_Clear();
            ok = 0;
            break;
        }
        done = i + 1;
        Py_buffer *d = &p->dst;
        if (!is_c_contiguous(d) || d->ndim < 1 || start < 0 || start + n > d->shape[0]) {
            ok = 0;
            break;
        }
        PyObject *s = PyTuple_GET_ITEM(sources, i);
        if (!batched && d->ndim == 1 && (PyFloat_CheckExact(s) || PyLong_CheckExact(s) || PyBool_Check(s))) {
            p->scalar = s;
            continue;
        }
        if (PyObject_GetBuffer(s, &p->src, PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
            PyErr_Clear();
            ok = 0;
            break;
        }
        p->has_src = 1;
        Py_buffer *b = &p->src;
        int lead = batched ? 1 : 0;
        if (b->itemsize != d->itemsize || strcmp(bare_format(b->format), bare_format(d->format)) != 0
            || b->ndim != d->ndim - 1 + lead || !is_c_contiguous(b)) {
            ok = 0;
            break;
        }
        if (batched && b->shape[0] != n) {
            ok = 0;
            break;
        }
        for (int j = 1; j < d->ndim; j++) {
            if (b->shape[j - 1 + lead] != d->shape[j]) {
                ok = 0;
                break;
            }
        }
    }
    if (ok) {
        /* every field checked: now write (the scalar writes can still refuse: check them first) */
        char scratch[16];
        for (Py_ssize_t i = 0; i < k && ok; i++) {
            FieldPlan *p = &plans[i];
            if (p->scalar != NULL && (p->dst.itemsize > 16
                    || write_py_scalar(p->scalar, bare_format(p->dst.format), p->dst.itemsize, scratch) < 0))
                ok = 0;
        }
        if (ok && hi_word != NULL && *hi_word < written_hi) { /* written_hi first, ordered before the payloads */
            __atomic_store_n(hi_word, (int64_t)written_hi, __ATOMIC_RELEASE);
            __atomic_thread_fence(__ATOMIC_RELEASE);
        }
        for (Py_ssize_t i = 0; i < k && ok; i++) {
            FieldPlan *p = &plans[i];
            Py_ssize_t row = p->dst.shape[0] ? p->dst.len / p->dst.shape[0] : 0;
            char *to = (char *)p->dst.buf + start * row;
            if (p->scalar != NULL)
                write_py_scalar(p->scalar, bare_format(p->dst.format), p->dst.itemsize, to);
            else
                memmove(to, p->src.buf, (size_t)(n * row));  /* the source may alias a column */
        }
    }
    release_plans(plans, done);
    return ok;
}

/* hi_word NULL: no written_hi store */
static HOT_ALIGN int
copy_rows_impl(PyObject *columns, PyObject *sources, Py_ssize_t start, Py_ssize_t n, int batched,
               int64_t *hi_word, long long written_hi)
{
    return copy_rows_body(columns, sources, start, n, batched, hi_word, written_hi);
}

static PyObject *
copy_rows(PyObject *self, PyObject *args)
{
    PyObject *columns, *sources, *hi = NULL;
    Py_ssize_t start, n;
    int batched;
    long long written_hi = 0;
    if (!PyArg_ParseTuple(args, "O!O!nnp|OL", &PyTuple_Type, &columns, &PyTuple_Type, &sources, &start, &n,
                          &batched, &hi, &written_hi))
        return NULL;
    if (hi == NULL || hi == Py_None)
        return PyBool_FromLong(copy_rows_impl(columns, sources, start, n, batched, NULL, 0));
    Py_buffer b;
    if (PyObject_GetBuffer(hi, &b, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0)
        return NULL;
    if (b.ndim != 1 || b.shape[0] < 1 || b.itemsize != 8 || !is_c_contiguous(&b)) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "copy_rows: hi_word must be a writable C-contiguous int64 vector");
        return NULL;
    }
    int ok = copy_rows_impl(columns, sources, start, n, batched, (int64_t *)b.buf, written_hi);
    PyBuffer_Release(&b);
    return PyBool_FromLong(ok);
}

/* fill_meta(meta, start, n, version, priority) -> None
 *
 * meta: a C-contiguous writable int64 array (capacity, META_W) of metadata rows. Rows
 * [start, start + n) become times sampled 0, version, priority. Raises
 * ValueError for a bad array, range or a version outside int32 (a caller bug, not user input).
 */
static PyObject *
fill_meta(PyObject *self, PyObject *args)
{
    PyObject *meta;
    Py_ssize_t start, n;
    long long version;
    double priority;
    if (!PyArg_ParseTuple(args, "OnnLd", &meta, &start, &n, &version, &priority))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(meta, &b, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0)
        return NULL;
    if (b.ndim != 2 || !META_OK(b.shape[1]) || b.itemsize != 8 || !is_c_contiguous(&b) || start < 0
        || n < 0 || start + n > b.shape[0] || version < INT32_MIN || version > INT32_MAX) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "fill_meta: meta must be a C-contiguous (capacity, 2) or (capacity, 1) int64 array, "
                                          "the rows in range and the version an int32");
        return NULL;
    }
    Py_ssize_t mw = b.shape[1];
    int64_t *rows = (int64_t *)b.buf + mw * start;
    int64_t pbits;
    memcpy(&pbits, &priority, 8);
    META_DISPATCH(mw, meta_fill(rows, W_, n, (int32_t)version, pbits));
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

/* ring_draw(uniforms, size, start, capacity, out) -> None
 *
 * The slots of a ring's uniform draw: out[i] = (start + floor(uniforms[i] * size)) mod capacity,
 * for uniforms in [0, 1), 0 < size <= capacity and 0 <= start < capacity (the live run starts at
 * slot start and wraps). uniforms: C-contiguous float64; out: C-contiguous int64 as long. Raises
 * ValueError for arrays or numbers that do not fit (checked before anything is written). One
 * pass and no temporaries (NumPy takes three: the product, the cast, the wrap).
 */
static PyObject *
ring_draw(PyObject *self, PyObject *args)
{
    PyObject *uniforms, *out;
    Py_ssize_t size, start, capacity;
    if (!PyArg_ParseTuple(args, "OnnnO", &uniforms, &size, &start, &capacity, &out))
        return NULL;
    Py_buffer u, o;
    if (PyObject_GetBuffer(uniforms, &u, PyBUF_FORMAT | PyBUF_STRIDES) < 0)
        return NULL;
    if (PyObject_GetBuffer(out, &o, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
        PyBuffer_Release(&u);
        return NULL;
    }
    const char *err = NULL;
    Py_ssize_t n = u.ndim == 1 ? u.shape[0] : -1;
    if (n < 0 || u.itemsize != 8 || !is_c_contiguous(&u) || bare_format(u.format)[0] != 'd')
        err = "ring_draw: uniforms must be a C-contiguous float64 vector";
    else if (o.ndim != 1 || o.shape[0] != n || o.itemsize != 8 || !is_c_contiguous(&o)
             || strchr("lq", bare_format(o.format)[0]) == NULL)
        err = "ring_draw: out must be a C-contiguous int64 vector as long as uniforms";
    else if (capacity <= 0 || size <= 0 || size > capacity || start < 0 || start >= capacity)
        err = "ring_draw: needs 0 < size <= capacity and 0 <= start < capacity";
    if (err == NULL) {
        const double *uu = (const double *)u.buf;
        int64_t *dst = (int64_t *)o.buf;
        double scale = (double)size;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t k = (int64_t)(uu[i] * scale);
            if (k >= size) /* (u < 1 always; clamps a caller's 1.0 and NaN-free rounding) */
                k = size - 1;
            if (k < 0)
                k = 0;
            k += start;
            dst[i] = k >= capacity ? k - capacity : k;
        }
    }
    PyBuffer_Release(&u);
    PyBuffer_Release(&o);
    if (err != NULL) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ring_lookup(keys, lo, hi, base, capacity, out) -> None
 *
 * The slots of keys in a ring whose live keys are [lo, hi) and whose key `base` sits in slot 0:
 * out[i] = (keys[i] - base) mod capacity for live keys, -1 for the others. keys and out are
 * C-contiguous int64 vectors of one length; ValueError otherwise (nothing written).
 */
static PyObject *
ring_lookup(PyObject *self, PyObject *args)
{
    PyObject *keys, *out;
    long long lo, hi, base;
    Py_ssize_t capacity;
    if (!PyArg_ParseTuple(args, "OLLLnO", &keys, &lo, &hi, &base, &capacity, &out))
        return NULL;
    Py_buffer k, o;
    if (PyObject_GetBuffer(keys, &k, PyBUF_FORMAT | PyBUF_STRIDES) < 0)
        return NULL;
    if (PyObject_GetBuffer(out, &o, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
        PyBuffer_Release(&k);
        return NULL;
    }
    const char *err = NULL;
    Py_ssize_t n = k.ndim == 1 ? k.shape[0] : -1;
    if (n < 0 || k.itemsize != 8 || !is_c_contiguous(&k) || strchr("lq", bare_format(k.format)[0]) == NULL
        || o.ndim != 1 || o.shape[0] != n || o.itemsize != 8 || !is_c_contiguous(&o)
        || strchr("lq", bare_format(o.format)[0]) == NULL)
        err = "ring_lookup: keys and out must be C-contiguous int64 vectors of one length";
    else if (capacity <= 0 || hi < lo || hi - lo > capacity)
        err = "ring_lookup: needs capacity > 0 and lo <= hi <= lo + capacity";
    if (err == NULL) {
        const int64_t *kk = (const int64_t *)k.buf;
        int64_t *dst = (int64_t *)o.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t key = kk[i];
            if (key >= lo && key < hi) {
                int64_t s = (key - base) % capacity;
                dst[i] = s < 0 ? s + capacity : s;
            } else {
                dst[i] = -1;
            }
        }
    }
    PyBuffer_Release(&k);
    PyBuffer_Release(&o);
    if (err != NULL) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* last_occurrences(slots, scratch, mask) -> bool
 *
 * mask[i] = whether position i is the last one of its slot in slots; returns True when every
 * slot is distinct (mask all True). scratch: a C-contiguous int64 vector of the table's capacity,
 * all -1, which this leaves all -1 again. slots: C-contiguous int64 within scratch; mask: a
 * C-contiguous bool vector as long. ValueError otherwise (nothing written). O(len(slots)).
 */
static PyObject *
last_occurrences(PyObject *self, PyObject *args)
{
    PyObject *slots, *scratch, *mask;
    if (!PyArg_ParseTuple(args, "OOO", &slots, &scratch, &mask))
        return NULL;
    Py_buffer s, c, m;
    if (PyObject_GetBuffer(slots, &s, PyBUF_FORMAT | PyBUF_STRIDES) < 0)
        return NULL;
    if (PyObject_GetBuffer(scratch, &c, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
        PyBuffer_Release(&s);
        return NULL;
    }
    if (PyObject_GetBuffer(mask, &m, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&c);
        return NULL;
    }
    const char *err = NULL;
    Py_ssize_t n = s.ndim == 1 ? s.shape[0] : -1;
    Py_ssize_t cap = c.ndim == 1 ? c.shape[0] : -1;
    if (n < 0 || s.itemsize != 8 || !is_c_contiguous(&s) || strchr("lq", bare_format(s.format)[0]) == NULL)
        err = "last_occurrences: slots must be a C-contiguous int64 vector";
    else if (cap < 0 || c.itemsize != 8 || !is_c_contiguous(&c) || strchr("lq", bare_format(c.format)[0]) == NULL)
        err = "last_occurrences: scratch must be a C-contiguous int64 vector";
    else if (m.ndim != 1 || m.shape[0] != n || m.itemsize != 1 || !is_c_contiguous(&m)
             || bare_format(m.format)[0] != '?')
        err = "last_occurrences: mask must be a C-contiguous bool vector as long as slots";
    const int64_t *sl = (const int64_t *)s.buf;
    for (Py_ssize_t i = 0; i < n && err == NULL; i++)
        if (sl[i] < 0 || sl[i] >= cap)
            err = "last_occurrences: a slot is out of range";
    int distinct = 1;
    if (err == NULL) {
        int64_t *last = (int64_t *)c.buf;
        char *mk = (char *)m.buf;
        for (Py_ssize_t i = 0; i < n; i++)
            last[sl[i]] = i;
        for (Py_ssize_t i = 0; i < n; i++) {
            mk[i] = last[sl[i]] == i;
            distinct &= mk[i];
        }
        for (Py_ssize_t i = 0; i < n; i++)
            last[sl[i]] = -1;
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&c);
    PyBuffer_Release(&m);
    if (err != NULL) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    return PyBool_FromLong(distinct);
}

/* touch_draw(uniforms, meta) -> int
 *
 * Reads the metadata rows a full ring's uniform draw of `uniforms` will take (slot
 * floor(u * capacity): ring_draw of a full ring), prefetching ahead, and returns the sum of their
 * first words (so the loads are not optimised away). A sampler that drew its numbers before taking the
 * table's lock calls it first: the misses are paid outside the lock, and the count under it finds
 * the rows in the cache. Writes nothing; a stale guess costs only the loads. ValueError for arrays
 * that do not fit (C-contiguous float64 uniforms in [0, 1); a (capacity, 2) or (capacity, 1) int64 meta).
 */
static PyObject *
touch_draw(PyObject *self, PyObject *args)
{
    PyObject *uniforms, *meta;
    if (!PyArg_ParseTuple(args, "OO", &uniforms, &meta))
        return NULL;
    Py_buffer u, m;
    if (PyObject_GetBuffer(uniforms, &u, PyBUF_FORMAT | PyBUF_STRIDES) < 0)
        return NULL;
    if (PyObject_GetBuffer(meta, &m, PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
        PyBuffer_Release(&u);
        return NULL;
    }
    const char *err = NULL;
    Py_ssize_t n = u.ndim == 1 ? u.shape[0] : -1;
    if (n < 0 || u.itemsize != 8 || !is_c_contiguous(&u) || bare_format(u.format)[0] != 'd')
        err = "touch_draw: uniforms must be a C-contiguous float64 vector";
    else if (m.ndim != 2 || !META_OK(m.shape[1]) || m.itemsize != 8 || !is_c_contiguous(&m) || m.shape[0] < 1)
        err = "touch_draw: meta must be a C-contiguous (capacity, 2) or (capacity, 1) int64 array";
    long long total = 0;
    if (err == NULL) {
        const double *uu = (const double *)u.buf;
        const int64_t *rows = (const int64_t *)m.buf;
        META_DISPATCH(m.shape[1], total = meta_touch(uu, n, rows, m.shape[0], W_));
    }
    PyBuffer_Release(&u);
    PyBuffer_Release(&m);
    if (err != NULL) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    return PyLong_FromLongLong(total);
}

/* count_samples(meta, slots, out) -> None
 *
 * Adds one to times_sampled of every slot (duplicates count twice; a count saturates at
 * 2**31 - 1), then writes each slot's sample row but its key (times sampled, version, priority
 * bits: columns 1-3; fill_keys writes column 0) into out (len(slots), 4) int64: the counts
 * include this sample. slots is a
 * C-contiguous int64 array; raises ValueError for a bad array or a slot out of range (checked
 * before anything is written).
 */
static PyObject *
count_samples(PyObject *self, PyObject *args)
{
    PyObject *meta, *slots, *out;
    if (!PyArg_ParseTuple(args, "OOO", &meta, &slots, &out))
        return NULL;
    Py_buffer m, s, o;
    if (PyObject_GetBuffer(meta, &m, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0)
        return NULL;
    if (PyObject_GetBuffer(slots, &s, PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
        PyBuffer_Release(&m);
        return NULL;
    }
    if (PyObject_GetBuffer(out, &o, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
        PyBuffer_Release(&m);
        PyBuffer_Release(&s);
        return NULL;
    }
    const char *err = NULL;
    Py_ssize_t n = s.ndim == 1 ? s.shape[0] : -1;
    if (m.ndim != 2 || !META_OK(m.shape[1]) || m.itemsize != 8 || !is_c_contiguous(&m))
        err = "count_samples: meta must be a C-contiguous (capacity, 2) or (capacity, 1) int64 array";
    else if (n < 0 || s.itemsize != 8 || !is_c_contiguous(&s) || strchr("lq", bare_format(s.format)[0]) == NULL)
        err = "count_samples: slots must be a C-contiguous int64 vector";
    else if (o.ndim != 2 || o.shape[0] != n || o.shape[1] != 4 || o.itemsize != 8 || !is_c_contiguous(&o))
        err = "count_samples: out must be a C-contiguous (len(slots), 4) 8-byte array";
    const int64_t *sl = (const int64_t *)s.buf;
    Py_ssize_t cap = err ? 0 : m.shape[0];
    for (Py_ssize_t i = 0; i < n && err == NULL; i++)
        if (sl[i] < 0 || sl[i] >= cap)
            err = "count_samples: a slot is out of range";
    if (err == NULL) {
        META_DISPATCH(m.shape[1], meta_count_widen((int64_t *)m.buf, W_, sl, n, (int64_t *)o.buf));
    }
    PyBuffer_Release(&m);
    PyBuffer_Release(&s);
    PyBuffer_Release(&o);
    if (err != NULL) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    Py_RETURN_NONE;
}



/* gather_rows' copy: rows of every column at slots sl, and (mrows) the sample's counts and rows */
/* the keys of sample rows (fill_keys): kc[slot], or (kc NULL: ring mode) lo + ((slot - start) mod cap) */
static inline void
keys_into(int64_t *dst, const int64_t *sl, Py_ssize_t n, const int64_t *kc, long long lo, long long base,
          Py_ssize_t cap)
{
    if (kc != NULL) {
        for (Py_ssize_t i = 0; i < n; i++)
            dst[4 * i] = kc[sl[i]];
        return;
    }
    int64_t start = (int64_t)((lo - base) % cap);
    if (start < 0)
        start += cap;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t d = sl[i] - start;
        dst[4 * i] = lo + (d < 0 ? d + cap : d);
    }
}

ALWAYS_INLINE void
gather_loop(Py_buffer *cols, Py_buffer *dst, const Py_ssize_t *rowb, Py_ssize_t k, const int64_t *sl, Py_ssize_t n,
            int64_t *mrows, int64_t *mout, Py_ssize_t mw, const int64_t *kc)
{
    {
        for (Py_ssize_t j = 0; j < n; j++) {
            if (j + PREFETCH_AHEAD < n) {
                int64_t ahead = sl[j + PREFETCH_AHEAD];
                for (Py_ssize_t i = 0; i < k; i++) {
                    const char *row = (const char *)cols[i].buf + ahead * rowb[i];
                    __builtin_prefetch(row);
                    if (rowb[i] > 64)
                        __builtin_prefetch(row + rowb[i] - 1);
                }
                if (mrows != NULL)
                    PREFETCH_META(mrows + mw * ahead, mw);
                if (kc != NULL)  /* (the key column, out of ring mode: its misses overlap too) */
                    __builtin_prefetch(kc + ahead);
            }
            for (Py_ssize_t i = 0; i < k; i++)
                memcpy((char *)dst[i].buf + j * rowb[i], (const char *)cols[i].buf + sl[j] * rowb[i],
                       (size_t)rowb[i]);
            if (mrows != NULL)
                meta_count(mrows + mw * sl[j]);
        }
        if (mrows != NULL) {  /* after every increment: a repeated slot shows its final count */
            for (Py_ssize_t j = 0; j < n; j++)
                meta_widen(mout + 4 * j, mrows + mw * sl[j], mw);
        }
    }
}

/* gather_rows(columns, slots, outs[, meta, meta_out[, key_column, lo, base]]) -> bool
 *
 * outs[i][j] = columns[i][slots[j]] for every column: one pass over the slots that copies each
 * slot's row of every column, prefetching the rows PREFETCH_AHEAD slots ahead, so the cache
 * misses of all columns overlap (a per-column np.take waits for them column by column).
 * columns: C-contiguous (capacity, ...) arrays; outs: C-contiguous (len(slots), ...) arrays of
 * the same row size; slots: a C-contiguous int64 vector. Returns False, having written nothing,
 * when a shape or format does not match or a slot is out of range.
 * With meta and meta_out (as for count_samples), the same pass also counts the sample: each
 * slot's times_sampled is raised (a repeated slot once per draw) and its row, with the new
 * count, copied to meta_out; with key_column, lo and base too, the rows' keys as fill_keys
 * writes them (key_column None: a ring whose live keys start at lo, key base in slot 0), else
 * their key column is left as it is. False (nothing written) for a key column that does not fit.
 */
static PyObject *
gather_rows(PyObject *self, PyObject *args)
{
    PyObject *columns, *slots, *outs, *meta = NULL, *meta_out = NULL, *kcol = NULL;
    long long klo = 0, kbase = 0;
    if (!PyArg_ParseTuple(args, "O!OO!|OOOLL", &PyTuple_Type, &columns, &slots, &PyTuple_Type, &outs, &meta,
                          &meta_out, &kcol, &klo, &kbase))
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(columns);
    if (k != PyTuple_GET_SIZE(outs) || k > MAX_FIELDS)
        Py_RETURN_FALSE;
    Py_buffer s;
    if (PyObject_GetBuffer(slots, &s, PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    Py_buffer cols[MAX_FIELDS], dst[MAX_FIELDS];
    Py_ssize_t rowb[MAX_FIELDS];
    Py_ssize_t got = 0;
    int ok = s.ndim == 1 && s.itemsize == 8 && is_c_contiguous(&s) && strchr("lq", bare_format(s.format)[0]) != NULL;
    Py_ssize_t n = ok ? s.shape[0] : 0;
    Py_ssize_t cap = -1;
    for (Py_ssize_t i = 0; i < k && ok; i++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(columns, i), &cols[i], PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
            PyErr_Clear();
            ok = 0;
            break;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(outs, i), &dst[i], PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
            PyErr_Clear();
            PyBuffer_Release(&cols[i]);
            ok = 0;
            break;
        }
        got = i + 1;
        Py_buffer *c = &cols[i], *o = &dst[i];
        if (c->ndim < 1 || o->ndim != c->ndim || !is_c_contiguous(c) || !is_c_contiguous(o)
            || o->shape[0] != n || c->itemsize != o->itemsize
            || strcmp(bare_format(c->format), bare_format(o->format)) != 0) {
            ok = 0;
            break;
        }
        for (int j = 1; j < c->ndim; j++)
            if (c->shape[j] != o->shape[j])
                ok = 0;
        if (cap < 0 || c->shape[0] < cap)
            cap = c->shape[0];
        rowb[i] = c->shape[0] ? c->len / c->shape[0] : 0;
    }
    Py_buffer m, mo;
    int has_meta = 0;
    if (ok && meta != NULL && meta_out != NULL) {
        if (PyObject_GetBuffer(meta, &m, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
            PyErr_Clear();
            ok = 0;
        } else if (PyObject_GetBuffer(meta_out, &mo, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
            PyErr_Clear();
            PyBuffer_Release(&m);
            ok = 0;
        } else {
            has_meta = 1;
            if (m.ndim != 2 || !META_OK(m.shape[1]) || m.itemsize != 8 || !is_c_contiguous(&m) || mo.ndim != 2
                || mo.shape[0] != n || mo.shape[1] != 4 || mo.itemsize != 8 || !is_c_contiguous(&mo))
                ok = 0;
            else if (cap < 0 || m.shape[0] < cap)
                cap = m.shape[0];
        }
    }
    Py_buffer kb;
    int has_kcol = 0;
    if (ok && has_meta && kcol != NULL && kcol != Py_None) {
        if (PyObject_GetBuffer(kcol, &kb, PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
            PyErr_Clear();
            ok = 0;
        } else {
            has_kcol = 1;
            if (kb.ndim != 1 || kb.itemsize != 8 || !is_c_contiguous(&kb) || kb.shape[0] != m.shape[0])
                ok = 0;
        }
    }
    const int64_t *sl = (const int64_t *)s.buf;
    for (Py_ssize_t j = 0; j < n && ok; j++)
        if (sl[j] < 0 || sl[j] >= cap)
            ok = 0;
    if (ok) {
        int64_t *mrows = has_meta ? (int64_t *)m.buf : NULL, *mout = has_meta ? (int64_t *)mo.buf : NULL;
        const int64_t *kc = has_kcol ? (const int64_t *)kb.buf : NULL;
        META_DISPATCH(has_meta ? m.shape[1] : META_W, gather_loop(cols, dst, rowb, k, sl, n, mrows, mout, W_, kc));
        if (has_meta && kcol != NULL)
            keys_into(mout, sl, n, kc, klo, kbase, m.shape[0]);
    }
    if (has_kcol)
        PyBuffer_Release(&kb);
    if (has_meta) {
        PyBuffer_Release(&m);
        PyBuffer_Release(&mo);
    }
    for (Py_ssize_t i = 0; i < got; i++) {
        PyBuffer_Release(&cols[i]);
        PyBuffer_Release(&dst[i]);
    }
    PyBuffer_Release(&s);
    if (ok)
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}


/* add_row(columns, sources, start, meta, version, priority) -> bool
 *
 * copy_rows(columns, sources, start, 1, False) and, when it copied, fill_meta(meta, start, 1,
 * version, priority): one call for a single add. False: nothing written.
 */
static PyObject *
add_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "add_row takes 6 arguments");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    long long version = PyLong_AsLongLong(args[4]);
    double priority = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(args[3], &b, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0)
        return NULL;
    if (b.ndim != 2 || !META_OK(b.shape[1]) || b.itemsize != 8 || !is_c_contiguous(&b) || start < 0
        || start >= b.shape[0] || version < INT32_MIN || version > INT32_MAX) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "add_row: meta must be a C-contiguous (capacity, 2) or (capacity, 1) int64 array "
                                          "and the version an int32");
        return NULL;
    }
    int copied = copy_rows_impl(args[0], args[1], start, 1, 0, NULL, 0);
    if (!copied) {
        PyBuffer_Release(&b);
        Py_RETURN_FALSE;
    }
    int64_t pbits;
    memcpy(&pbits, &priority, 8);
    meta_set((int64_t *)b.buf + b.shape[1] * start, b.shape[1], (int32_t)version, pbits);
    PyBuffer_Release(&b);
    Py_RETURN_TRUE;
}

/* fill_keys(out, slots, key_column, lo, base, capacity) -> None
 *
 * Column 0 of sample rows out ((len(slots), 4) int64): the key of each slot. With key_column (a
 * (capacity,) int64 vector: a table out of ring mode) key_column[slot]; with None (ring mode:
 * live keys [lo, ...), key base in slot 0) lo + ((slot - (lo - base)) mod capacity). ValueError
 * (nothing written) for arrays that do not fit or a slot out of range.
 */
static PyObject *
fill_keys(PyObject *self, PyObject *args)
{
    PyObject *out, *slots, *col;
    long long lo, base;
    Py_ssize_t capacity;
    if (!PyArg_ParseTuple(args, "OOOLLn", &out, &slots, &col, &lo, &base, &capacity))
        return NULL;
    Py_buffer o, s, c;
    int has_col = col != Py_None;
    if (PyObject_GetBuffer(out, &o, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_STRIDES) < 0)
        return NULL;
    if (PyObject_GetBuffer(slots, &s, PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
        PyBuffer_Release(&o);
        return NULL;
    }
    if (has_col && PyObject_GetBuffer(col, &c, PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
        PyBuffer_Release(&o);
        PyBuffer_Release(&s);
        return NULL;
    }
    const char *err = NULL;
    Py_ssize_t n = s.ndim == 1 ? s.shape[0] : -1;
    if (n < 0 || s.itemsize != 8 || !is_c_contiguous(&s) || strchr("lq", bare_format(s.format)[0]) == NULL)
        err = "fill_keys: slots must be a C-contiguous int64 vector";
    else if (o.ndim != 2 || o.shape[0] != n || o.shape[1] != 4 || o.itemsize != 8 || !is_c_contiguous(&o))
        err = "fill_keys: out must be a C-contiguous (len(slots), 4) int64 array";
    else if (capacity <= 0 || (has_col && (c.ndim != 1 || c.shape[0] != capacity || c.itemsize != 8
                                           || !is_c_contiguous(&c))))
        err = "fill_keys: key_column must be a C-contiguous (capacity,) int64 vector, capacity > 0";
    const int64_t *sl = (const int64_t *)s.buf;
    for (Py_ssize_t i = 0; i < n && err == NULL; i++)
        if (sl[i] < 0 || sl[i] >= capacity)
            err = "fill_keys: a slot is out of range";
    if (err == NULL) {
        int64_t *dst = (int64_t *)o.buf;
        if (has_col) {
            const int64_t *kc = (const int64_t *)c.buf;
            for (Py_ssize_t i = 0; i < n; i++)
                dst[4 * i] = kc[sl[i]];
        } else {
            int64_t start = (int64_t)((lo - base) % capacity);
            if (start < 0)
                start += capacity;
            for (Py_ssize_t i = 0; i < n; i++) {
                int64_t d = sl[i] - start;
                dst[4 * i] = lo + (d < 0 ? d + capacity : d);
            }
        }
    }
    if (has_col)
        PyBuffer_Release(&c);
    PyBuffer_Release(&s);
    PyBuffer_Release(&o);
    if (err != NULL) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"copy_rows", copy_rows, METH_VARARGS,
     "copy_rows(columns, sources, start, n, batched[, hi_word, written_hi]) -> bool: copy matching rows "
     "(written_hi first), or write nothing."},
    {"fill_meta", fill_meta, METH_VARARGS,
     "fill_meta(meta, start, n, version, priority): metadata rows of new items."},
    {"fill_keys", fill_keys, METH_VARARGS,
     "fill_keys(out, slots, key_column, lo, base, capacity): the keys (column 0) of sample rows."},
    {"ring_draw", ring_draw, METH_VARARGS,
     "ring_draw(uniforms, size, start, capacity, out): the slots of a ring's uniform draw."},
    {"ring_lookup", ring_lookup, METH_VARARGS,
     "ring_lookup(keys, lo, hi, base, capacity, out): the ring slots of keys, -1 for keys not live."},
    {"last_occurrences", last_occurrences, METH_VARARGS,
     "last_occurrences(slots, scratch, mask) -> bool: mark each slot's last position; True if all distinct."},
    {"touch_draw", touch_draw, METH_VARARGS,
     "touch_draw(uniforms, meta) -> int: read the metadata rows a full ring's draw will take."},
    {"count_samples", count_samples, METH_VARARGS,
     "count_samples(meta, slots, out): count a sample of slots and gather their metadata rows."},
    {"add_row", (PyCFunction)(void (*)(void))add_row, METH_FASTCALL,
     "add_row(columns, sources, start, meta, version, priority) -> bool: one item and its metadata."},
    {"gather_rows", gather_rows, METH_VARARGS,
     "gather_rows(columns, slots, outs[, meta, meta_out[, key_column, lo, base]]) -> bool: rows of every column "
     "at slots, cache misses overlapped."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__rows(void)
{
    return PyModule_Create(&module);
}
