/* replaystore.shared._sync: what a shared table's every call does in its segment's header, compiled.
 *
 * Optional: without it shared tables lock with flock() (replaystore.shared.lock) and pack their
 * state copies with struct (replaystore.shared.copies); a segment records which lock it was
 * created with, and a process without this module cannot attach to a segment that uses the
 * mutex (LockUnsupported, raised by the Python side).
 *
 * Two types:
 *
 * RobustMutex:
 * A RobustMutex wraps a pthread_mutex_t that lives in a mapped segment (PTHREAD_PROCESS_SHARED,
 * PTHREAD_MUTEX_ROBUST): when its holder dies, the kernel hands it to the next locker with
 * EOWNERDEAD, and this module marks it consistent at once; the segment's own "busy" word (set
 * by the holder while it changes anything) says whether the table needs a repair. Uncontended,
 * lock and unlock are one atomic instruction each, no system call.
 *
 * Spin, then block: a process that finds the mutex taken spins (pause instructions, the GIL
 * released) for up to the spin budget (SPIN_NS by default, set_spin() changes it) re-trying it,
 * and only then sleeps in the kernel. Critical sections of a shared table last microseconds;
 * sleeping costs far more than the wait: the futex system calls, and a core that went idle comes
 * back with cold caches (on a virtual machine the vCPU is descheduled), which doubled the CPU time
 * of the next call of a learner that slept for a writer.
 *
 * Fairness: a waiter (spinning or asleep) writes its pid into the segment's "waiting" word, and
 * every holder counts its acquisition in the "acquired" word. A holder that sees a waiter when it
 * unlocks owes it the next turn: when it next asks for the mutex it first lets the waiter in, and
 * waits (spinning HANDOFF_SPIN_NS, then napping, at most HANDOFF_NS in all) until another process
 * has taken the mutex since or nobody waits any more. Without that, a process calling back to
 * back (a learner sampling) re-takes the mutex before a waiter on another core can, and starves
 * the writers.
 *
 * StateCopies: the two copies of a table's scalar state in the header (each: generation, insert
 * intent, then the scalars, int64 or float64 words as their codes say) and the selector word saying which is
 * current. publish() fills the copy that is not current and then flips the selector (a release
 * fence first), so a reader, or a process that recovers after a writer died, finds one complete
 * copy. Same contract as the struct version in replaystore.shared.copies.
 *
 * Thread-safety: the mutex is per process-and-thread as pthread defines it; the Python side
 * (ProcessGuard) takes it from one thread at a time, under its own thread lock, and touches the
 * state copies only while it holds the mutex.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define SLICE_NS 20000000LL  /* a blocked acquire wakes every 20 ms to let Python handle signals */
#define HANDOFF_NS 200000LL  /* how long a releaser that saw a waiter lets it go first, at most */
#define HANDOFF_SPIN_NS 30000LL  /* ... spinning for the first part of it (a spinning waiter takes it in ~0.1 us) */
#define SPIN_NS 50000LL  /* default spin budget of an acquire that finds the mutex taken */

static long long spin_ns = SPIN_NS;

static inline void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

typedef struct {
    PyObject_HEAD
    Py_buffer view;             /* the segment's mapping (held for the object's life) */
    pthread_mutex_t *mutex;
    volatile int64_t *waiting;  /* the segment's "waiting" word */
    volatile int64_t *acquired; /* the segment's acquisition counter (NULL: no handoff) */
    int64_t owed;               /* the counter when this handle released with a waiter, else -1 */
    int64_t pid;
    long owner_died;            /* times this handle took the mutex from a dead holder */
} RobustMutex;

static int
get_region(PyObject *buffer, Py_ssize_t offset, Py_ssize_t waiting_offset, Py_buffer *view,
           char **base)
{
    if (PyObject_GetBuffer(buffer, view, PyBUF_WRITABLE) < 0)
        return -1;
    if (offset < 0 || offset % 64 || offset + (Py_ssize_t)sizeof(pthread_mutex_t) > view->len
        || waiting_offset < 0 || waiting_offset % 8 || waiting_offset + 8 > view->len) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "mutex or waiting word outside the buffer, or misaligned");
        return -1;
    }
    *base = (char *)view->buf;
    return 0;
}

/* init_mutex(buffer, offset): build a new robust, process-shared mutex at byte `offset`. */
static PyObject *
init_mutex(PyObject *self, PyObject *args)
{
    PyObject *buffer;
    Py_ssize_t offset;
    Py_buffer view;
    char *base;
    if (!PyArg_ParseTuple(args, "On", &buffer, &offset))
        return NULL;
    if (get_region(buffer, offset, 0, &view, &base) < 0)
        return NULL;
    pthread_mutexattr_t attr;
    int rc = pthread_mutexattr_init(&attr);
    if (!rc)
        rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    if (!rc)
        rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    if (!rc)
        rc = pthread_mutex_init((pthread_mutex_t *)(base + offset), &attr);
    pthread_mutexattr_destroy(&attr);
    PyBuffer_Release(&view);
    if (rc) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *
RobustMutex_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "offset", "waiting_offset", "pid", "acquired_offset", NULL};
    PyObject *buffer;
    Py_ssize_t offset, waiting_offset, acquired_offset = -1;
    long long pid;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnnL|n", kwlist, &buffer, &offset, &waiting_offset, &pid,
                                     &acquired_offset))
        return NULL;
    RobustMutex *self = (RobustMutex *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    char *base;
    if (get_region(buffer, offset, waiting_offset, &self->view, &base) < 0) {
        self->view.obj = NULL;
        Py_DECREF(self);
        return NULL;
    }
    self->mutex = (pthread_mutex_t *)(base + offset);
    self->waiting = (volatile int64_t *)(base + waiting_offset);
    self->acquired = NULL;
    self->owed = -1;
    if (acquired_offset >= 0) {
        if (acquired_offset % 8 || acquired_offset + 8 > self->view.len) {
            PyErr_SetString(PyExc_ValueError, "acquisition counter outside the buffer, or misaligned");
            Py_DECREF(self);
            return NULL;
        }
        self->acquired = (volatile int64_t *)(base + acquired_offset);
    }
    self->pid = pid;
    return (PyObject *)self;
}

static void
RobustMutex_dealloc(RobustMutex *self)
{
    if (self->view.obj != NULL)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 0: taken; EOWNERDEAD handled (made consistent); else the pthread error */
static int
after_lock(RobustMutex *self, int rc)
{
    if (rc == EOWNERDEAD) {
        self->owner_died++;
        return pthread_mutex_consistent(self->mutex);
    }
    return rc;
}

static long long
now_ns(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* This handle released the mutex while another process waited: let that process take it first
 * (until the counter moves, nobody waits, or HANDOFF_NS passed). */
static void
let_waiter_in(RobustMutex *self)
{
    int64_t owed = self->owed;
    self->owed = -1;
    if (!*self->waiting || *self->acquired != owed)
        return;
    long long start = now_ns(CLOCK_MONOTONIC), t = start;
    Py_BEGIN_ALLOW_THREADS
    while (*self->waiting && *self->acquired == owed && t - start < HANDOFF_NS) {
        if (t - start < HANDOFF_SPIN_NS) {
            for (int i = 0; i < 16; i++)
                cpu_relax();
        } else {
            struct timespec nap = {0, 10000L};
            nanosleep(&nap, NULL);
        }
        t = now_ns(CLOCK_MONOTONIC);
    }
    Py_END_ALLOW_THREADS
}

/* The end of an acquire whose lock call returned rc (not EBUSY): True once held and counted, or OSError. */
static PyObject *
took(RobustMutex *self, int rc)
{
    rc = after_lock(self, rc);
    if (rc) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (self->acquired)
        (*self->acquired)++;
    Py_RETURN_TRUE;
}

/* acquire(timeout) -> bool: True once held (from a dead holder too), False after `timeout` s. */
static PyObject *
RobustMutex_acquire(RobustMutex *self, PyObject *arg)
{
    if (self->owed >= 0)
        let_waiter_in(self);
    int rc = pthread_mutex_trylock(self->mutex);
    if (rc != EBUSY) {
        return took(self, rc);
    }
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    if (spin_ns > 0) {  /* spin first: the holder is most likely on another core, for microseconds */
        long long start = now_ns(CLOCK_MONOTONIC), budget = spin_ns;
        if (timeout >= 0 && timeout * 1e9 < budget)
            budget = (long long)(timeout * 1e9);
        Py_BEGIN_ALLOW_THREADS
        do {
            for (int i = 0; i < 32; i++)
                cpu_relax();
            rc = pthread_mutex_trylock(self->mutex);
        } while (rc == EBUSY && now_ns(CLOCK_MONOTONIC) - start < budget);
        Py_END_ALLOW_THREADS
        if (rc != EBUSY) {
            return took(self, rc);
        }
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    long long deadline = (long long)now.tv_sec * 1000000000LL + now.tv_nsec
                         + (long long)(timeout > 0 ? timeout * 1e9 : 0);
    for (;;) {
        *self->waiting = self->pid;
        clock_gettime(CLOCK_REALTIME, &now);
        long long t = (long long)now.tv_sec * 1000000000LL + now.tv_nsec + SLICE_NS;
        if (t > deadline)
            t = deadline;
        struct timespec until = {(time_t)(t / 1000000000LL), (long)(t % 1000000000LL)};
        Py_BEGIN_ALLOW_THREADS
        rc = pthread_mutex_timedlock(self->mutex, &until);
        Py_END_ALLOW_THREADS
        if (rc != ETIMEDOUT)
            break;
        if (t >= deadline) {
            if (*self->waiting == self->pid)
                *self->waiting = 0;
            Py_RETURN_FALSE;
        }
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
    if (*self->waiting == self->pid)
        *self->waiting = 0;
    return took(self, rc);
}

/* release(): unlock; if another process waits, yield the CPU once and owe it the next turn. */
static PyObject *
RobustMutex_release(RobustMutex *self, PyObject *Py_UNUSED(ignored))
{
    int64_t count = self->acquired ? *self->acquired : -1;
    int rc = pthread_mutex_unlock(self->mutex);
    if (rc) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (*self->waiting) {
        self->owed = count;
        sched_yield();
    }
    Py_RETURN_NONE;
}

/* set_pid(pid): the pid a waiter notes (after a fork). */
static PyObject *
RobustMutex_set_pid(RobustMutex *self, PyObject *arg)
{
    long long pid = PyLong_AsLongLong(arg);
    if (pid == -1 && PyErr_Occurred())
        return NULL;
    self->pid = pid;
    Py_RETURN_NONE;
}

static PyObject *
RobustMutex_owner_died(RobustMutex *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(self->owner_died);
}

static PyMethodDef RobustMutex_methods[] = {
    {"acquire", (PyCFunction)RobustMutex_acquire, METH_O,
     "acquire(timeout) -> bool: take the mutex (True), or False after timeout seconds."},
    {"release", (PyCFunction)RobustMutex_release, METH_NOARGS,
     "release(): unlock; yields once when another process waits."},
    {"set_pid", (PyCFunction)RobustMutex_set_pid, METH_O, "set_pid(pid): the pid a waiter notes."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef RobustMutex_getset[] = {
    {"owner_died", (getter)RobustMutex_owner_died, NULL,
     "times this handle took the mutex from a holder that had died", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject RobustMutexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replaystore.shared._sync.RobustMutex",
    .tp_basicsize = sizeof(RobustMutex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RobustMutex(buffer, offset, waiting_offset, pid): a robust process-shared mutex "
              "at byte offset of a writable buffer (see the module doc).",
    .tp_new = RobustMutex_new,
    .tp_dealloc = (destructor)RobustMutex_dealloc,
    .tp_methods = RobustMutex_methods,
    .tp_getset = RobustMutex_getset,
};

/* -- Word -------------------------------------------------------------------------------- */
/* Word(buffer, offset, code): a data descriptor whose value lives in one 8-byte word of a shared
 * buffer: an int64 (code 'q') or a float64 ('d'). Placed in a class, it stands for an attribute
 * of every instance (one class per table and process: a shared table's scalars live in its
 * segment, not in the objects). Reading returns a new int or float; writing converts (int:
 * __index__, float: __float__) and stores, or raises TypeError/OverflowError and stores nothing.
 * No lock: callers hold the table's. */
typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int64_t *word;
    char code;
} Word;

static PyObject *
Word_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "offset", "code", NULL};
    PyObject *buffer;
    Py_ssize_t offset;
    int code;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnC", kwlist, &buffer, &offset, &code))
        return NULL;
    if (code != 'q' && code != 'd') {
        PyErr_SetString(PyExc_ValueError, "Word: code is 'q' (int64) or 'd' (float64)");
        return NULL;
    }
    Word *self = (Word *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE) < 0) {
        self->view.obj = NULL;
        Py_DECREF(self);
        return NULL;
    }
    if (offset < 0 || offset % 8 || offset + 8 > self->view.len) {
        PyErr_SetString(PyExc_ValueError, "Word: the offset is outside the buffer or not 8-byte aligned");
        Py_DECREF(self);
        return NULL;
    }
    self->word = (int64_t *)((char *)self->view.buf + offset);
    self->code = (char)code;
    return (PyObject *)self;
}

static void
Word_dealloc(Word *self)
{
    if (self->view.obj != NULL)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Word_get(Word *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return (PyObject *)self;
    }
    if (self->code == 'q')
        return PyLong_FromLongLong(*self->word);
    double d;
    memcpy(&d, self->word, 8);
    return PyFloat_FromDouble(d);
}

static int
Word_set(Word *self, PyObject *obj, PyObject *value)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a shared scalar cannot be deleted");
        return -1;
    }
    if (self->code == 'q') {
        long long v;
        if (PyLong_CheckExact(value)) {
            v = PyLong_AsLongLong(value);
        } else {
            PyObject *i = PyNumber_Index(value);
            if (i == NULL)
                return -1;
            v = PyLong_AsLongLong(i);
            Py_DECREF(i);
        }
        if (v == -1 && PyErr_Occurred())
            return -1;
        *self->word = (int64_t)v;
        return 0;
    }
    double d = PyFloat_AsDouble(value);
    if (d == -1.0 && PyErr_Occurred())
        return -1;
    memcpy(self->word, &d, 8);
    return 0;
}

static PyTypeObject WordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replaystore.shared._sync.Word",
    .tp_basicsize = sizeof(Word),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Word(buffer, offset, code): a descriptor whose value is one int64 ('q') or float64 ('d') "
              "word of a shared buffer (see the module source).",
    .tp_new = Word_new,
    .tp_dealloc = (destructor)Word_dealloc,
    .tp_descr_get = (descrgetfunc)Word_get,
    .tp_descr_set = (descrsetfunc)Word_set,
};

/* -- StateCopies -------------------------------------------------------------------------- */
#define MAX_SCALARS 256

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    volatile int64_t *active;   /* the selector word: bit 0 says which copy is current */
    char *copy[2];              /* each: gen, intent, then one word per scalar */
    Py_ssize_t n;               /* scalars */
    char codes[MAX_SCALARS];    /* 'q' (int64) or 'd' (float64) per scalar */
} StateCopies;

