/* replaystore._ring: a ring-mode Table's single add and small extend as one call into C.
 *
 * Optional, like replaystore._rows: without it Table.add / Table.extend are the Python methods
 * (the reference). With it they are FastMethod descriptors: calling one runs the compiled path
 * when the table holds a RingWriter (built by table/fast.py once the ring plan is known) and the
 * call is one it handles exactly as the Python path would; any other call (a blocking rate
 * limiter, a waiting thread, a closed table, keywords it does not know, data whose dtype, shape
 * or layout is not exactly the column's, ...) goes to the Python method unchanged, which then
 * does what it always did (waits, raises the named error, casts). So the compiled path never
 * raises a replaystore error of its own and never changes anything before it knows it will
 * finish: every check comes before the first write.
 *
 * What it does, mirroring table/fast.py (FastPaths._add_ring, FastPaths._extend_ring +
 * _ring_commit for a table with no selector to tell, i.e. a Uniform sampler and the Fifo remover
 * in ring mode): take the table's lock, read the TableState's and the rate limiter's counters
 * straight from their __slots__ (offsets found once, for their exact classes: a shared table's
 * swapped classes send it to the Python path), copy the row(s) into the columns (in process
 * only: no reader copies outside the lock, so no written_hi to publish first), fill the
 * metadata rows (no key: implicit in ring mode), move the ring and the counters, release the lock.
 *
 * Thread-safety: it holds the GIL throughout and the table's RLock (acquired through the lock's
 * own acquire, which waits with the GIL released when another thread holds it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <stdint.h>
#include <float.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/arrayscalars.h>

#define MAX_FIELDS 64
/* fast_add starts on a cache line: the placement of the same code moved a single add by ~8%
 * (~175 vs ~190 ns on the AMD EPYC of the issue 36 measurements, docs/benchmarks.md) */
#define HOT_ALIGN __attribute__((aligned(64)))
/* the metadata row (replaystore.rows): (times_sampled, version) as two int32, priority bits
 * (META_W words), or without the priority (META_W_NARROW: a table that keeps no per-item priority);
 * no key: a ring-mode table's keys are implicit (its slot's ring arithmetic) */
#define META_W 2
#define META_W_NARROW 1
#define META_TS32 0
#define META_VER32 1
#define META_PRIO 1

/* the TableState slots and rate-limiter slots the paths read or write */
enum { S_NEXT_KEY, S_SIZE, S_NFREE, S_VERSION, S_RING_MODE, S_RING_BASE, S_RING_LO, S_RING_HI, S_CLOSED,
       S_INSERTS, S_DELETES, S_EVICTIONS, S_MAX_PRIORITY, S_COUNT };
static const char *state_names[S_COUNT] = {"next_key", "size", "nfree", "version", "ring_mode", "ring_base",
                                           "ring_lo", "ring_hi", "closed", "inserts", "deletes", "evictions",
                                           "max_priority"};
enum { L_INSERTS, L_SAMPLES, L_DELETES, L_MAX_DIFF, L_MIN_SIZE, L_SPI, L_COUNT };
static const char *limiter_names[L_COUNT] = {"inserts", "samples", "deletes", "max_diff", "min_size_to_sample",
                                             "samples_per_insert"};

static PyObject *str_plan, *str_waiting, *str_rate_limiter, *str_stager, *str_max_staleness;
static PyObject *str_priority, *str_version, *str_timeout, *str_priorities;

typedef struct {
    PyObject_HEAD
    Py_ssize_t k;
    PyObject *names;    /* tuple of str: the fields, in the columns' order */
    PyObject *columns;  /* tuple of ndarrays (kept alive) */
    PyObject *meta;     /* the (capacity, META_W) int64 metadata (kept alive) */
    PyObject *state;    /* the TableState */
    PyObject *limiter;  /* the rate limiter (the table's rate_limiter is checked against it per call) */
    PyObject *lock, *acquire, *release;  /* the table's RLock and its bound methods */
    int peek;  /* the lock's owner and count can be read in place (rlock_probe) */
    PyTypeObject *state_type, *limiter_type;
    Py_ssize_t soff[S_COUNT], loff[L_COUNT];
    int limiter_formula;  /* its can_insert is RateLimiter's: computed here */
    int meta_w;  /* words per metadata row: META_W or META_W_NARROW (in the padding: no offset moves) */
    Py_ssize_t capacity;
    int64_t *meta_rows;
    char *data[MAX_FIELDS];
    Py_ssize_t rowbytes[MAX_FIELDS];
    PyArray_Descr *descr[MAX_FIELDS];
    int ndim[MAX_FIELDS];  /* the column's */
    npy_intp *shape[MAX_FIELDS];  /* the column's dims (owned by the column) */
    char fmt[MAX_FIELDS][2];  /* a 1-d column's type char for Python scalars ("" if none) */
    char plain_scalar[MAX_FIELDS];  /* a 1-d column of a bool/int/float/complex dtype (its scalars: head + value) */
} RingWriter;

/* ---- slots --------------------------------------------------------------------------------- */