static PyObject *
StateCopies_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "active_offset", "copy_offset", "copy_stride", "codes", NULL};
    PyObject *buffer;
    Py_ssize_t active_offset, copy_offset, stride, n;
    const char *codes;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Onnns#", kwlist, &buffer, &active_offset, &copy_offset,
                                     &stride, &codes, &n))
        return NULL;
    if (n > MAX_SCALARS || stride < 8 * (2 + n) || strspn(codes, "qd") != (size_t)n) {
        PyErr_SetString(PyExc_ValueError, "bad state copy layout (codes are 'q' or 'd', one per scalar)");
        return NULL;
    }
    StateCopies *self = (StateCopies *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE) < 0) {
        self->view.obj = NULL;
        Py_DECREF(self);
        return NULL;
    }
    if (active_offset < 0 || active_offset % 8 || active_offset + 8 > self->view.len || copy_offset < 0
        || copy_offset % 8 || stride % 8 || copy_offset + 2 * stride > self->view.len) {
        PyErr_SetString(PyExc_ValueError, "state copies outside the buffer, or misaligned");
        Py_DECREF(self);
        return NULL;
    }
    char *base = (char *)self->view.buf;
    self->active = (volatile int64_t *)(base + active_offset);
    self->copy[0] = base + copy_offset;
    self->copy[1] = base + copy_offset + stride;
    self->n = n;
    memcpy(self->codes, codes, n);
    return (PyObject *)self;
}

static void
StateCopies_dealloc(StateCopies *self)
{
    if (self->view.obj != NULL)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* read() -> (generation, intent, values): the current copy. */
static PyObject *
StateCopies_read(StateCopies *self, PyObject *Py_UNUSED(ignored))
{
    const char *c = self->copy[*self->active & 1];
    int64_t words[2 + MAX_SCALARS];
    memcpy(words, c, 8 * (2 + self->n));
    PyObject *values = PyTuple_New(self->n);
    if (values == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        PyObject *v;
        if (self->codes[i] == 'q') {
            v = PyLong_FromLongLong(words[2 + i]);
        } else {
            double d;
            memcpy(&d, &words[2 + i], 8);
            v = PyFloat_FromDouble(d);
        }
        if (v == NULL) {
            Py_DECREF(values);
            return NULL;
        }
        PyTuple_SET_ITEM(values, i, v);
    }
    return Py_BuildValue("(LLN)", (long long)words[0], (long long)words[1], values);
}

/* publish(generation, values): write the copy that is not current (intent 0), then flip. */
static PyObject *
StateCopies_publish(StateCopies *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "publish(generation, values: tuple)");
        return NULL;
    }
    PyObject *values = args[1];
    Py_ssize_t n = self->n;
    if (PyTuple_GET_SIZE(values) != n) {
        PyErr_Format(PyExc_ValueError, "publish: %zd values, the state has %zd", PyTuple_GET_SIZE(values), n);
        return NULL;
    }
    int64_t words[2 + MAX_SCALARS];
    words[0] = PyLong_AsLongLong(args[0]);
    if (words[0] == -1 && PyErr_Occurred())
        return NULL;
    words[1] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(values, i);
        if (self->codes[i] == 'q') {
            if (PyFloat_Check(v)) {  /* as struct: an integer field takes no float */
                PyErr_Format(PyExc_TypeError, "publish: value %zd is a float, the state wants an integer", i);
                return NULL;
            }
            long long x = PyLong_AsLongLong(v);
            if (x == -1 && PyErr_Occurred())
                return NULL;
            words[2 + i] = x;
        } else {
            double d = PyFloat_AsDouble(v);
            if (d == -1.0 && PyErr_Occurred())
                return NULL;
            memcpy(&words[2 + i], &d, 8);
        }
    }
    int other = (int)((*self->active & 1) ^ 1);
    memcpy(self->copy[other], words, 8 * (2 + n));
    __atomic_thread_fence(__ATOMIC_RELEASE);
    *self->active = other;
    Py_RETURN_NONE;
}

/* generation() -> the current copy's generation. */
static PyObject *
StateCopies_generation(StateCopies *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(*(volatile int64_t *)self->copy[*self->active & 1]);
}

/* set_intent(n): the current copy's insert intent. */
static PyObject *
StateCopies_set_intent(StateCopies *self, PyObject *arg)
{
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    ((volatile int64_t *)self->copy[*self->active & 1])[1] = n;
    Py_RETURN_NONE;
}

/* commit(words, generation) -> bool: publish the scalars that live in `words` (a buffer of at
 * least n int64 words: a placed table's scalars) if they differ from the current copy's: write
 * the other copy (generation, intent 0, the words), then make it current; True if it did. */
static PyObject *
StateCopies_commit(StateCopies *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "commit(words, generation)");
        return NULL;
    }
    long long gen = PyLong_AsLongLong(args[1]);
    if (gen == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer w;
    if (PyObject_GetBuffer(args[0], &w, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    Py_ssize_t n = self->n;
    if (w.itemsize != 8 || w.len < 8 * n) {
        PyBuffer_Release(&w);
        PyErr_Format(PyExc_ValueError, "commit: an int64 buffer of at least %zd words", n);
        return NULL;
    }
    const char *current = self->copy[*self->active & 1];
    int changed = memcmp(current + 16, w.buf, 8 * n) != 0;
    if (changed) {
        int other = (int)((*self->active & 1) ^ 1);
        int64_t head[2] = {(int64_t)gen, 0};
        memcpy(self->copy[other], head, 16);
        memcpy(self->copy[other] + 16, w.buf, 8 * n);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        *self->active = other;
    }
    PyBuffer_Release(&w);
    return PyBool_FromLong(changed);
}

static PyMethodDef StateCopies_methods[] = {
    {"read", (PyCFunction)StateCopies_read, METH_NOARGS,
     "read() -> (generation, intent, values): the current copy."},
    {"publish", (PyCFunction)(void (*)(void))StateCopies_publish, METH_FASTCALL,
     "publish(generation, values): write the other copy (intent 0), then make it current."},
    {"generation", (PyCFunction)StateCopies_generation, METH_NOARGS, "generation(): the current copy's."},
    {"set_intent", (PyCFunction)StateCopies_set_intent, METH_O, "set_intent(n): the current copy's intent."},
    {"commit", (PyCFunction)(void (*)(void))StateCopies_commit, METH_FASTCALL,
     "commit(words, generation) -> bool: publish the scalars in words (as publish) if they changed."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject StateCopiesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replaystore.shared._sync.StateCopies",
    .tp_basicsize = sizeof(StateCopies),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "StateCopies(buffer, active_offset, copy_offset, copy_stride, codes): the two state copies "
              "of a segment header, one 'q' (int64) or 'd' (float64) code per scalar (see the module doc).",
    .tp_new = StateCopies_new,
    .tp_dealloc = (destructor)StateCopies_dealloc,
    .tp_methods = StateCopies_methods,
};

/* -- a critical section's entry and exit, in one call each (mutex tables whose scalars live in
 * the segment: replaystore.shared.guard) ------------------------------------------------------ */

/* enter_section(mutex, timeout, busy_word, copies, generation, intent) -> int
 *
 * Take `mutex` (RobustMutex.acquire: spin, then sleep, at most `timeout` s; from a dead holder
 * too). Returns -1 when the timeout passed (nothing held). 1 when the header's busy word (word
 * `busy_word` of the mutex's buffer) is still set: the previous holder died inside; the mutex is
 * held and nothing else was done (the caller repairs the table, then sets the busy word and the
 * intent itself). Otherwise the busy word is set to this handle's pid (ordered before the
 * section's writes: see set_word), the current state copy's intent to `intent` when nonzero, and
 * the result is 2 when the copies' generation is not `generation` (another process committed
 * since), else 0. */
static PyObject *
enter_section(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyObject_TypeCheck(args[0], &RobustMutexType)
        || !PyObject_TypeCheck(args[3], &StateCopiesType)) {
        PyErr_SetString(PyExc_TypeError,
                        "enter_section(mutex: RobustMutex, timeout, busy_word, copies: StateCopies, generation, intent)");
        return NULL;
    }
    RobustMutex *m = (RobustMutex *)args[0];
    StateCopies *c = (StateCopies *)args[3];
    Py_ssize_t busy = PyLong_AsSsize_t(args[2]);
    long long gen = PyLong_AsLongLong(args[4]), intent = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (busy < 0 || 8 * (busy + 1) > m->view.len) {
        PyErr_SetString(PyExc_ValueError, "enter_section: the busy word is outside the mutex's buffer");
        return NULL;
    }
    PyObject *taken = RobustMutex_acquire(m, args[1]);
    if (taken == NULL)
        return NULL;
    int held = taken == Py_True;
    Py_DECREF(taken);
    if (!held)
        return PyLong_FromLong(-1);
    int64_t *word = (int64_t *)m->view.buf + busy;
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != 0)
        return PyLong_FromLong(1);
    __atomic_store_n(word, (int64_t)m->pid, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    volatile int64_t *current = (volatile int64_t *)c->copy[*c->active & 1];
    if (intent)
        current[1] = intent;
    return PyLong_FromLong(current[0] != gen ? 2 : 0);
}

/* leave_section(mutex, busy_word, unordered_word, copies, words, generation, intent, victims) -> int: the
 * generation now.
 *
 * Commit the scalars in `words` (StateCopies.commit, generation + 1) when they changed, else
 * reset the current copy's intent when `intent` was set; then, when `victims` is not None, set
 * its word 0 to 0 (the section's notes of slots it overwrote: void once committed); clear the
 * unordered word, then the busy word (ordered after the section's writes); release `mutex`
 * (RobustMutex.release).
 * Returns generation + 1 if it committed, else generation. The mutex is released even when an
 * argument is refused. */
static PyObject *
leave_section(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyObject_TypeCheck(args[0], &RobustMutexType)
        || !PyObject_TypeCheck(args[3], &StateCopiesType)) {
        PyErr_SetString(PyExc_TypeError, "leave_section(mutex: RobustMutex, busy_word, unordered_word, "
                                         "copies: StateCopies, words, generation, intent, victims)");
        return NULL;
    }
    RobustMutex *m = (RobustMutex *)args[0];
    StateCopies *c = (StateCopies *)args[3];
    Py_ssize_t busy = PyLong_AsSsize_t(args[1]), unordered = PyLong_AsSsize_t(args[2]);
    long long gen = PyLong_AsLongLong(args[5]), intent = PyLong_AsLongLong(args[6]);
    PyObject *result = NULL;
    if (!PyErr_Occurred() && busy >= 0 && 8 * (busy + 1) <= m->view.len && unordered >= 0
        && 8 * (unordered + 1) <= m->view.len) {
        PyObject *gen_obj = PyLong_FromLongLong(gen + 1);
        PyObject *commit_args[2] = {args[4], gen_obj};
        PyObject *changed = gen_obj == NULL ? NULL : StateCopies_commit(c, commit_args, 2);
        Py_XDECREF(gen_obj);
        if (changed != NULL) {
            if (changed == Py_True)
                gen += 1;
            else if (intent)
                ((volatile int64_t *)c->copy[*c->active & 1])[1] = 0;
            Py_DECREF(changed);
            result = PyLong_FromLongLong(gen);
            if (args[7] != Py_None) {
                Py_buffer v;
                if (PyObject_GetBuffer(args[7], &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
                    Py_CLEAR(result);
                } else {
                    if (v.len >= 8)
                        *(volatile int64_t *)v.buf = 0;
                    PyBuffer_Release(&v);
                }
            }
        }
        __atomic_store_n((int64_t *)m->view.buf + unordered, 0, __ATOMIC_RELEASE);
        __atomic_store_n((int64_t *)m->view.buf + busy, 0, __ATOMIC_RELEASE);
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "leave_section: the busy or unordered word is outside the mutex's buffer");
    }
    PyObject *released = RobustMutex_release(m, NULL);
    if (released == NULL) {
        Py_XDECREF(result);
        return NULL;
    }
    Py_DECREF(released);
    return result;
}

/* set_spin(ns) -> the previous budget: how long an acquire spins before it sleeps (0: never spins). */
static PyObject *
set_spin(PyObject *self, PyObject *arg)
{
    long long ns = PyLong_AsLongLong(arg);
    if (ns == -1 && PyErr_Occurred())
        return NULL;
    if (ns < 0) {
        PyErr_SetString(PyExc_ValueError, "the spin budget is a number of nanoseconds >= 0");
        return NULL;
    }
    long long old = spin_ns;
    spin_ns = ns;
    return PyLong_FromLongLong(old);
}

/* fence(): a full memory barrier (orders this process's loads and stores before it against those after). */
static PyObject *
fence(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

/* set_word(words, index, value): words[index] = value, ordered after every earlier store of this
 * process and before every later one (a release store, then a release fence: free on x86, a
 * barrier on weaker machines). The lock's holder sets the busy word with it (see keys_settled). */
static PyObject *
set_word(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "set_word(words, index, value)");
        return NULL;
    }
    Py_ssize_t index = PyLong_AsSsize_t(args[1]);
    long long value = PyLong_AsLongLong(args[2]);
    if ((index == -1 || value == -1) && PyErr_Occurred())
        return NULL;
    Py_buffer w;
    if (PyObject_GetBuffer(args[0], &w, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    int ok = w.itemsize == 8 && index >= 0 && index < w.len / 8;
    if (ok) {
        __atomic_store_n((int64_t *)w.buf + index, (int64_t)value, __ATOMIC_RELEASE);
        __atomic_thread_fence(__ATOMIC_RELEASE);
    }
    PyBuffer_Release(&w);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "set_word: a writable int64 buffer and an index within it");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* keys_settled(words, busy_word, acquired_word, unordered_word, hi_word, key_column, slots, rows) -> bool:
 * may a copy made outside the lock be kept?
 *
 * A sample draws under the lock (rows: the drawn slots' sample rows, key in column 0), releases
 * it and copies the payloads. Every payload write happens inside the lock, with the header's busy
 * word set (set_word) for the whole critical section (or, a ring reservation, after its section
 * published written_hi), and gives each slot it writes a key no slot ever had. In ring mode the
 * keys are implicit (slot s holds key lo + (s - (lo - base)) mod capacity) and every write first
 * raises the header's written_hi word (one past the newest key whose row it begins; a release
 * fence before the payload; a removal of the oldest items raises it to ring_lo + capacity): key
 * k's slot is rewritten only by key k + capacity or later, so a copy of key k is whole (and its
 * item not removed) while k >= written_hi - capacity. When ring mode ends the table writes
 * the live keys out to its key column and sets written_hi to -1; from then on each write keeps
 * the key column (a free slot -1) and the check is that column's key. The general insert writes
 * rows before its keys and sets the header's unordered word first. So after the copy: a full
 * fence; if no section is open (busy word 0), or the open one writes in order only (unordered
 * word 0), every write the copy may have seen shows now; if the open section writes rows before
 * keys, spin (the GIL released, at most this process's spin budget) until it is over (the busy
 * word clears, or the acquisition counter moves: another section began after it). Then the copy
 * is whole if each drawn key passes the check above. Returns False when one does not or the
 * section outlasted the spin: the caller finishes under the lock. Raises ValueError for buffers
 * that do not fit (int64 words holding the four words, a (capacity,) int64 key column, slots
 * within it, (len(slots), 4) rows). Thread-safe; writes nothing. The key column is read only
 * when written_hi is -1 (in ring mode it may be a hole of the segment). */
static PyObject *
keys_settled(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "keys_settled(words, busy_word, acquired_word, unordered_word, hi_word, key_column, slots, rows)");
        return NULL;
    }
    Py_ssize_t busy = PyLong_AsSsize_t(args[1]), acq = PyLong_AsSsize_t(args[2]), unord = PyLong_AsSsize_t(args[3]);
    Py_ssize_t hiw = PyLong_AsSsize_t(args[4]);
    if ((busy == -1 || acq == -1 || unord == -1 || hiw == -1) && PyErr_Occurred())
        return NULL;
    Py_buffer w, m, s, r;
    if (PyObject_GetBuffer(args[0], &w, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[5], &m, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&w);
        return NULL;
    }
    if (PyObject_GetBuffer(args[6], &s, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&m);
        PyBuffer_Release(&w);
        return NULL;
    }
    if (PyObject_GetBuffer(args[7], &r, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&s);
        PyBuffer_Release(&m);
        PyBuffer_Release(&w);
        return NULL;
    }
    Py_ssize_t cap = m.len / 8, n = s.len / 8, nwords = w.len / 8;
    int ok = w.itemsize == 8 && busy >= 0 && busy < nwords && acq >= 0 && acq < nwords && unord >= 0
             && unord < nwords && hiw >= 0 && hiw < nwords && m.itemsize == 8 && m.ndim == 1 && cap > 0
             && s.itemsize == 8 && r.itemsize == 8 && r.ndim == 2 && r.shape[1] == 4 && r.len == 32 * n;
    const int64_t *slots = (const int64_t *)s.buf;
    for (Py_ssize_t i = 0; ok && i < n; i++)
        if (slots[i] < 0 || slots[i] >= cap)
            ok = 0;
    int settled = 0;
    if (ok) {
        const int64_t *busy_w = (const int64_t *)w.buf + busy, *acq_w = (const int64_t *)w.buf + acq;
        __atomic_thread_fence(__ATOMIC_SEQ_CST); /* the copy's loads are done */
        settled = __atomic_load_n(busy_w, __ATOMIC_ACQUIRE) == 0
                  || __atomic_load_n((const int64_t *)w.buf + unord, __ATOMIC_ACQUIRE) == 0;
        if (!settled && spin_ns > 0) { /* a section writing rows before keys is open: wait for its end */
            int64_t count = __atomic_load_n(acq_w, __ATOMIC_ACQUIRE);
            long long start = now_ns(CLOCK_MONOTONIC);
            Py_BEGIN_ALLOW_THREADS
            do {
                for (int i = 0; i < 32; i++)
                    cpu_relax();
                settled = __atomic_load_n(busy_w, __ATOMIC_ACQUIRE) == 0
                          || __atomic_load_n(acq_w, __ATOMIC_ACQUIRE) != count;
            } while (!settled && now_ns(CLOCK_MONOTONIC) - start < spin_ns);
            Py_END_ALLOW_THREADS
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
        }
        const int64_t *rows = (const int64_t *)r.buf;
        int64_t hi = settled ? __atomic_load_n((const int64_t *)w.buf + hiw, __ATOMIC_ACQUIRE) : 0;
        if (hi >= 0) { /* ring mode: key k's slot is not rewritten while k >= written_hi - capacity */
            for (Py_ssize_t i = 0; settled && i < n; i++)
                if (rows[4 * i] < hi - (int64_t)cap)
                    settled = 0;
        } else { /* out of ring mode: the key column */
            const int64_t *keys = (const int64_t *)m.buf;
            for (Py_ssize_t i = 0; settled && i < n; i++)
                if (__atomic_load_n(keys + slots[i], __ATOMIC_RELAXED) != rows[4 * i])
                    settled = 0;
        }
    }
    PyBuffer_Release(&r);
    PyBuffer_Release(&s);
    PyBuffer_Release(&m);
    PyBuffer_Release(&w);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError,
                        "keys_settled: int64 words holding the busy, acquisition, unordered and written_hi words, "
                        "a (capacity,) int64 key column, int64 slots within it, 4 int64 rows per slot");
        return NULL;
    }
    return PyBool_FromLong(settled);
}