static Py_ssize_t
slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (d == NULL)
        return -1;
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
            off = m->offset;
    }
    Py_DECREF(d);
    if (off < 0)
        PyErr_Format(PyExc_TypeError, "RingWriter: %s.%s is not a writable __slots__ member", type->tp_name, name);
    return off;
}

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* an int slot's value; -1 and *ok = 0 when it is unset or not an int that fits */
static inline long long
get_int(PyObject *obj, Py_ssize_t off, int *ok)
{
    PyObject *v = SLOT(obj, off);
    if (v == NULL || !PyLong_CheckExact(v)) {
        *ok = 0;
        return -1;
    }
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)v))
        return (long long)PyUnstable_Long_CompactValue((PyLongObject *)v);
#elif PY_VERSION_HEX >= 0x030B0000 && PYLONG_BITS_IN_DIGIT == 30
    {   /* (3.11: up to two 30-bit digits read in place; the counters' usual sizes) */
        Py_ssize_t size = Py_SIZE(v);
        const digit *d = ((PyLongObject *)v)->ob_digit;
        if (size == 0)
            return 0;
        if (size == 1)
            return (long long)d[0];
        if (size == 2)
            return (long long)d[0] | ((long long)d[1] << PyLong_SHIFT);
        if (size == -1)
            return -(long long)d[0];
    }
#endif
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        *ok = 0;
    }
    return x;
}

static inline double
get_float(PyObject *obj, Py_ssize_t off, int *ok)
{
    PyObject *v = SLOT(obj, off);
    if (v == NULL || !PyFloat_CheckExact(v)) {
        *ok = 0;
        return 0.0;
    }
    return PyFloat_AS_DOUBLE(v);
}

/* values to store, made before any is stored (so a MemoryError changes nothing) */
typedef struct {
    PyObject *obj;
    Py_ssize_t off;
    PyObject *value;
} PendingSet;

static int
pend_int(PendingSet *p, int *n, PyObject *obj, Py_ssize_t off, long long x)
{
    PyObject *v = PyLong_FromLongLong(x);
    if (v == NULL)
        return -1;
    p[*n].obj = obj;
    p[*n].off = off;
    p[*n].value = v;
    (*n)++;
    return 0;
}

/* the same new value as the last one pended (one more reference to it); 0 */
static int
pend_same(PendingSet *p, int *n, PyObject *obj, Py_ssize_t off)
{
    PyObject *v = p[*n - 1].value;
    Py_INCREF(v);
    p[*n].obj = obj;
    p[*n].off = off;
    p[*n].value = v;
    (*n)++;
    return 0;
}

static void
pend_drop(PendingSet *p, int n)
{
    for (int i = 0; i < n; i++)
        Py_DECREF(p[i].value);
}

static void
pend_apply(PendingSet *p, int n)
{
    for (int i = 0; i < n; i++)
        Py_XSETREF(SLOT(p[i].obj, p[i].off), p[i].value);
}

/* ---- Python scalars into a 0-d field (the same rules as replaystore._rows) ------------------ */