/* -- RingInserter: a ring-mode shared table's small extend, one critical section in one call ------
 *
 * Built only with NumPy's headers (RS_WITH_NUMPY; setup.py defines it when NumPy is there).
 *
 * RingInserter(mutex, copies, words, slots, capacity, max_rows, header_words, limits, names,
 *              columns, meta, timeout)
 *
 * What Table._extend_ring / _ring_commit do for a table with no selector to tell (a Uniform
 * sampler, the Fifo remover) in ring mode, with the section's entry and exit (as enter_section and
 * leave_section do them, on the raw words) around it and the Python levels of the lock
 * (ProcessGuard) left out. The protocol is the Python path's: the batch is checked before the lock (a dict of exactly the
 * columns' `names`, each an ndarray of the column's dtype and row shape, C-contiguous, the same
 * length n, 1 <= n <= max_rows), the section is opened with the insert's intent n (a process
 * killed inside is recovered as one killed in the Python path), the header's written_hi word
 * becomes one past the batch's last key before any row is written (a release fence between:
 * samples that copy outside the lock check their keys against it; the keys themselves are
 * implicit in ring mode), the new metadata rows (`meta`: the table's (capacity, 2) or
 * (capacity, 1) int64 rows, written as replaystore.rows' fill_meta does: (times sampled 0,
 * version) as int32, priority bits) and the payload rows are written, the scalars
 * are the segment's words (`words`: the scalars region; `slots`: bytes of 15 native int64 word
 * indices in the order of the S_ and L_ names below), and leaving commits the state copy.
 * `header_words`: (busy, unordered, reserved, written_hi) word indices of the mutex's buffer; `limits`:
 * (limited, samples_per_insert, max_diff) of a RateLimiter whose can_insert is the base formula.
 *
 * insert(guard, data) -> the items' keys (int64 array) when the batch went in (the `generation`
 * member and `guard._gen` are then the state's generation); otherwise an int and nothing changed:
 * -1 not taken here (the lock is free: the caller's Python path decides; e.g. other data, ring
 * mode over, a reservation open, a limiter that would block, a wrap-around, this thread inside
 * the guard already, `guard._depth`), -2 the previous holder died inside (the mutex is HELD,
 * nothing else done: the caller repairs the table, as enter_section's 1 says), -3 the lock timed
 * out.
 * add(guard, item): the same for one row (its key an int, >= 0), `item` a dict of rows (an ndarray of the row shape, a
 * NumPy scalar of the column's dtype, a Python bool/int/float a 0-d number column takes as is).
 * Thread-safety: any thread, without the ProcessGuard's thread lock (see ring_insert_guarded). */
#ifdef RS_WITH_NUMPY
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <structmember.h>

enum { S_NEXT, S_BASE, S_LO, S_HI, S_SIZE, S_NFREE, S_INSERTS, S_DELETES, S_EVICTIONS, S_VERSION,
       S_MAXPRIO, S_RINGMODE, L_INSERTS, L_SAMPLES, L_DELETES, N_RING_WORDS };
#define MAX_RING_COLUMNS 32
#define RING_META_W 2 /* replaystore.rows.META_WIDTH: (times sampled, version) as int32, priority bits (no key) */

typedef struct {
    PyObject_HEAD
    PyObject *mutex, *copies, *words_obj, *names, *columns, *meta, *timeout;
    PyObject *busy_obj, *unordered_obj;
    Py_buffer words;
    int64_t *meta_rows;
    Py_ssize_t meta_w;  /* RING_META_W, or RING_META_W - 1 (no priority word) */
    int64_t *w[N_RING_WORDS];
    long long capacity, max_rows, generation;
    Py_ssize_t busy, unordered, reserved, written_hi, ncols;
    int limited;
    double spi, max_diff;
    PyArrayObject *col[MAX_RING_COLUMNS];
    Py_ssize_t rowbytes[MAX_RING_COLUMNS];
} RingInserter;

static void
RingInserter_dealloc(RingInserter *self)
{
    if (self->words.obj != NULL)
        PyBuffer_Release(&self->words);
    Py_XDECREF(self->mutex);
    Py_XDECREF(self->copies);
    Py_XDECREF(self->words_obj);
    Py_XDECREF(self->names);
    Py_XDECREF(self->columns);
    Py_XDECREF(self->meta);
    Py_XDECREF(self->timeout);
    Py_XDECREF(self->busy_obj);
    Py_XDECREF(self->unordered_obj);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
RingInserter_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *mutex, *copies, *words, *names, *columns, *meta, *timeout;
    Py_buffer slots;
    long long capacity, max_rows;
    Py_ssize_t busy, unordered, reserved, written_hi;
    int limited;
    double spi, max_diff;
    if (!PyArg_ParseTuple(args, "O!O!Oy*LL(nnnn)(pdd)O!O!OO", &RobustMutexType, &mutex, &StateCopiesType, &copies,
                          &words, &slots, &capacity, &max_rows, &busy, &unordered, &reserved, &written_hi, &limited, &spi,
                          &max_diff, &PyTuple_Type, &names, &PyTuple_Type, &columns, &meta, &timeout))
        return NULL;
    RingInserter *self = (RingInserter *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyBuffer_Release(&slots);
        return NULL;
    }
    if (PyObject_GetBuffer(words, &self->words, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        self->words.obj = NULL;
        PyBuffer_Release(&slots);
        Py_DECREF(self);
        return NULL;
    }
    RobustMutex *m = (RobustMutex *)mutex;
    Py_ssize_t nwords = self->words.len / 8, ncols = PyTuple_GET_SIZE(columns);
    int ok = slots.len == 8 * N_RING_WORDS && self->words.len >= 8 * ((StateCopies *)copies)->n && capacity > 0 && max_rows >= 0 && busy >= 0 && unordered >= 0
             && reserved >= 0 && 8 * (busy + 1) <= m->view.len && 8 * (unordered + 1) <= m->view.len
             && 8 * (reserved + 1) <= m->view.len && written_hi >= 0 && 8 * (written_hi + 1) <= m->view.len
             && ncols > 0 && ncols <= MAX_RING_COLUMNS
             && PyTuple_GET_SIZE(names) == ncols;
    if (ok) {  /* the metadata rows: a writable C-contiguous (capacity, 2) or (capacity, 1) int64 array */
        PyArrayObject *ma = (PyArrayObject *)meta;
        ok = PyArray_Check(meta) && PyArray_NDIM(ma) == 2 && PyArray_DIM(ma, 0) == capacity
             && (PyArray_DIM(ma, 1) == RING_META_W || PyArray_DIM(ma, 1) == RING_META_W - 1)
             && PyArray_TYPE(ma) == NPY_INT64 && PyArray_IS_C_CONTIGUOUS(ma)
             && PyArray_ISWRITEABLE(ma);
        self->meta_rows = ok ? (int64_t *)PyArray_DATA(ma) : NULL;
        self->meta_w = ok ? PyArray_DIM(ma, 1) : RING_META_W;
    }
    for (int i = 0; ok && i < N_RING_WORDS; i++) {
        int64_t k;
        memcpy(&k, (char *)slots.buf + 8 * i, 8);
        if (k < 0 || k >= nwords)
            ok = 0;
        else
            self->w[i] = (int64_t *)self->words.buf + k;
    }
    for (Py_ssize_t i = 0; ok && i < ncols; i++) {
        PyObject *col = PyTuple_GET_ITEM(columns, i);
        if (!PyArray_Check(col) || !PyUnicode_CheckExact(PyTuple_GET_ITEM(names, i)))
            ok = 0;
        else {
            PyArrayObject *a = (PyArrayObject *)col;
            ok = PyArray_NDIM(a) >= 1 && PyArray_DIM(a, 0) == capacity && PyArray_IS_C_CONTIGUOUS(a)
                 && PyArray_ISWRITEABLE(a);
            self->col[i] = a;
            self->rowbytes[i] = ok ? PyArray_NBYTES(a) / capacity : 0;
        }
    }
    PyBuffer_Release(&slots);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "RingInserter: word indices outside the buffers, a bad capacity, or "
                                          "columns or meta that are not writable C-contiguous arrays of "
                                          "`capacity` rows (meta: (capacity, 2) or (capacity, 1) int64)");
        Py_DECREF(self);
        return NULL;
    }
    self->busy_obj = PyLong_FromSsize_t(busy);
    self->unordered_obj = PyLong_FromSsize_t(unordered);
    if (self->busy_obj == NULL || self->unordered_obj == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->capacity = capacity;
    self->max_rows = max_rows < capacity ? max_rows : capacity;
    self->busy = busy;
    self->unordered = unordered;
    self->reserved = reserved;
    self->written_hi = written_hi;
    self->ncols = ncols;
    self->limited = limited;
    self->spi = spi;
    self->max_diff = max_diff;
    PyObject **own[] = {&self->mutex, &self->copies, &self->words_obj, &self->names,
                        &self->columns, &self->meta, &self->timeout};
    PyObject *vals[] = {mutex, copies, words, names, columns, meta, timeout};
    for (int i = 0; i < 7; i++) {
        Py_INCREF(vals[i]);
        *own[i] = vals[i];
    }
    return (PyObject *)self;
}

/* leave the section as leave_section(mutex, busy, unordered, copies, words, gen, intent, None) does,
 * on the raw words (no argument objects, no buffer request): commit the words when they changed
 * (generation + 1), else clear the intent; clear the unordered word, then the busy word; release. */
static PyObject *
ring_leave(RingInserter *self, long long gen, long long intent)
{
    RobustMutex *m = (RobustMutex *)self->mutex;
    StateCopies *c = (StateCopies *)self->copies;
    Py_ssize_t n = c->n;
    const char *current = c->copy[*c->active & 1];
    if (memcmp(current + 16, self->words.buf, 8 * n) != 0) {  /* (StateCopies_commit) */
        int other = (int)((*c->active & 1) ^ 1);
        int64_t head[2] = {(int64_t)(gen + 1), 0};
        memcpy(c->copy[other], head, 16);
        memcpy(c->copy[other] + 16, self->words.buf, 8 * n);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        *c->active = other;
        gen += 1;
    } else if (intent) {
        ((volatile int64_t *)current)[1] = 0;
    }
    __atomic_store_n((int64_t *)m->view.buf + self->unordered, 0, __ATOMIC_RELEASE);
    __atomic_store_n((int64_t *)m->view.buf + self->busy, 0, __ATOMIC_RELEASE);
    PyObject *released = RobustMutex_release(m, NULL);
    if (released == NULL)
        return NULL;
    Py_DECREF(released);
    return PyLong_FromLongLong(gen);
}

/* leave a section that changed nothing: -1 (not taken), or NULL */
static PyObject *
ring_bail(RingInserter *self, long long gen, long long n)
{
    PyObject *r = ring_leave(self, gen, n);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    return PyLong_FromLong(-1);
}

static PyObject *ring_insert_locked(RingInserter *self, const char **src, npy_intp n);

static PyObject *str_depth, *str_gen;

/* Unless this thread is inside the guard already (`guard._depth`: the mutex is its own, a wait would
 * never end): the insert, then `guard._gen` = the new generation; -1 when inside (nothing done).
 *
 * The guard's thread lock is not taken: the mutex alone keeps the section whole. Another thread
 * of this process is either outside (its depth 0; then its entry and ours contend for the mutex
 * like two processes' entries, and whichever comes second finds the generation moved, as after
 * another process's commit), or inside holding the mutex (we wait for it, with the GIL released),
 * or in a wait with the mutex released (its depth is 0 meanwhile, as for any entry). A stale
 * `guard._gen` only makes the next entry catch up (ProcessGuard._enter_live). */
static PyObject *
ring_insert_guarded(RingInserter *self, PyObject *guard, const char **src, npy_intp n)
{
    PyObject *depth = PyObject_GetAttr(guard, str_depth);
    if (depth == NULL)
        return NULL;
    int inside = PyObject_IsTrue(depth);
    Py_DECREF(depth);
    if (inside)
        return inside < 0 ? NULL : PyLong_FromLong(-1);
    PyObject *out = ring_insert_locked(self, src, n);
    if (out != NULL && PyArray_CheckExact(out)) {
        PyObject *g = PyLong_FromLongLong(self->generation);
        if (g == NULL || PyObject_SetAttr(guard, str_gen, g) < 0)
            Py_CLEAR(out);  /* (no memory: the insert is in; the next entry catches up, as after another process) */
        Py_XDECREF(g);
    }
    return out;
}

/* Check one source against column i; its first row's address, or NULL (not for the compiled path).
 * batched: an ndarray (n, *row shape); else a row: an ndarray of the row shape, a NumPy scalar of
 * the column's dtype or a Python bool/int/float for a 0-d number column (written into `scratch`). */
static const char *
ring_source(RingInserter *self, Py_ssize_t i, PyObject *v, int batched, npy_intp *n, char *scratch)
{
    PyArrayObject *col = self->col[i];
    int nd = PyArray_NDIM(col), skip = batched ? 0 : 1;
    if (PyArray_CheckExact(v)) {
        PyArrayObject *a = (PyArrayObject *)v;
        if (PyArray_NDIM(a) != nd - skip || !PyArray_IS_C_CONTIGUOUS(a)
            || !PyArray_EquivTypes(PyArray_DESCR(a), PyArray_DESCR(col)))
            return NULL;
        if (batched) {
            if (*n < 0)
                *n = PyArray_DIM(a, 0);
            if (PyArray_DIM(a, 0) != *n)
                return NULL;
        }
        for (int d = 1; d < nd; d++)
            if (PyArray_DIM(a, d - skip) != PyArray_DIM(col, d))
                return NULL;
        return PyArray_DATA(a);
    }
    if (batched || nd != 1 || self->rowbytes[i] > 16)
        return NULL;
    if (PyArray_IsScalar(v, Generic)) {
        PyArray_Descr *d = PyArray_DescrFromScalar(v);
        int same = d != NULL && PyArray_EquivTypes(d, PyArray_DESCR(col));
        Py_XDECREF(d);
        if (!same)
            return NULL;
        PyArray_ScalarAsCtype(v, scratch);
        return scratch;
    }
    int t = PyArray_TYPE(col);
    if (PyBool_Check(v)) {
        if (t != NPY_BOOL)
            return NULL;
        *(npy_bool *)scratch = v == Py_True;
        return scratch;
    }
    if (PyFloat_CheckExact(v) || PyLong_CheckExact(v)) {
        if (t == NPY_FLOAT64 || t == NPY_FLOAT32) {
            double x = PyFloat_CheckExact(v) ? PyFloat_AS_DOUBLE(v) : PyLong_AsDouble(v);
            if (x == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                return NULL;
            }
            if (t == NPY_FLOAT64) {
                *(double *)scratch = x;
                return scratch;
            }
            /* NumPy refuses (OverflowError) a finite value beyond float32's range: let it say so */
            if (x == x && x != Py_HUGE_VAL && x != -Py_HUGE_VAL && (x > 3.4028234663852886e38 || x < -3.4028234663852886e38))
                return NULL;
            *(float *)scratch = (float)x;
            return scratch;
        }
        if (PyFloat_CheckExact(v) || (t != NPY_INT64 && t != NPY_INT32))
            return NULL;
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return NULL;
        }
        if (t == NPY_INT64) {
            *(int64_t *)scratch = x;
            return scratch;
        }
        if (x < INT32_MIN || x > INT32_MAX)
            return NULL;
        *(int32_t *)scratch = (int32_t)x;
        return scratch;
    }
    return NULL;
}

/* insert(guard, data) / add(guard, item): see the type's comment */
static PyObject *
ring_call(RingInserter *self, PyObject *const *args, Py_ssize_t nargs, int batched)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, batched ? "insert(guard, data)" : "add(guard, item)");
        return NULL;
    }
    PyObject *data = args[1];
    Py_ssize_t ncols = self->ncols;
    if (!PyDict_CheckExact(data) || PyDict_GET_SIZE(data) != ncols)
        return PyLong_FromLong(-1);
    PyObject *held[MAX_RING_COLUMNS];
    const char *src[MAX_RING_COLUMNS];
    char scratch[MAX_RING_COLUMNS][16];
    npy_intp n = batched ? -1 : 1;
    Py_ssize_t got = 0;
    int ok = 1;
    for (; got < ncols; got++) {  /* (every name present: the dict's keys are the names) */
        PyObject *v = PyDict_GetItemWithError(data, PyTuple_GET_ITEM(self->names, got));
        if (v == NULL || (src[got] = ring_source(self, got, v, batched, &n, scratch[got])) == NULL) {
            ok = 0;
            break;
        }
        Py_INCREF(v);  /* (held across the wait for the lock, whose spin and sleep release the GIL) */
        held[got] = v;
    }
    PyObject *out;
    if (PyErr_Occurred())
        out = NULL;
    else if (!ok || n < 1 || n > self->max_rows)
        out = PyLong_FromLong(-1);
    else
        out = ring_insert_guarded(self, args[0], src, n);
    for (Py_ssize_t i = 0; i < got; i++)
        Py_DECREF(held[i]);
    return out;
}

static PyObject *
RingInserter_insert(RingInserter *self, PyObject *const *args, Py_ssize_t nargs)
{
    return ring_call(self, args, nargs, 1);
}

static PyObject *
RingInserter_add(RingInserter *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *out = ring_call(self, args, nargs, 0);
    if (out == NULL || !PyArray_CheckExact(out))
        return out;
    PyObject *key = PyLong_FromLongLong(((int64_t *)PyArray_DATA((PyArrayObject *)out))[0]);
    Py_DECREF(out);
    return key;  /* (NULL, no memory: the item is in, as for insert's keys) */
}

static PyObject *
ring_insert_locked(RingInserter *self, const char **src, npy_intp n)
{
    /* enter_section(mutex, timeout, busy, copies, generation, n), on the raw words */
    RobustMutex *mx = (RobustMutex *)self->mutex;
    PyObject *taken = RobustMutex_acquire(mx, self->timeout);
    if (taken == NULL)
        return NULL;
    int held = taken == Py_True;
    Py_DECREF(taken);
    if (!held)
        return PyLong_FromLong(-3);
    int64_t *busy_word = (int64_t *)mx->view.buf + self->busy;
    if (__atomic_load_n(busy_word, __ATOMIC_ACQUIRE) != 0)
        return PyLong_FromLong(-2);
    __atomic_store_n(busy_word, (int64_t)mx->pid, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    StateCopies *c = (StateCopies *)self->copies;
    volatile int64_t *current = (volatile int64_t *)c->copy[*c->active & 1];
    current[1] = n;  /* (the intent: rows this insert may write, for the recovery) */
    long long gen = current[0];  /* (this process's guard catches up at its next entry if it moved on) */
    int64_t **w = self->w;
    volatile int64_t *hdr = (volatile int64_t *)((RobustMutex *)self->mutex)->view.buf;
    long long cap = self->capacity, first = *w[S_NEXT];
    long long start = (first - *w[S_BASE]) % cap;
    if (start < 0)
        start += cap;
    if (*w[S_RINGMODE] != 1 || hdr[self->reserved] != 0 || start + n > cap
        || (self->limited && !((double)(*w[L_INSERTS] + n) * self->spi - (double)*w[L_SAMPLES] <= self->max_diff))) {
        return ring_bail(self, gen, n);
    }
    long long version = *w[S_VERSION];
    if (version < INT32_MIN || version > INT32_MAX) {  /* (the table refuses such versions: the Python path says so) */
        return ring_bail(self, gen, n);
    }
    PyArrayObject *keys = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_INT64);
    if (keys == NULL) {  /* (no memory: the words are unchanged) */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyObject *r = ring_leave(self, gen, n);
        Py_XDECREF(r);
        PyErr_Restore(et, ev, tb);
        return NULL;
    }
    /* written_hi first (the keys are implicit: replaystore.shared.reads), then the metadata rows
     * as replaystore.rows.fill_meta(meta, start, n, version, prio), then the payloads */
    if (hdr[self->written_hi] < first + n) /* (raised only: a removal of the oldest items may have set it higher) */
        __atomic_store_n((int64_t *)hdr + self->written_hi, (int64_t)(first + n), __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_RELEASE);  /* (before the rows: see replaystore.shared.reads) */
    Py_ssize_t mw = self->meta_w;  /* (a narrow row: no priority word) */
    int64_t *mrow = self->meta_rows + mw * start, pbits = *w[S_MAXPRIO];
    int32_t pair[2] = {0, (int32_t)version};  /* (times sampled, version): word 0 */
    int64_t pword;
    memcpy(&pword, pair, 8);
    for (npy_intp i = 0; i < n; i++, mrow += mw) {
        mrow[0] = pword;
        if (mw == RING_META_W)
            mrow[1] = pbits;
    }
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        Py_ssize_t rb = self->rowbytes[i];
        memcpy((char *)PyArray_DATA(self->col[i]) + start * rb, src[i], (size_t)(n * rb));
    }
    /* _ring_commit's counters */
    long long size = *w[S_SIZE], overflow = size + n - cap;
    *w[S_HI] = first + n;
    *w[S_INSERTS] += n;
    *w[L_INSERTS] += n;
    if (overflow > 0) {
        *w[S_LO] += overflow;
        *w[L_DELETES] += overflow;
        *w[S_DELETES] += overflow;
        *w[S_EVICTIONS] += overflow;
        *w[S_SIZE] = cap;
    } else {
        if (size == 0)
            *w[S_LO] = first;
        *w[S_SIZE] = size + n;
    }
    *w[S_NFREE] = cap - *w[S_SIZE];
    *w[S_NEXT] = first + n;
    int64_t *k = (int64_t *)PyArray_DATA(keys);
    for (npy_intp i = 0; i < n; i++)
        k[i] = first + i;
    PyObject *g = ring_leave(self, gen, n);
    if (g == NULL) {
        Py_DECREF(keys);
        return NULL;
    }
    self->generation = PyLong_AsLongLong(g);
    Py_DECREF(g);
    return (PyObject *)keys;
}