static int
write_py_scalar(PyObject *v, const char *fmt, Py_ssize_t itemsize, char *dst)
{
    char f = fmt[0];
    if (f == '\0')
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

static PyTypeObject RingWriterType;
static int rlock_probe(PyObject *lock, PyObject *acquire, PyObject *release);

/* ---- RingWriter ------------------------------------------------------------------------------ */

static int
writer_traverse(RingWriter *w, visitproc visit, void *arg)
{
    Py_VISIT(w->names);
    Py_VISIT(w->columns);
    Py_VISIT(w->meta);
    Py_VISIT(w->state);
    Py_VISIT(w->limiter);
    Py_VISIT(w->lock);
    Py_VISIT(w->acquire);
    Py_VISIT(w->release);
    return 0;
}

static int
writer_clear(RingWriter *w)
{
    Py_CLEAR(w->names);
    Py_CLEAR(w->columns);
    Py_CLEAR(w->meta);
    Py_CLEAR(w->state);
    Py_CLEAR(w->limiter);
    Py_CLEAR(w->lock);
    Py_CLEAR(w->acquire);
    Py_CLEAR(w->release);
    for (Py_ssize_t i = 0; i < w->k; i++)
        Py_CLEAR(w->descr[i]);
    w->k = 0;
    return 0;
}

static void
writer_dealloc(RingWriter *w)
{
    PyObject_GC_UnTrack(w);
    writer_clear(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* RingWriter(names, columns, meta, state, limiter, lock, limiter_formula) */
static PyObject *
writer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *names, *columns, *meta, *state, *limiter, *lock;
    int formula;
    if (!PyArg_ParseTuple(args, "O!O!OOOOp", &PyTuple_Type, &names, &PyTuple_Type, &columns, &meta, &state, &limiter,
                          &lock, &formula))
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(names);
    if (k < 1 || k > MAX_FIELDS || PyTuple_GET_SIZE(columns) != k) {
        PyErr_SetString(PyExc_ValueError, "RingWriter: 1..64 names and one column each");
        return NULL;
    }
    if (!PyArray_CheckExact(meta) || PyArray_NDIM((PyArrayObject *)meta) != 2
        || (PyArray_DIM((PyArrayObject *)meta, 1) != META_W && PyArray_DIM((PyArrayObject *)meta, 1) != META_W_NARROW)
        || PyArray_TYPE((PyArrayObject *)meta) != NPY_INT64
        || !PyArray_ISCARRAY((PyArrayObject *)meta)) {
        PyErr_SetString(PyExc_ValueError, "RingWriter: meta must be a writable C-contiguous (capacity, 2) or (capacity, 1) int64 array");
        return NULL;
    }
    Py_ssize_t cap = PyArray_DIM((PyArrayObject *)meta, 0);
    RingWriter *w = (RingWriter *)type->tp_alloc(type, 0);
    if (w == NULL)
        return NULL;
    w->k = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        PyObject *col = PyTuple_GET_ITEM(columns, i);
        if (!PyUnicode_CheckExact(name) || !PyArray_CheckExact(col) || !PyArray_ISCARRAY((PyArrayObject *)col)
            || PyArray_NDIM((PyArrayObject *)col) < 1 || PyArray_DIM((PyArrayObject *)col, 0) != cap
            || !PyArray_ISNBO(PyArray_DESCR((PyArrayObject *)col)->byteorder)
            || PyDataType_HASFIELDS(PyArray_DESCR((PyArrayObject *)col))
            || PyDataType_HASSUBARRAY(PyArray_DESCR((PyArrayObject *)col))
            || PyDataType_REFCHK(PyArray_DESCR((PyArrayObject *)col))) {
            PyErr_SetString(PyExc_ValueError, "RingWriter: each column a writable C-contiguous (capacity, ...) "
                                              "array of a plain native dtype, named by a str");
            Py_DECREF(w);
            return NULL;
        }
        PyArrayObject *a = (PyArrayObject *)col;
        PyArray_Descr *d = PyArray_DESCR(a);
        Py_INCREF(d);
        w->descr[i] = d;
        w->k = i + 1;
        w->data[i] = PyArray_BYTES(a);
        w->rowbytes[i] = cap ? PyArray_NBYTES(a) / cap : 0;
        w->ndim[i] = PyArray_NDIM(a);
        w->shape[i] = PyArray_DIMS(a);
        w->fmt[i][0] = w->ndim[i] == 1 ? d->type : '\0';
        w->plain_scalar[i] = w->ndim[i] == 1 && strchr("biufc", d->kind) != NULL && PyDataType_ELSIZE(d) <= 16
                             && d->typeobj->tp_basicsize >= (Py_ssize_t)sizeof(PyObject) + PyDataType_ELSIZE(d);
        w->fmt[i][1] = '\0';
    }
    w->capacity = cap;
    w->meta_rows = (int64_t *)PyArray_DATA((PyArrayObject *)meta);
    w->meta_w = (int)PyArray_DIM((PyArrayObject *)meta, 1);
    Py_INCREF(names);
    w->names = names;
    Py_INCREF(columns);
    w->columns = columns;
    Py_INCREF(meta);
    w->meta = meta;
    Py_INCREF(state);
    w->state = state;
    Py_INCREF(limiter);
    w->limiter = limiter;
    w->state_type = Py_TYPE(state);
    w->limiter_type = Py_TYPE(limiter);
    w->limiter_formula = formula;
    for (int i = 0; i < S_COUNT; i++)
        if ((w->soff[i] = slot_offset(w->state_type, state_names[i])) < 0)
            goto fail;
    for (int i = 0; i < L_COUNT; i++)
        if ((w->loff[i] = slot_offset(w->limiter_type, limiter_names[i])) < 0)
            goto fail;
    if ((w->acquire = PyObject_GetAttrString(lock, "acquire")) == NULL)
        goto fail;
    if ((w->release = PyObject_GetAttrString(lock, "release")) == NULL)
        goto fail;
    Py_INCREF(lock);
    w->lock = lock;
    if ((w->peek = rlock_probe(lock, w->acquire, w->release)) < 0)
        goto fail;
    return (PyObject *)w;
fail:
    Py_DECREF(w);
    return NULL;
}

/* The limiter admits n more items without blocking (RateLimiter.can_insert, or no upper limit). */
static int
limiter_admits(RingWriter *w, PyObject *lim, long long n, int *ok)
{
    double max_diff = get_float(lim, w->loff[L_MAX_DIFF], ok);
    if (!*ok)
        return 0;
    if (!(max_diff < DBL_MAX))
        return 1;
    if (!w->limiter_formula) {
        *ok = 0;
        return 0;
    }
    long long ins = get_int(lim, w->loff[L_INSERTS], ok);
    long long smp = get_int(lim, w->loff[L_SAMPLES], ok);
    long long del = get_int(lim, w->loff[L_DELETES], ok);
    long long mins = get_int(lim, w->loff[L_MIN_SIZE], ok);
    double spi = get_float(lim, w->loff[L_SPI], ok);
    if (!*ok)
        return 0;
    /* the same arithmetic as RateLimiter.can_insert (Python ints into doubles: exact below 2**53) */
    if (ins - del + n <= mins)
        return 1;
    return (double)(ins + n) * spi - (double)smp <= max_diff;
}

/* ---- the shared start of both paths: the writer, the lock, the cheap preconditions ---------- */

#if !defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
/* threading.RLock's object (CPython 3.11-3.13, Modules/_threadmodule.c); used only after
 * rlock_probe has checked it against the lock's own acquire/release */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock rlock_lock;
    unsigned long rlock_owner;
    unsigned long rlock_count;
    PyObject *in_weakreflist;
} RLockLayout;
#define CAN_PEEK 1
#else
#define CAN_PEEK 0
#endif

/* 1 when the lock's owner and count can be read in place (checked with the lock's own calls) */
static int
rlock_probe(PyObject *lock, PyObject *acquire, PyObject *release)
{
#if CAN_PEEK
    if (Py_TYPE(lock)->tp_basicsize != (Py_ssize_t)sizeof(RLockLayout))
        return 0;
    RLockLayout *l = (RLockLayout *)lock;
    unsigned long before = l->rlock_count;
    PyObject *r = PyObject_CallNoArgs(acquire);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    int ok = l->rlock_count == before + 1 && l->rlock_owner == PyThread_get_thread_ident();
    r = PyObject_CallNoArgs(release);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return ok && l->rlock_count == before;
#else
    return 0;
#endif
}

typedef struct {
    RingWriter *w;
    PyObject *plan;
    PyObject *dict;
    PyObject *lim;
    int held;  /* this call acquired the lock (else it runs GIL-atomically: see lock_table) */
    int fresh;  /* no Python code can have run since find_writer read the plan */
} Entry;

/* The table's writer: 1 (e filled, a reference to the plan taken), 0: none, -1: error. */
static int
find_writer(PyObject *table, Entry *e)
{
    PyObject **dictptr = _PyObject_GetDictPtr(table);
    if (dictptr == NULL || *dictptr == NULL)
        return 0;
    PyObject *dict = *dictptr;
    PyObject *plan = PyDict_GetItemWithError(dict, str_plan);  /* borrowed */
    if (plan == NULL || !PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 4)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *w = PyTuple_GET_ITEM(plan, 3);
    if (!Py_IS_TYPE(w, &RingWriterType))
        return 0;
    e->w = (RingWriter *)w;
    e->plan = plan;
    e->dict = dict;
    e->held = 0;
    e->fresh = 0;
    Py_INCREF(plan);  /* (it keeps the writer alive, whatever happens to the table's plan) */
    return 1;
}

static int
unlock_table(Entry *e)
{
    if (!e->held)
        return 0;
    e->held = 0;
    PyObject *r = PyObject_CallNoArgs(e->w->release);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Take the table's lock, then check what may have changed: 1: go on; 0: not handled (unlocked);
 * -1: error (unlocked).
 *
 * When the lock is free (or this thread holds it) and its layout was probed, the call does not
 * take it: it holds the GIL and runs no Python code and releases no GIL until it returns, so no
 * other thread can run the table's code meanwhile (a thread that holds the lock may run without
 * the GIL, e.g. inside a NumPy copy: then the lock is not free and this call takes it, waiting
 * with the GIL released). */
static int
lock_table(Entry *e)
{
#if CAN_PEEK
    RLockLayout *l = (RLockLayout *)e->w->lock;
    if (!e->w->peek || !(l->rlock_count == 0 || l->rlock_owner == PyThread_get_thread_ident()))
#endif
    {
        PyObject *r = PyObject_CallNoArgs(e->w->acquire);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
        e->held = 1;
    }
    /* nobody waiting (an insert must notify them: the Python path does), the plan still this
     * writer's, the table's limiter the writer's */
    PyObject *plan2 = !e->held && e->fresh ? e->plan : PyDict_GetItemWithError(e->dict, str_plan);
    PyObject *waiting = plan2 ? PyDict_GetItemWithError(e->dict, str_waiting) : NULL;
    PyObject *lim = waiting ? PyDict_GetItemWithError(e->dict, str_rate_limiter) : NULL;
    int fits = lim != NULL && plan2 == e->plan && PyLong_CheckExact(waiting) && PyLong_AsLong(waiting) == 0
               && lim == e->w->limiter && Py_IS_TYPE(lim, e->w->limiter_type)
               && Py_IS_TYPE(e->w->state, e->w->state_type);
    if (fits) {
        e->lim = lim;
        return 1;
    }
    if (PyErr_Occurred()) {
        PyObject *exc, *val, *tb;
        PyErr_Fetch(&exc, &val, &tb);
        if (unlock_table(e) < 0) {
            Py_XDECREF(exc);
            Py_XDECREF(val);
            Py_XDECREF(tb);
        } else
            PyErr_Restore(exc, val, tb);
        return -1;
    }
    return unlock_table(e) < 0 ? -1 : 0;
}

/* unlock, drop the plan; returns `result` (stolen), or NULL when the release failed. An error
 * already set when result is NULL is kept. */
static PyObject *
leave(Entry *e, PyObject *result)
{
    PyObject *exc = NULL, *val = NULL, *tb = NULL;
    int err = result == NULL && PyErr_Occurred();
    if (err)
        PyErr_Fetch(&exc, &val, &tb);
    int bad = unlock_table(e) < 0;
    Py_DECREF(e->plan);
    if (bad) {
        Py_XDECREF(result);
        Py_XDECREF(exc);
        Py_XDECREF(val);
        Py_XDECREF(tb);
        return NULL;
    }
    if (err)
        PyErr_Restore(exc, val, tb);
    return result;
}

/* the state's common reads; ok = 0 when any is not a plain value (then not handled) */
typedef struct {
    long long next_key, size, nfree, version, ring_base, ring_lo, inserts, deletes, evictions;
    long long lim_inserts, lim_deletes;
    double max_priority;
} Counts;