static PyMethodDef RingInserter_methods[] = {
    {"insert", (PyCFunction)(void (*)(void))RingInserter_insert, METH_FASTCALL,
     "insert(guard, data) -> the keys, or -1 (not taken, nothing changed), -2 (the holder died: the "
     "mutex is held), -3 (the lock timed out)."},
    {"add", (PyCFunction)(void (*)(void))RingInserter_add, METH_FASTCALL,
     "add(guard, item) -> as insert, for one row given as a dict of rows; the key an int (>= 0)."},
    {NULL, NULL, 0, NULL}};

static PyMemberDef RingInserter_members[] = {
    {"generation", T_LONGLONG, offsetof(RingInserter, generation), READONLY,
     "the state's generation after the last insert taken"},
    {NULL, 0, 0, 0, NULL}};

static PyTypeObject RingInserterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replaystore.shared._sync.RingInserter",
    .tp_basicsize = sizeof(RingInserter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RingInserter(...): a ring-mode shared table's small extend in one critical section (see the source).",
    .tp_new = RingInserter_new,
    .tp_dealloc = (destructor)RingInserter_dealloc,
    .tp_methods = RingInserter_methods,
    .tp_members = RingInserter_members,
};
#endif /* RS_WITH_NUMPY */

/* -- RingSampler: a ring-mode uniform shared table's sample(n), one critical section in one call --
 *
 * Built only with NumPy's headers (RS_WITH_NUMPY), as RingInserter.
 *
 * RingSampler(mutex, copies, words, slots, capacity, header, header_words, limits, names, columns,
 *             meta, key_column, timeout, sampler)
 *
 * What replaystore.shared.reads.KeyCheckedReads.sample does for a ring-mode table whose sampler is
 * a Uniform that follows the ring (no max_times_sampled, flat column storage), with the section's
 * entry and exit on the raw words (as RingInserter): the sampler's numbers drawn first from its
 * Generator's bit generator (the same stream as `sampler.rng.random(n)`: its next_double, under
 * its lock), the metadata rows a full ring's draw takes read before the lock (Uniform.warm_up),
 * then under the lock (section opened, intent 0) what Table._draw does: the size and the rate
 * limiter's can_sample (the base formula), the slots (RingIndex.sample: ring_draw), each drawn
 * slot's times_sampled counted and its row widened into the sample rows (count_samples), the
 * limiter's and the state's sample counters; leaving commits the state copy. Then, the lock
 * released, the payload rows are gathered (ColumnStorage.read) and the copy checked with
 * keys_settled (the module function, called with the segment's header words).
 * `words`: the scalars region; `slots`: bytes of N_DRAW_WORDS int64 word indices in the order of
 * the D_ names below; `header`: the segment's header words (an int64 buffer: the mutex's);
 * `header_words`: (busy, unordered, acquired, written_hi) word indices in it; `limits`:
 * (samples_per_insert, min_diff, min_size_to_sample) of a RateLimiter whose can_sample is the
 * base formula; `names` and `columns`: the storage's flat columns; `meta`: the (capacity,
 * RING_META_W) int64 rows (or RING_META_W - 1 words: a narrow row, no priority word, its items'
 * priority 1.0); `key_column`: the table's (capacity,) int64 key column (read by keys_settled
 * only once ring mode is over); a sample row's key is the ring's (lo + (slot - (lo - base)) mod
 * capacity: keys are implicit in ring mode);
 * `sampler`: the Uniform (its `rng` attribute is read at every call: a new Generator is refused).
 *
 * sample(guard, n) -> (slots, probabilities, rows, data, settled) when the sample was drawn
 * (`data` a dict of the flat columns' new arrays; `settled`: keys_settled's answer, False: the
 * caller finishes the sample under the lock, KeyCheckedReads._finish_locked); the `generation`
 * member and `guard._gen` are then the state's generation. Otherwise:
 * -1 (an int): not taken, nothing drawn or changed (n not an int in [1, 2**20], this thread
 * inside the guard already, the sampler's Generator replaced or its lock held by another thread);
 * (code, uniforms): the numbers were drawn (`uniforms`, float64: the caller's Python path draws
 * with them), nothing else changed: code -1 the lock is free (ring mode over, nothing to sample,
 * the rate limiter says wait), -2 the previous holder died inside (the mutex is HELD: the caller
 * repairs, as for RingInserter), -3 the lock timed out.
 * Thread-safety: any thread, without the ProcessGuard's thread lock (see ring_insert_guarded). */
#ifdef RS_WITH_NUMPY
#include <numpy/random/bitgen.h>

enum { D_BASE, D_LO, D_HI, D_SIZE, D_RINGMODE, D_SAMPLES, D_SAMPLE_CALLS, D_L_INSERTS, D_L_SAMPLES,
       D_L_DELETES, N_DRAW_WORDS };
#define MAX_DRAW ((npy_intp)1 << 20)
#define DRAW_AHEAD 8 /* rows ahead to prefetch (as _rows.c's PREFETCH_AHEAD) */

typedef struct {
    PyObject_HEAD
    PyObject *mutex, *copies, *words_obj, *header, *names, *columns, *meta, *keycol, *timeout, *sampler;
    PyObject *rng, *bitgen_obj, *lock_acquire, *lock_release, *busy_obj, *acquired_obj, *unordered_obj, *hi_obj;
    PyObject *after_copy; /* (tests: called with the slots after the copy, before the key check) */
    Py_buffer words;
    bitgen_t *bitgen;
    int64_t *meta_rows;
    Py_ssize_t meta_w; /* RING_META_W, or RING_META_W - 1: a narrow row (no priority word: priority 1.0) */
    int64_t *w[N_DRAW_WORDS];
    long long capacity, min_size, generation;
    Py_ssize_t busy, unordered, acquired, ncols;
    double spi, min_diff;
    PyArrayObject *col[MAX_RING_COLUMNS];
    Py_ssize_t rowbytes[MAX_RING_COLUMNS];
} RingSampler;

static PyObject *str_rng;