static int
read_counts(RingWriter *w, PyObject *lim, Counts *c, long long n)
{
    PyObject *st = w->state;
    int ok = 1;
    if (get_int(st, w->soff[S_CLOSED], &ok) != 0 || get_int(st, w->soff[S_RING_MODE], &ok) != 1 || !ok)
        return 0;
    c->next_key = get_int(st, w->soff[S_NEXT_KEY], &ok);
    c->size = get_int(st, w->soff[S_SIZE], &ok);
    c->version = get_int(st, w->soff[S_VERSION], &ok);
    c->ring_base = get_int(st, w->soff[S_RING_BASE], &ok);
    c->ring_lo = get_int(st, w->soff[S_RING_LO], &ok);
    c->inserts = get_int(st, w->soff[S_INSERTS], &ok);
    c->max_priority = get_float(st, w->soff[S_MAX_PRIORITY], &ok);
    c->lim_inserts = get_int(lim, w->loff[L_INSERTS], &ok);
    /* (what only a full ring's evictions, or only a filling ring, change) */
    c->deletes = c->evictions = c->lim_deletes = c->nfree = 0;
    if (c->size + n > w->capacity) {
        c->deletes = get_int(st, w->soff[S_DELETES], &ok);
        c->evictions = get_int(st, w->soff[S_EVICTIONS], &ok);
        c->lim_deletes = get_int(lim, w->loff[L_DELETES], &ok);
    }
    if (c->size < w->capacity)
        c->nfree = get_int(st, w->soff[S_NFREE], &ok);
    /* headroom so no counter below overflows int64 */
    if (ok && (c->next_key > INT64_MAX / 2 || c->inserts > INT64_MAX / 2 || c->lim_inserts > INT64_MAX / 2))
        ok = 0;
    return ok;
}

/* Check one source for field i (one row when !batched, n rows when batched); 0: it does not fit. */
static inline int
source_fits(RingWriter *w, Py_ssize_t i, PyObject *src, int batched, npy_intp n, int *slow)
{
    if (!PyArray_CheckExact(src)) {
        if (batched || w->ndim[i] != 1)
            return 0;
        if (w->plain_scalar[i] && Py_IS_TYPE(src, w->descr[i]->typeobj))
            return 1;  /* a NumPy scalar of the column's exact (numeric) type */
        if (PyFloat_CheckExact(src) || PyLong_CheckExact(src) || PyBool_Check(src)) {
            char scratch[16];
            return w->rowbytes[i] <= 16 && write_py_scalar(src, w->fmt[i], w->rowbytes[i], scratch) == 0;
        }
        return 0;
    }
    PyArrayObject *a = (PyArrayObject *)src;
    int lead = batched ? 1 : 0;
    if (PyArray_NDIM(a) != w->ndim[i] - 1 + lead || !PyArray_IS_C_CONTIGUOUS(a))
        return 0;
    PyArray_Descr *d = PyArray_DESCR(a);
    if (d != w->descr[i]) {
        *slow = 1;  /* (NumPy's own code decides: nothing is assumed about what it runs) */
        if (!PyArray_EquivTypes(d, w->descr[i]))
            return 0;
    }
    npy_intp *dims = PyArray_DIMS(a);
    if (batched && dims[0] != n)
        return 0;
    for (int j = 1; j < w->ndim[i]; j++)
        if (dims[j - 1 + lead] != w->shape[i][j])
            return 0;
    return 1;
}

static inline void
write_source(RingWriter *w, Py_ssize_t i, PyObject *src, Py_ssize_t slot, npy_intp n)
{
    char *to = w->data[i] + slot * w->rowbytes[i];
    if (PyArray_CheckExact(src))
        memmove(to, PyArray_DATA((PyArrayObject *)src), (size_t)(n * w->rowbytes[i]));
    else if (Py_IS_TYPE(src, w->descr[i]->typeobj))  /* (a plain numeric scalar: its value follows the head) */
        memcpy(to, (const char *)src + sizeof(PyObject), (size_t)w->rowbytes[i]);
    else
        write_py_scalar(src, w->fmt[i], w->rowbytes[i], to);
}

/* the item's values in the columns' order, borrowed: 2 (found by identity), 1 (found by lookups,
 * which may run a key's __eq__); 0 when its keys are not exactly the names; -1: error */
static int
sources_of(RingWriter *w, PyObject *item, PyObject **out)
{
    if (!PyDict_CheckExact(item) || PyDict_GET_SIZE(item) != w->k)
        return 0;
    /* the usual item: its keys are the names' own (interned) str objects, in the columns' order */
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(item, &pos, &key, &value) && key == PyTuple_GET_ITEM(w->names, i))
        out[i++] = value;
    if (i == w->k)
        return 2;  /* (no Python code ran) */
    for (Py_ssize_t i = 0; i < w->k; i++) {
        PyObject *v = PyDict_GetItemWithError(item, PyTuple_GET_ITEM(w->names, i));
        if (v == NULL)
            return PyErr_Occurred() ? -1 : 0;
        out[i] = v;
    }
    return 1;
}

/* ---- the single add -------------------------------------------------------------------------- */

/* FastPaths._add_ring under the lock; NULL without an error: not handled (nothing changed). */
static PyObject *
add_locked(Entry *e, PyObject **src, PyObject *priority, PyObject *version)
{
    RingWriter *w = e->w;
    PyObject *st = w->state;
    Counts c;
    if (!read_counts(w, e->lim, &c, 1))
        return NULL;
    /* _plain_meta */
    double p;
    if (priority == NULL || priority == Py_None)
        p = c.max_priority;
    else if (PyFloat_CheckExact(priority)) {
        p = PyFloat_AS_DOUBLE(priority);
        if (!(p >= 0.0) || p == Py_HUGE_VAL)
            return NULL;
    } else
        return NULL;
    long long v;
    if (version == NULL || version == Py_None)
        v = c.version;
    else if (PyLong_CheckExact(version)) {
        int overflow = 0;
        v = PyLong_AsLongLongAndOverflow(version, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return NULL;
        }
        PyObject *ms = PyDict_GetItemWithError(e->dict, str_max_staleness);
        if (ms == NULL)
            return NULL;  /* (an error stays set: the caller raises it) */
        if (ms != Py_None) {
            if (!PyLong_CheckExact(ms))
                return NULL;
            overflow = 0;
            long long m = PyLong_AsLongLongAndOverflow(ms, &overflow);
            if (overflow || (m == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                return NULL;
            }
            long long oldest;
            if (__builtin_sub_overflow(c.version, m, &oldest) || v < oldest)
                return NULL;
        }
    } else
        return NULL;
    if (v < INT32_MIN || v > INT32_MAX)
        return NULL;  /* (the general path names the error) */
    int ok = 1;
    if (!limiter_admits(w, e->lim, 1, &ok) || !ok)
        return NULL;
    long long key = c.next_key;
    long long cap = w->capacity;
    long long slot = (key - c.ring_base) % cap;
    if (slot < 0)
        slot += cap;
    /* the new values, made before anything is written */
    PendingSet pend[16];
    int np_ = 0;
    PyObject *ret = SLOT(st, w->soff[S_NEXT_KEY]);  /* the key: the int next_key holds now */
    Py_INCREF(ret);
    PyObject *lim = e->lim;
    int full = c.size == cap;
    /* (equal new values share one int object: fewer allocations, the same values) */
    if (pend_int(pend, &np_, st, w->soff[S_NEXT_KEY], key + 1) < 0
        || pend_same(pend, &np_, st, w->soff[S_RING_HI])
        || pend_int(pend, &np_, st, w->soff[S_INSERTS], c.inserts + 1) < 0
        || (c.lim_inserts == c.inserts ? pend_same(pend, &np_, lim, w->loff[L_INSERTS])
                                       : pend_int(pend, &np_, lim, w->loff[L_INSERTS], c.lim_inserts + 1) < 0))
        goto nomem;
    if (full) {
        if (pend_int(pend, &np_, st, w->soff[S_RING_LO], c.ring_lo + 1) < 0
            || pend_int(pend, &np_, st, w->soff[S_DELETES], c.deletes + 1) < 0
            || (c.lim_deletes == c.deletes ? pend_same(pend, &np_, lim, w->loff[L_DELETES])
                                           : pend_int(pend, &np_, lim, w->loff[L_DELETES], c.lim_deletes + 1) < 0)
            || (c.evictions == c.deletes ? pend_same(pend, &np_, st, w->soff[S_EVICTIONS])
                                         : pend_int(pend, &np_, st, w->soff[S_EVICTIONS], c.evictions + 1) < 0))
            goto nomem;
    } else {
        if ((c.size == 0 && pend_int(pend, &np_, st, w->soff[S_RING_LO], key) < 0)
            || pend_int(pend, &np_, st, w->soff[S_SIZE], c.size + 1) < 0
            || pend_int(pend, &np_, st, w->soff[S_NFREE], c.nfree - 1) < 0)
            goto nomem;
    }
    if (p > c.max_priority) {
        PyObject *fp = PyFloat_FromDouble(p);
        if (fp == NULL)
            goto nomem;
        pend[np_].obj = st;
        pend[np_].off = w->soff[S_MAX_PRIORITY];
        pend[np_].value = fp;
        np_++;
    }
    /* write: the payload, the row, the counters (in process: no reader outside the lock) */
    int64_t *row = w->meta_rows + w->meta_w * slot;
    for (Py_ssize_t i = 0; i < w->k; i++)
        write_source(w, i, src[i], (Py_ssize_t)slot, 1);
    int32_t pair[2] = {0, (int32_t)v};  /* (times sampled, version): word 0, one store */
    memcpy(row, pair, 8);
    if (w->meta_w > META_PRIO)
        memcpy(row + META_PRIO, &p, 8);
    pend_apply(pend, np_);
    return ret;
nomem:
    pend_drop(pend, np_);
    Py_DECREF(ret);
    return NULL;  /* MemoryError set */
}

/* ---- the small extend ------------------------------------------------------------------------ */

/* FastPaths._extend_ring + _ring_commit (no selectors) under the lock; NULL without an error: not handled. */
static PyObject *
extend_locked(Entry *e, PyObject **src, npy_intp n)
{
    RingWriter *w = e->w;
    PyObject *st = w->state;
    PyObject *stager = PyDict_GetItemWithError(e->dict, str_stager);
    if (stager != Py_None)
        return NULL;
    Counts c;
    if (!read_counts(w, e->lim, &c, n))
        return NULL;
    long long cap = w->capacity;
    long long first = c.next_key;
    long long start = (first - c.ring_base) % cap;
    if (start < 0)
        start += cap;
    if (n <= 0 || start + n > cap || c.version < INT32_MIN || c.version > INT32_MAX)
        return NULL;
    int ok = 1;
    if (!limiter_admits(w, e->lim, n, &ok) || !ok)
        return NULL;
    PyArrayObject *keys = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_INT64);
    if (keys == NULL)
        return NULL;
    int64_t *kk = (int64_t *)PyArray_DATA(keys);
    for (npy_intp i = 0; i < n; i++)
        kk[i] = first + i;
    PendingSet pend[16];
    int np_ = 0;
    PyObject *lim = e->lim;
    long long overflow = c.size + n - cap;
    long long size = overflow > 0 ? cap : c.size + n;
    if (pend_int(pend, &np_, st, w->soff[S_RING_HI], first + n) < 0
        || pend_int(pend, &np_, st, w->soff[S_INSERTS], c.inserts + n) < 0
        || pend_int(pend, &np_, lim, w->loff[L_INSERTS], c.lim_inserts + n) < 0)
        goto nomem;
    if (overflow > 0) {
        if (pend_int(pend, &np_, st, w->soff[S_RING_LO], c.ring_lo + overflow) < 0
            || pend_int(pend, &np_, lim, w->loff[L_DELETES], c.lim_deletes + overflow) < 0
            || pend_int(pend, &np_, st, w->soff[S_DELETES], c.deletes + overflow) < 0
            || pend_int(pend, &np_, st, w->soff[S_EVICTIONS], c.evictions + overflow) < 0)
            goto nomem;
    } else if (c.size == 0 && pend_int(pend, &np_, st, w->soff[S_RING_LO], first) < 0)
        goto nomem;
    if (pend_int(pend, &np_, st, w->soff[S_SIZE], size) < 0
        || pend_int(pend, &np_, st, w->soff[S_NFREE], cap - size) < 0
        || pend_int(pend, &np_, st, w->soff[S_NEXT_KEY], first + n) < 0)
        goto nomem;
    Py_ssize_t mw = w->meta_w;
    int64_t *rows = w->meta_rows + mw * start;
    for (Py_ssize_t i = 0; i < w->k; i++)
        write_source(w, i, src[i], (Py_ssize_t)start, n);
    int64_t pbits;
    memcpy(&pbits, &c.max_priority, 8);
    int32_t pair[2] = {0, (int32_t)c.version};  /* (times sampled, version): word 0 */
    int64_t w0;
    memcpy(&w0, pair, 8);
    for (npy_intp i = 0; i < n; i++) {
        int64_t *row = rows + mw * i;
        row[0] = w0;
        if (mw > META_PRIO)
            row[META_PRIO] = pbits;
    }
    pend_apply(pend, np_);
    return (PyObject *)keys;
nomem:
    pend_drop(pend, np_);
    Py_DECREF(keys);
    return NULL;
}