static void
RingSampler_dealloc(RingSampler *self)
{
    if (self->words.obj != NULL)
        PyBuffer_Release(&self->words);
    PyObject **own[] = {&self->mutex, &self->copies, &self->words_obj, &self->header, &self->names,
                        &self->columns, &self->meta, &self->keycol, &self->timeout, &self->sampler, &self->rng,
                        &self->bitgen_obj, &self->lock_acquire, &self->lock_release, &self->busy_obj,
                        &self->acquired_obj, &self->unordered_obj, &self->hi_obj, &self->after_copy};
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
        Py_CLEAR(*own[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
RingSampler_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *mutex, *copies, *words, *header, *names, *columns, *meta, *keycol, *timeout, *sampler;
    Py_buffer slots;
    long long capacity, min_size;
    Py_ssize_t busy, unordered, acquired, written_hi;
    double spi, min_diff;
    if (!PyArg_ParseTuple(args, "O!O!Oy*LO(nnnn)(ddL)O!O!OOOO", &RobustMutexType, &mutex, &StateCopiesType, &copies,
                          &words, &slots, &capacity, &header, &busy, &unordered, &acquired, &written_hi, &spi,
                          &min_diff, &min_size, &PyTuple_Type, &names, &PyTuple_Type, &columns, &meta, &keycol,
                          &timeout, &sampler))
        return NULL;
    RingSampler *self = (RingSampler *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyBuffer_Release(&slots);
        return NULL;
    }
    if (PyObject_GetBuffer(words, &self->words, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        self->words.obj = NULL;
        PyBuffer_Release(&slots);
        Py_DECREF(self);
        return NULL;
    }
    RobustMutex *m = (RobustMutex *)mutex;
    Py_ssize_t nwords = self->words.len / 8, ncols = PyTuple_GET_SIZE(columns);
    int ok = slots.len == 8 * N_DRAW_WORDS && self->words.len >= 8 * ((StateCopies *)copies)->n && capacity > 0
             && busy >= 0 && unordered >= 0 && acquired >= 0 && 8 * (busy + 1) <= m->view.len
             && 8 * (unordered + 1) <= m->view.len && 8 * (acquired + 1) <= m->view.len && written_hi >= 0
             && 8 * (written_hi + 1) <= m->view.len && ncols > 0
             && ncols <= MAX_RING_COLUMNS && PyTuple_GET_SIZE(names) == ncols;
    if (ok) { /* the metadata rows: a writable C-contiguous (capacity, RING_META_W or RING_META_W - 1) int64 array */
        PyArrayObject *ma = (PyArrayObject *)meta;
        ok = PyArray_Check(meta) && PyArray_NDIM(ma) == 2 && PyArray_DIM(ma, 0) == capacity
             && (PyArray_DIM(ma, 1) == RING_META_W || PyArray_DIM(ma, 1) == RING_META_W - 1)
             && PyArray_TYPE(ma) == NPY_INT64 && PyArray_IS_C_CONTIGUOUS(ma)
             && PyArray_ISWRITEABLE(ma);
        self->meta_rows = ok ? (int64_t *)PyArray_DATA(ma) : NULL;
        self->meta_w = ok ? PyArray_DIM(ma, 1) : RING_META_W;
        PyArrayObject *ka = (PyArrayObject *)keycol; /* (the key column: read by keys_settled out of ring mode) */
        ok = ok && PyArray_Check(keycol) && PyArray_NDIM(ka) == 1 && PyArray_DIM(ka, 0) == capacity
             && PyArray_TYPE(ka) == NPY_INT64 && PyArray_IS_C_CONTIGUOUS(ka);
    }
    for (int i = 0; ok && i < N_DRAW_WORDS; i++) {
        int64_t k;
        memcpy(&k, (char *)slots.buf + 8 * i, 8);
        if (k < 0 || k >= nwords)
            ok = 0;
        else
            self->w[i] = (int64_t *)self->words.buf + k;
    }
    for (Py_ssize_t i = 0; ok && i < ncols; i++) {
        PyObject *col = PyTuple_GET_ITEM(columns, i);
        if (!PyArray_Check(col) || !PyUnicode_CheckExact(PyTuple_GET_ITEM(names, i)))
            ok = 0;
        else {
            PyArrayObject *a = (PyArrayObject *)col;
            ok = PyArray_NDIM(a) >= 1 && PyArray_DIM(a, 0) == capacity && PyArray_IS_C_CONTIGUOUS(a)
                 && PyArray_NDIM(a) <= NPY_MAXDIMS;
            self->col[i] = a;
            self->rowbytes[i] = ok ? PyArray_NBYTES(a) / capacity : 0;
        }
    }
    PyBuffer_Release(&slots);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "RingSampler: word indices outside the buffers, a bad capacity, or "
                                          "columns or meta that are not C-contiguous arrays of `capacity` rows "
                                          "(meta: writable (capacity, 2) or (capacity, 1) int64; key column: "
                                          "(capacity,) int64)");
        Py_DECREF(self);
        return NULL;
    }
    self->capacity = capacity;
    self->busy = busy;
    self->unordered = unordered;
    self->acquired = acquired;
    self->ncols = ncols;
    self->spi = spi;
    self->min_diff = min_diff;
    self->min_size = min_size;
    PyObject **own[] = {&self->mutex, &self->copies, &self->words_obj, &self->header, &self->names,
                        &self->columns, &self->meta, &self->keycol, &self->timeout, &self->sampler};
    PyObject *vals[] = {mutex, copies, words, header, names, columns, meta, keycol, timeout, sampler};
    for (int i = 0; i < 10; i++) {
        Py_INCREF(vals[i]);
        *own[i] = vals[i];
    }
    /* the sampler's Generator, its bit generator (the C struct behind its capsule) and that one's lock */
    self->rng = PyObject_GetAttr(sampler, str_rng);
    self->bitgen_obj = self->rng == NULL ? NULL : PyObject_GetAttrString(self->rng, "bit_generator");
    PyObject *capsule = self->bitgen_obj == NULL ? NULL : PyObject_GetAttrString(self->bitgen_obj, "capsule");
    PyObject *lock = self->bitgen_obj == NULL ? NULL : PyObject_GetAttrString(self->bitgen_obj, "lock");
    if (capsule != NULL)
        self->bitgen = (bitgen_t *)PyCapsule_GetPointer(capsule, "BitGenerator");
    if (lock != NULL) {
        self->lock_acquire = PyObject_GetAttrString(lock, "acquire");
        self->lock_release = PyObject_GetAttrString(lock, "release");
    }
    Py_XDECREF(capsule);
    Py_XDECREF(lock);
    self->busy_obj = PyLong_FromSsize_t(busy);
    self->acquired_obj = PyLong_FromSsize_t(acquired);
    self->unordered_obj = PyLong_FromSsize_t(unordered);
    self->hi_obj = PyLong_FromSsize_t(written_hi);
    if (self->bitgen == NULL || self->lock_acquire == NULL || self->lock_release == NULL || self->busy_obj == NULL
        || self->acquired_obj == NULL || self->unordered_obj == NULL || self->hi_obj == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "RingSampler: the sampler's rng is not a NumPy Generator");
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* leave a section as ring_leave does (commit the words when they changed, else clear the intent;
 * clear the unordered word, then the busy word; release): the generation now, or -1 and an error */
static long long
draw_leave(RingSampler *self, long long gen)
{
    RobustMutex *m = (RobustMutex *)self->mutex;
    StateCopies *c = (StateCopies *)self->copies;
    Py_ssize_t n = c->n;
    const char *current = c->copy[*c->active & 1];
    if (memcmp(current + 16, self->words.buf, 8 * n) != 0) { /* (StateCopies_commit) */
        int other = (int)((*c->active & 1) ^ 1);
        int64_t head[2] = {(int64_t)(gen + 1), 0};
        memcpy(c->copy[other], head, 16);
        memcpy(c->copy[other] + 16, self->words.buf, 8 * n);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        *c->active = other;
        gen += 1;
    }
    __atomic_store_n((int64_t *)m->view.buf + self->unordered, 0, __ATOMIC_RELEASE);
    __atomic_store_n((int64_t *)m->view.buf + self->busy, 0, __ATOMIC_RELEASE);
    PyObject *released = RobustMutex_release(m, NULL);
    if (released == NULL)
        return -1;
    Py_DECREF(released);
    return gen;
}

/* (code, uniforms): the numbers drawn into `u` handed back to the caller's Python path */
static PyObject *
draw_refused(long code, const double *u, npy_intp n)
{
    PyObject *arr = PyArray_SimpleNew(1, &n, NPY_FLOAT64);
    if (arr == NULL)
        return NULL;
    memcpy(PyArray_DATA((PyArrayObject *)arr), u, (size_t)n * sizeof(double));
    return Py_BuildValue("(lN)", code, arr);
}

/* the section (mutex taken): checks, draw, count, counters, commit. 0 drawn; -1/-2: refused (the
 * mutex free / held); -4 an error set (the mutex free) */
static int
draw_locked(RingSampler *self, int64_t *slots, double *probabilities, int64_t *rows, npy_intp n)
{
    RobustMutex *mx = (RobustMutex *)self->mutex;
    int64_t *busy_word = (int64_t *)mx->view.buf + self->busy;
    if (__atomic_load_n(busy_word, __ATOMIC_ACQUIRE) != 0)
        return -2;
    __atomic_store_n(busy_word, (int64_t)mx->pid, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    StateCopies *c = (StateCopies *)self->copies;
    long long gen = ((volatile int64_t *)c->copy[*c->active & 1])[0];
    int64_t **w = self->w;
    long long cap = self->capacity, lo = *w[D_LO], size = *w[D_HI] - lo;
    long long ins = *w[D_L_INSERTS], smp = *w[D_L_SAMPLES];
    /* Table._draw: st.size > 0 and limiter.can_sample(n) (the base formula, in Python's float order) */
    if (*w[D_RINGMODE] != 1 || *w[D_SIZE] <= 0 || size <= 0 || size > cap || ins - *w[D_L_DELETES] < self->min_size
        || !((double)ins * self->spi - (double)smp - (double)n >= self->min_diff)) {
        return draw_leave(self, gen) < 0 ? -4 : -1;
    }
    long long start = 0;
    if (size != cap) {
        start = (lo - *w[D_BASE]) % cap;
        if (start < 0)
            start += cap;
    }
    /* RingIndex.sample (ring_draw), in place: slots holds the numbers */
    const double *u = (const double *)slots;
    double scale = (double)size;
    for (npy_intp i = 0; i < n; i++) {
        int64_t k = (int64_t)(u[i] * scale);
        if (k >= size)
            k = size - 1;
        if (k < 0)
            k = 0;
        k += start;
        slots[i] = k >= cap ? k - cap : k;
    }
    double p = 1.0 / (double)size; /* (Uniform.sample: 1 / members.size) */
    for (npy_intp i = 0; i < n; i++)
        probabilities[i] = p;
    /* count_samples: times sampled + 1 per draw (saturating), then the rows with the final counts */
    int64_t *meta = self->meta_rows;
    const Py_ssize_t mw = self->meta_w;
    int64_t unkept; /* a narrow row's priority: 1.0 (rows.UnkeptPriorities), as its float64 bits */
    const double one = 1.0;
    memcpy(&unkept, &one, 8);
    for (npy_intp i = 0; i < n; i++) {
        if (i + DRAW_AHEAD < n) {
            const int64_t *ahead = meta + mw * slots[i + DRAW_AHEAD];
            __builtin_prefetch(ahead, 1);
            __builtin_prefetch(ahead + mw - 1, 1);
        }
        int32_t *ts = (int32_t *)(meta + mw * slots[i]); /* (int32 0: times sampled) */
        if (*ts != INT32_MAX)
            *ts += 1;
    }
    long long lstart = (lo - *w[D_BASE]) % cap; /* (the slot of key lo: keys are implicit in ring mode) */
    if (lstart < 0)
        lstart += cap;
    for (npy_intp i = 0; i < n; i++) {
        const int64_t *row = meta + mw * slots[i];
        const int32_t *r32 = (const int32_t *)row;
        long long age = slots[i] - lstart;
        rows[4 * i] = lo + (age < 0 ? age + cap : age);
        rows[4 * i + 1] = r32[0];
        rows[4 * i + 2] = r32[1];
        rows[4 * i + 3] = mw == RING_META_W ? row[1] : unkept;
    }
    *w[D_L_SAMPLES] += n;
    *w[D_SAMPLES] += n;
    *w[D_SAMPLE_CALLS] += 1;
    long long g = draw_leave(self, gen);
    if (g < 0)
        return -4;
    self->generation = g;
    return 0;
}

/* the payload rows of `slots` into new arrays (ColumnStorage.read: one pass, prefetching ahead): the
 * data dict, or NULL */
static PyObject *
draw_gather(RingSampler *self, const int64_t *slots, npy_intp n)
{
    PyObject *data = PyDict_New();
    if (data == NULL)
        return NULL;
    char *dst[MAX_RING_COLUMNS];
    const char *src[MAX_RING_COLUMNS];
    Py_ssize_t k = self->ncols;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyArrayObject *col = self->col[i];
        npy_intp dims[NPY_MAXDIMS];
        int nd = PyArray_NDIM(col);
        dims[0] = n;
        for (int d = 1; d < nd; d++)
            dims[d] = PyArray_DIM(col, d);
        PyArray_Descr *descr = PyArray_DESCR(col);
        Py_INCREF(descr);
        PyObject *out = PyArray_NewFromDescr(&PyArray_Type, descr, nd, dims, NULL, NULL, 0, NULL);
        if (out == NULL || PyDict_SetItem(data, PyTuple_GET_ITEM(self->names, i), out) < 0) {
            Py_XDECREF(out);
            Py_DECREF(data);
            return NULL;
        }
        Py_DECREF(out); /* (the dict holds it) */
        dst[i] = PyArray_DATA((PyArrayObject *)out);
        src[i] = PyArray_DATA(col);
    }
    const Py_ssize_t *rb = self->rowbytes;
    for (npy_intp j = 0; j < n; j++) {
        if (j + DRAW_AHEAD < n) {
            int64_t ahead = slots[j + DRAW_AHEAD];
            for (Py_ssize_t i = 0; i < k; i++) {
                const char *row = src[i] + ahead * rb[i];
                __builtin_prefetch(row);
                if (rb[i] > 64)
                    __builtin_prefetch(row + rb[i] - 1);
            }
        }
        for (Py_ssize_t i = 0; i < k; i++)
            memcpy(dst[i] + j * rb[i], src[i] + slots[j] * rb[i], (size_t)rb[i]);
    }
    return data;
}

static PyObject *
RingSampler_sample(RingSampler *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "sample(guard, n)");
        return NULL;
    }
    PyObject *guard = args[0];
    if (!PyLong_CheckExact(args[1]))
        return PyLong_FromLong(-1);
    int overflow = 0;
    long long nn = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (overflow || nn < 1 || nn > MAX_DRAW) {
        PyErr_Clear();
        return PyLong_FromLong(-1);
    }
    npy_intp n = (npy_intp)nn;
    PyObject *depth = PyObject_GetAttr(guard, str_depth);
    if (depth == NULL)
        return NULL;
    int inside = PyObject_IsTrue(depth);
    Py_DECREF(depth);
    if (inside)
        return inside < 0 ? NULL : PyLong_FromLong(-1);
    PyObject *rng = PyObject_GetAttr(self->sampler, str_rng);
    if (rng == NULL)
        return NULL;
    Py_DECREF(rng); /* (only compared) */
    if (rng != self->rng)
        return PyLong_FromLong(-1);
    npy_intp rdims[2] = {n, 4};
    PyObject *slots_a = PyArray_SimpleNew(1, &n, NPY_INT64);
    PyObject *prob_a = slots_a == NULL ? NULL : PyArray_SimpleNew(1, &n, NPY_FLOAT64);
    PyObject *rows_a = prob_a == NULL ? NULL : PyArray_SimpleNew(2, rdims, NPY_INT64);
    PyObject *out = NULL;
    if (rows_a == NULL)
        goto done;
    int64_t *slots = (int64_t *)PyArray_DATA((PyArrayObject *)slots_a);
    double *u = (double *)slots; /* (the numbers first, in place of the slots they become) */
    /* the numbers: Generator.random(n) (random_standard_uniform_fill), under the bit generator's lock */
    PyObject *got = PyObject_CallOneArg(self->lock_acquire, Py_False);
    if (got == NULL)
        goto done;
    int locked = got == Py_True;
    Py_DECREF(got);
    if (!locked) {
        out = PyLong_FromLong(-1);
        goto done;
    }
    bitgen_t *bg = self->bitgen;
    for (npy_intp i = 0; i < n; i++)
        u[i] = bg->next_double(bg->state);
    got = PyObject_CallNoArgs(self->lock_release);
    if (got == NULL)
        goto done;
    Py_DECREF(got);
    /* Uniform.warm_up: a full ring's draw takes slot floor(u * capacity): read those rows now */
    int64_t **w = self->w;
    long long cap = self->capacity;
    if (__atomic_load_n(w[D_HI], __ATOMIC_RELAXED) - __atomic_load_n(w[D_LO], __ATOMIC_RELAXED) == cap) {
        volatile int64_t sink = 0;
        const int64_t *meta = self->meta_rows;
        double scale = (double)cap;
        for (npy_intp i = 0; i < n; i++) {
            if (i + DRAW_AHEAD < n) {
                Py_ssize_t a = (Py_ssize_t)(u[i + DRAW_AHEAD] * scale);
                if (a >= 0 && a < cap)
                    __builtin_prefetch(meta + self->meta_w * a);
            }
            Py_ssize_t k = (Py_ssize_t)(u[i] * scale);
            if (k >= 0 && k < cap)
                sink += meta[self->meta_w * k];
        }
        (void)sink;
    }
    PyObject *taken = RobustMutex_acquire((RobustMutex *)self->mutex, self->timeout);
    if (taken == NULL)
        goto done;
    int held = taken == Py_True;
    Py_DECREF(taken);
    if (!held) {
        out = draw_refused(-3, u, n);
        goto done;
    }
    int r = draw_locked(self, slots, (double *)PyArray_DATA((PyArrayObject *)prob_a),
                        (int64_t *)PyArray_DATA((PyArrayObject *)rows_a), n);
    if (r == -4)
        goto done;
    if (r < 0) {
        out = draw_refused(r, u, n);
        goto done;
    }
    PyObject *g = PyLong_FromLongLong(self->generation);
    if (g == NULL || PyObject_SetAttr(guard, str_gen, g) < 0)
        PyErr_Clear(); /* (the sample is drawn; a stale guard._gen only makes the next entry catch up) */
    Py_XDECREF(g);
    PyObject *data = draw_gather(self, slots, n);
    if (data == NULL)
        goto done;
    if (self->after_copy != NULL && self->after_copy != Py_None) {
        PyObject *hook = PyObject_CallOneArg(self->after_copy, slots_a);
        if (hook == NULL) {
            Py_DECREF(data);
            goto done;
        }
        Py_DECREF(hook);
    }
    PyObject *kargs[8] = {self->header, self->busy_obj, self->acquired_obj, self->unordered_obj, self->hi_obj,
                          self->keycol, slots_a, rows_a};
    PyObject *settled = keys_settled(NULL, kargs, 8);
    if (settled == NULL) {
        Py_DECREF(data);
        goto done;
    }
    out = PyTuple_Pack(5, slots_a, prob_a, rows_a, data, settled);
    Py_DECREF(data);
    Py_DECREF(settled);
done:
    Py_XDECREF(slots_a);
    Py_XDECREF(prob_a);
    Py_XDECREF(rows_a);
    return out;
}