/* ---- the methods ------------------------------------------------------------------------------ */

/* the compiled Table.add(item, priority=None, version=None, timeout=None); NULL w/o error: not handled */
static HOT_ALIGN PyObject *
fast_add(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 2 || nargs > 5)
        return NULL;
    PyObject *priority = nargs > 2 ? args[2] : NULL, *version = nargs > 3 ? args[3] : NULL;
    if (kwnames != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk; i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
            if (name == str_priority && priority == NULL)
                priority = value;
            else if (name == str_version && version == NULL)
                version = value;
            else if (name != str_timeout || nargs > 4)
                return NULL;  /* (a name not interned, a repeated argument: the Python method says) */
        }
    }
    Entry e;
    int r = find_writer(args[0], &e);
    if (r <= 0)
        return NULL;
    /* the item's checks first (its dict may run Python code: a key's __eq__), then the lock */
    PyObject *src[MAX_FIELDS];
    r = sources_of(e.w, args[1], src);
    if (r < 0) {  /* (a key's __eq__ raised: the Python method meets it again and says so) */
        PyErr_Clear();
        r = 0;
    }
    int slow = r != 2;
    for (Py_ssize_t i = 0; r > 0 && i < e.w->k; i++)
        if (!source_fits(e.w, i, src[i], 0, 1, &slow))
            r = 0;
    e.fresh = !slow;
    if (r > 0)
        r = lock_table(&e);
    if (r <= 0) {
        Py_DECREF(e.plan);
        return NULL;
    }
    return leave(&e, add_locked(&e, src, priority, version));
}

/* the compiled Table.extend(data, priorities=None, version=None, timeout=None) */
static PyObject *
fast_extend(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 2 || nargs > 5 || (nargs > 2 && args[2] != Py_None) || (nargs > 3 && args[3] != Py_None))
        return NULL;
    if (kwnames != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk; i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
            if (name == str_priorities && nargs <= 2 && value == Py_None)
                continue;
            if (name == str_version && nargs <= 3 && value == Py_None)
                continue;
            if (name == str_timeout && nargs <= 4)
                continue;
            return NULL;
        }
    }
    Entry e;
    int r = find_writer(args[0], &e);
    if (r <= 0)
        return NULL;
    PyObject *src[MAX_FIELDS];
    npy_intp n = 0;
    r = sources_of(e.w, args[1], src);
    if (r < 0) {  /* (a key's __eq__ raised: the Python method meets it again and says so) */
        PyErr_Clear();
        r = 0;
    }
    if (r > 0 && (!PyArray_CheckExact(src[0]) || PyArray_NDIM((PyArrayObject *)src[0]) < 1))
        r = 0;
    if (r > 0)
        n = PyArray_DIM((PyArrayObject *)src[0], 0);
    int slow = r != 2;
    for (Py_ssize_t i = 0; r > 0 && i < e.w->k; i++)
        if (!source_fits(e.w, i, src[i], 1, n, &slow))
            r = 0;
    e.fresh = !slow;
    if (r > 0)
        r = lock_table(&e);
    if (r <= 0) {
        Py_DECREF(e.plan);
        return NULL;
    }
    return leave(&e, extend_locked(&e, src, n));
}

static PyMemberDef writer_members[] = {
    {"peek", T_INT, offsetof(RingWriter, peek), READONLY,
     "1 when calls run GIL-atomically while the table's lock is free (its layout probed), 0 when they take it"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RingWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replaystore._ring.RingWriter",
    .tp_basicsize = sizeof(RingWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "RingWriter(names, columns, meta, state, limiter, lock, limiter_formula): what the compiled "
              "add/extend of one ring-mode table need (built by replaystore.table.fast).",
    .tp_new = writer_new,
    .tp_traverse = (traverseproc)writer_traverse,
    .tp_clear = (inquiry)writer_clear,
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_members = writer_members,
};

/* ---- FastMethod: a method descriptor that tries the compiled path, else calls the Python one --- */

typedef PyObject *(*fastfunc)(PyObject *const *, Py_ssize_t, PyObject *);

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    fastfunc fast;
    PyObject *fallback;
    PyObject *dict;
} FastMethod;

static PyObject *
method_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FastMethod *m = (FastMethod *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs >= 2) {
        PyObject *out = m->fast(args, nargs, kwnames);
        if (out != NULL || PyErr_Occurred())
            return out;
    }
    return PyObject_Vectorcall(m->fallback, args, nargsf, kwnames);
}

static PyObject *
method_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static int
method_traverse(FastMethod *m, visitproc visit, void *arg)
{
    Py_VISIT(m->fallback);
    Py_VISIT(m->dict);
    return 0;
}

static int
method_clear(FastMethod *m)
{
    Py_CLEAR(m->fallback);
    Py_CLEAR(m->dict);
    return 0;
}

static void
method_dealloc(FastMethod *m)
{
    PyObject_GC_UnTrack(m);
    method_clear(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *
method_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    const char *which;
    PyObject *fallback;
    if (!PyArg_ParseTuple(args, "sO", &which, &fallback))
        return NULL;
    fastfunc f;
    if (strcmp(which, "add") == 0)
        f = fast_add;
    else if (strcmp(which, "extend") == 0)
        f = fast_extend;
    else {
        PyErr_SetString(PyExc_ValueError, "FastMethod: 'add' or 'extend'");
        return NULL;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "FastMethod: the fallback must be callable");
        return NULL;
    }
    FastMethod *m = (FastMethod *)type->tp_alloc(type, 0);
    if (m == NULL)
        return NULL;
    m->vectorcall = method_vectorcall;
    m->fast = f;
    Py_INCREF(fallback);
    m->fallback = fallback;
    return (PyObject *)m;
}

static PyObject *
method_repr(FastMethod *m)
{
    return PyUnicode_FromFormat("<compiled method, else %R>", m->fallback);
}

static PyGetSetDef method_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replaystore._ring.FastMethod",
    .tp_basicsize = sizeof(FastMethod),
    .tp_dictoffset = offsetof(FastMethod, dict),
    .tp_vectorcall_offset = offsetof(FastMethod, vectorcall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "FastMethod('add' | 'extend', fallback): a Table method that runs the compiled ring path when it "
              "applies and calls fallback (the Python method) otherwise.",
    .tp_new = method_new,
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = method_get,
    .tp_traverse = (traverseproc)method_traverse,
    .tp_clear = (inquiry)method_clear,
    .tp_dealloc = (destructor)method_dealloc,
    .tp_repr = (reprfunc)method_repr,
    .tp_getset = method_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ring", NULL, -1, NULL};

PyMODINIT_FUNC
PyInit__ring(void)
{
    import_array();
    if (PyType_Ready(&RingWriterType) < 0 || PyType_Ready(&FastMethodType) < 0)
        return NULL;
#define INTERN(var, s) if ((var = PyUnicode_InternFromString(s)) == NULL) return NULL
    INTERN(str_plan, "_plan");
    INTERN(str_waiting, "_waiting");
    INTERN(str_rate_limiter, "rate_limiter");
    INTERN(str_stager, "_stager");
    INTERN(str_max_staleness, "max_staleness");
    INTERN(str_priority, "priority");
    INTERN(str_version, "version");
    INTERN(str_timeout, "timeout");
    INTERN(str_priorities, "priorities");
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RingWriterType);
    Py_INCREF(&FastMethodType);
    if (PyModule_AddObject(m, "RingWriter", (PyObject *)&RingWriterType) < 0
        || PyModule_AddObject(m, "FastMethod", (PyObject *)&FastMethodType) < 0)
        return NULL;
    return m;
}