static PyMethodDef RingSampler_methods[] = {
    {"sample", (PyCFunction)(void (*)(void))RingSampler_sample, METH_FASTCALL,
     "sample(guard, n) -> (slots, probabilities, rows, data, settled), or -1 (nothing drawn), or "
     "(code, uniforms): refused after drawing (see the source)."},
    {NULL, NULL, 0, NULL}};

static PyMemberDef RingSampler_members[] = {
    {"generation", T_LONGLONG, offsetof(RingSampler, generation), READONLY,
     "the state's generation after the last sample drawn"},
    {"after_copy", T_OBJECT, offsetof(RingSampler, after_copy), 0,
     "tests: None, or called with the slots after the copy, before the key check"},
    {NULL, 0, 0, 0, NULL}};

static PyTypeObject RingSamplerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "replaystore.shared._sync.RingSampler",
    .tp_basicsize = sizeof(RingSampler),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RingSampler(...): a ring-mode uniform shared table's sample in one critical section (see the source).",
    .tp_new = RingSampler_new,
    .tp_dealloc = (destructor)RingSampler_dealloc,
    .tp_methods = RingSampler_methods,
    .tp_members = RingSampler_members,
};
#endif /* RS_WITH_NUMPY (RingSampler) */

static PyMethodDef methods[] = {
    {"enter_section", (PyCFunction)(void (*)(void))enter_section, METH_FASTCALL,
     "enter_section(mutex, timeout, busy_word, copies, generation, intent) -> int: take the mutex and "
     "open a section (-1: timed out; 1: the holder died inside; 2: another process committed since; 0)."},
    {"leave_section", (PyCFunction)(void (*)(void))leave_section, METH_FASTCALL,
     "leave_section(mutex, busy_word, unordered_word, copies, words, generation, intent, victims) -> int: commit, clear "
     "the notes and the busy word, release; the generation now."},
    {"set_word", (PyCFunction)(void (*)(void))set_word, METH_FASTCALL,
     "set_word(words, index, value): words[index] = value, after every earlier store and before every later one."},
    {"keys_settled", (PyCFunction)(void (*)(void))keys_settled, METH_FASTCALL,
     "keys_settled(words, busy_word, acquired_word, unordered_word, hi_word, key_column, slots, rows) -> bool: after a copy made "
     "outside the lock, True once no critical section that overlapped it is open and every slot "
     "still holds its drawn key."},
    {"fence", fence, METH_NOARGS,
     "fence(): a full memory barrier: the stores and loads before it are visible and done before those after it."},
    {"init_mutex", init_mutex, METH_VARARGS,
     "init_mutex(buffer, offset): build a robust process-shared mutex at byte offset."},
    {"set_spin", set_spin, METH_O,
     "set_spin(ns) -> previous: how long (ns) an acquire that finds the mutex taken spins before it "
     "sleeps, in this process (0: it sleeps at once)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sync", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__sync(void)
{
#ifdef RS_WITH_NUMPY
    int numpy_ok = 1;
#endif
    if (PyType_Ready(&RobustMutexType) < 0 || PyType_Ready(&StateCopiesType) < 0 || PyType_Ready(&WordType) < 0)
        return NULL;
#ifdef RS_WITH_NUMPY
    if (PyType_Ready(&RingInserterType) < 0)
        return NULL;
    if (PyType_Ready(&RingSamplerType) < 0 || (str_rng = PyUnicode_InternFromString("rng")) == NULL)
        return NULL;
    if ((str_depth = PyUnicode_InternFromString("_depth")) == NULL
        || (str_gen = PyUnicode_InternFromString("_gen")) == NULL)
        return NULL;
    if (_import_array() < 0) {  /* (NumPy not importable: no RingInserter, the rest of the module works) */
        PyErr_Clear();
        numpy_ok = 0;
    }
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *size = PyLong_FromSize_t(sizeof(pthread_mutex_t));
    if (size == NULL || PyModule_AddObject(m, "MUTEX_BYTES", size) < 0) {
        Py_XDECREF(size);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&StateCopiesType);
    if (PyModule_AddObject(m, "StateCopies", (PyObject *)&StateCopiesType) < 0) {
        Py_DECREF(&StateCopiesType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&WordType);
    if (PyModule_AddObject(m, "Word", (PyObject *)&WordType) < 0) {
        Py_DECREF(&WordType);
        Py_DECREF(m);
        return NULL;
    }
#ifdef RS_WITH_NUMPY
    Py_INCREF(&RingInserterType);
    if (numpy_ok && PyModule_AddObject(m, "RingInserter", (PyObject *)&RingInserterType) < 0) {
        Py_DECREF(&RingInserterType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&RingSamplerType);
    if (numpy_ok && PyModule_AddObject(m, "RingSampler", (PyObject *)&RingSamplerType) < 0) {
        Py_DECREF(&RingSamplerType);
        Py_DECREF(m);
        return NULL;
    }
#endif
    Py_INCREF(&RobustMutexType);
    if (PyModule_AddObject(m, "RobustMutex", (PyObject *)&RobustMutexType) < 0) {
        Py_DECREF(&RobustMutexType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
