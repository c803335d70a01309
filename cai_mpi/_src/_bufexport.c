/*
 * cai_mpi._src._bufexport: a subclassable base type whose instances export the
 * Python buffer protocol on behalf of another object.
 *
 * BufferExporter.bf_getbuffer calls ``self._host_buffer_target()`` (looked up on
 * the instance, so Python subclasses override it) and re-exports the buffer of
 * the object it returns, normally a numpy ndarray. This gives Python < 3.12,
 * which lacks PEP 688's ``__buffer__``, a zero-copy ``memoryview(obj)``.
 *
 * Reference counting. getbuffer takes the target's buffer into a heap-allocated
 * Py_buffer ("inner", which holds the target's reference in inner->obj), copies
 * its fields into the consumer's view, and sets view->obj = self (a new
 * reference, as the protocol requires) and view->internal = inner. When the
 * consumer calls PyBuffer_Release(view), CPython calls our releasebuffer, which
 * releases inner (the target's own releasebuffer runs and the target's reference
 * is dropped) and frees it; then PyBuffer_Release drops the reference to self.
 * So while any view is alive both the exporter and the target are alive, and
 * memoryview(obj).obj is obj. Keeping inner on the heap (not a copy on the
 * stack) also keeps valid the exporters that point view->shape into their own
 * Py_buffer (PyBuffer_FillInfo sets shape = &view->len).
 *
 * Instances have a __dict__ and support weak references (explicit slots, so the
 * same code works on 3.10 to 3.13) and take part in cyclic GC.
 *
 * The type also holds cai_mpi.Array's fields (_descriptor, _host, _owner, device,
 * meta, source, tag) as C members, and _received_host() builds a host Array in
 * one C call: recv_array makes one Array per message, and filling seven Python
 * slots one by one cost more than the 8-byte MPI message itself.
 *
 * PoolLease and PoolBudget serve hostmem.HostBufferPool: a lease exports one pooled
 * block's memory (numpy.frombuffer(lease) is what a receive without out= gets), and when
 * the last view of it dies its dealloc puts the block back on its size class's free list,
 * within the budget of idle bytes. A numpy subclass with a Python __del__ did the same for
 * 2 us per receive; this costs a fraction of that. hostmem.py holds the Python fallback.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *dict;
    PyObject *weakreflist;
    PyObject *descriptor;
    PyObject *host;
    PyObject *owner;
    PyObject *device;
    PyObject *meta;
    PyObject *source;
    PyObject *tag;
} BufferExporterObject;

static PyObject *str_host_buffer_target; /* interned "_host_buffer_target" */
static PyObject *str_host;               /* interned "host" */

static int
exporter_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    PyObject *target;
    Py_buffer *inner;

    if (view == NULL) {
        PyErr_SetString(PyExc_BufferError, "BufferExporter: NULL view in getbuffer");
        return -1;
    }
    view->obj = NULL;

    target = PyObject_CallMethodNoArgs(self, str_host_buffer_target);
    if (target == NULL) {
        return -1;
    }
    if (target == self) {
        Py_DECREF(target);
        PyErr_SetString(PyExc_BufferError,
                        "_host_buffer_target() returned the exporter itself");
        return -1;
    }

    inner = (Py_buffer *)PyMem_Malloc(sizeof(Py_buffer));
    if (inner == NULL) {
        Py_DECREF(target);
        PyErr_NoMemory();
        return -1;
    }
    if (PyObject_GetBuffer(target, inner, flags) < 0) {
        PyMem_Free(inner);
        Py_DECREF(target);
        return -1;
    }
    /* inner->obj now owns its own reference to the target (or to whatever
       object the target's exporter chose); ours is no longer needed. */
    Py_DECREF(target);

    *view = *inner; /* buf, len, itemsize, readonly, ndim, format, shape,
                       strides, suboffsets: all owned by inner->obj */
    Py_INCREF(self);
    view->obj = self;
    view->internal = inner;
    return 0;
}

static void
exporter_releasebuffer(PyObject *self, Py_buffer *view)
{
    Py_buffer *inner = (Py_buffer *)view->internal;

    (void)self;
    if (inner != NULL) {
        view->internal = NULL;
        PyBuffer_Release(inner);
        PyMem_Free(inner);
    }
}

static PyBufferProcs exporter_as_buffer = {
    exporter_getbuffer,
    exporter_releasebuffer,
};

static PyObject *
exporter_host_buffer_target(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    PyErr_Format(PyExc_BufferError, "%.200s does not export a host buffer",
                 Py_TYPE(self)->tp_name);
    return NULL;
}

static PyObject *
exporter_received_host(PyTypeObject *cls, PyObject *const *args, Py_ssize_t nargs)
{
    BufferExporterObject *self;

    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_received_host(host, source, tag) takes 3 arguments");
        return NULL;
    }
    self = (BufferExporterObject *)cls->tp_alloc(cls, 0);
    if (self == NULL) {
        return NULL;
    }
    Py_INCREF(Py_None);
    self->descriptor = Py_None;
    Py_INCREF(args[0]);
    self->host = args[0];
    Py_INCREF(args[0]);
    self->owner = args[0];
    Py_INCREF(str_host);
    self->device = str_host;
    Py_INCREF(Py_None);
    self->meta = Py_None;
    Py_INCREF(args[1]);
    self->source = args[1];
    Py_INCREF(args[2]);
    self->tag = args[2];
    return (PyObject *)self;
}

/* Pickling: the C members are not slots Python knows about, so hand them over explicitly. */
#define N_FIELDS 7

static PyObject **
exporter_fields(BufferExporterObject *self)
{
    return &self->descriptor; /* the N_FIELDS members are consecutive PyObject pointers */
}

static PyObject *
exporter_getstate(BufferExporterObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject **fields = exporter_fields(self);
    PyObject *values = PyTuple_New(N_FIELDS);
    PyObject *dict;
    PyObject *state;
    int i;

    if (values == NULL) {
        return NULL;
    }
    for (i = 0; i < N_FIELDS; i++) {
        PyObject *v = fields[i] != NULL ? fields[i] : Py_None;
        Py_INCREF(v);
        PyTuple_SET_ITEM(values, i, v);
    }
    dict = self->dict != NULL ? self->dict : Py_None;
    state = PyTuple_Pack(2, dict, values);
    Py_DECREF(values);
    return state;
}

static PyObject *
exporter_setstate(BufferExporterObject *self, PyObject *state)
{
    PyObject *dict;
    PyObject *values;
    PyObject **fields = exporter_fields(self);
    int i;

    if (!PyArg_ParseTuple(state, "OO!:__setstate__", &dict, &PyTuple_Type, &values)) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(values) != N_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "__setstate__: wrong number of fields");
        return NULL;
    }
    if (dict != Py_None) {
        PyObject *own = PyObject_GenericGetDict((PyObject *)self, NULL);
        int rc;
        if (own == NULL) {
            return NULL;
        }
        rc = PyDict_Update(own, dict);
        Py_DECREF(own);
        if (rc < 0) {
            return NULL;
        }
    }
    for (i = 0; i < N_FIELDS; i++) {
        PyObject *v = PyTuple_GET_ITEM(values, i);
        Py_INCREF(v);
        Py_XSETREF(fields[i], v);
    }
    Py_RETURN_NONE;
}

static int
exporter_traverse(BufferExporterObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->descriptor);
    Py_VISIT(self->host);
    Py_VISIT(self->owner);
    Py_VISIT(self->device);
    Py_VISIT(self->meta);
    Py_VISIT(self->source);
    Py_VISIT(self->tag);
    return 0;
}

static int
exporter_clear(BufferExporterObject *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->descriptor);
    Py_CLEAR(self->host);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->device);
    Py_CLEAR(self->meta);
    Py_CLEAR(self->source);
    Py_CLEAR(self->tag);
    return 0;
}

static void
exporter_dealloc(BufferExporterObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    exporter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef exporter_methods[] = {
    {"_host_buffer_target", exporter_host_buffer_target, METH_NOARGS,
     "The object whose buffer this exporter re-exports (override in a subclass).\n"
     "The default raises BufferError."},
    {"__getstate__", (PyCFunction)exporter_getstate, METH_NOARGS, NULL},
    {"__setstate__", (PyCFunction)exporter_setstate, METH_O, NULL},
    {"_received_host", (PyCFunction)(void (*)(void))exporter_received_host, METH_FASTCALL | METH_CLASS,
     "_received_host(host, source, tag): a new instance holding host memory just received."},
    {NULL, NULL, 0, NULL},
};

/* T_OBJECT: an unset member reads as None, like the defaults the Python fallback sets. */
static PyMemberDef exporter_members[] = {
    {"_descriptor", T_OBJECT, offsetof(BufferExporterObject, descriptor), 0, NULL},
    {"_host", T_OBJECT, offsetof(BufferExporterObject, host), 0, NULL},
    {"_owner", T_OBJECT, offsetof(BufferExporterObject, owner), 0, NULL},
    {"device", T_OBJECT, offsetof(BufferExporterObject, device), 0, NULL},
    {"meta", T_OBJECT, offsetof(BufferExporterObject, meta), 0, NULL},
    {"source", T_OBJECT, offsetof(BufferExporterObject, source), 0, NULL},
    {"tag", T_OBJECT, offsetof(BufferExporterObject, tag), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef exporter_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(exporter_doc,
"BufferExporter()\n"
"--\n"
"\n"
"Base class whose instances export the buffer protocol of the object returned\n"
"by their _host_buffer_target() method (zero-copy; the view keeps both alive).");

static PyTypeObject BufferExporter_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cai_mpi._src._bufexport.BufferExporter",
    .tp_basicsize = sizeof(BufferExporterObject),
    .tp_itemsize = 0,
    .tp_dealloc = (destructor)exporter_dealloc,
    .tp_as_buffer = &exporter_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = exporter_doc,
    .tp_traverse = (traverseproc)exporter_traverse,
    .tp_clear = (inquiry)exporter_clear,
    .tp_weaklistoffset = offsetof(BufferExporterObject, weakreflist),
    .tp_methods = exporter_methods,
    .tp_members = exporter_members,
    .tp_getset = exporter_getset,
    .tp_dictoffset = offsetof(BufferExporterObject, dict),
    .tp_new = PyType_GenericNew,
    .tp_free = PyObject_GC_Del,
};


/* ------------------------------------------------------------------------------------------
 * PoolBudget: the idle bytes a pool holds (cached) and may hold (max_cached), and on_full: called
 * as on_full(cls) when a block of size class cls comes back to a full budget, to make room (the
 * pool evicts idle blocks of the size classes taken longest ago). It must not hold a reference
 * to the pool (the budget takes no part in cyclic GC): the pool passes a weakref-based closure.
 */
typedef struct {
    PyObject_HEAD
    Py_ssize_t cached;
    Py_ssize_t max_cached;
    PyObject *on_full;
} PoolBudgetObject;

static PyTypeObject PoolBudget_Type;

static PyObject *
budget_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_cached", NULL};
    Py_ssize_t max_cached;
    PoolBudgetObject *self;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:PoolBudget", kwlist, &max_cached)) {
        return NULL;
    }
    self = (PoolBudgetObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->cached = 0;
        self->max_cached = max_cached;
        self->on_full = NULL;
    }
    return (PyObject *)self;
}

static void
budget_dealloc(PoolBudgetObject *self)
{
    Py_CLEAR(self->on_full);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Pop one idle block of size class ``cls`` off ``free_list`` and stop counting it; NULL if none. */
static PyObject *
budget_pop_block(PoolBudgetObject *budget, PyObject *free_list, Py_ssize_t cls)
{
    Py_ssize_t n = PyList_GET_SIZE(free_list);
    PyObject *block;

    if (n == 0) {
        return NULL;
    }
    block = PyList_GET_ITEM(free_list, n - 1);
    Py_INCREF(block);
    if (PyList_SetSlice(free_list, n - 1, n, NULL) < 0) {
        Py_DECREF(block);
        return NULL;
    }
    budget->cached -= cls;
    return block;
}

static PyObject *
budget_evict(PoolBudgetObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t cls;
    PyObject *block;

    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "evict(free_list: list, cls: int)");
        return NULL;
    }
    cls = PyLong_AsSsize_t(args[1]);
    if (cls == -1 && PyErr_Occurred()) {
        return NULL;
    }
    block = budget_pop_block(self, args[0], cls);
    if (block == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    Py_DECREF(block);
    Py_RETURN_TRUE;
}

static PyMethodDef budget_methods[] = {
    {"evict", (PyCFunction)(void (*)(void))budget_evict, METH_FASTCALL,
     "evict(free_list, cls) -> bool: drop one idle block of size class cls, if free_list has one."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef budget_members[] = {
    {"cached", T_PYSSIZET, offsetof(PoolBudgetObject, cached), READONLY, "idle bytes held in free lists"},
    {"max_cached", T_PYSSIZET, offsetof(PoolBudgetObject, max_cached), 0,
     "cap on idle bytes: a block returned beyond it is freed"},
    {"on_full", T_OBJECT, offsetof(PoolBudgetObject, on_full), 0,
     "on_full(cls), called to make room when a block of size class cls returns to a full budget"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PoolBudget_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cai_mpi._src._bufexport.PoolBudget",
    .tp_basicsize = sizeof(PoolBudgetObject),
    .tp_dealloc = (destructor)budget_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PoolBudget(max_cached): the idle bytes of a host buffer pool and their cap.",
    .tp_methods = budget_methods,
    .tp_members = budget_members,
    .tp_new = budget_new,
};

/* ------------------------------------------------------------------------------------------
 * PoolLease: exports one pooled block; returns it to its free list when it dies.
 */
typedef struct {
    PyObject_HEAD
    Py_buffer block;            /* the block's memory; block.obj holds the block itself */
    PyObject *free_list;        /* where the block goes back */
    PoolBudgetObject *budget;
    Py_ssize_t cls;             /* the block's size class (its length) */
} PoolLeaseObject;

static PyTypeObject PoolLease_Type;

static int
lease_getbuffer(PoolLeaseObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->block.buf, self->block.len, 0, flags);
}

static PyBufferProcs lease_as_buffer = {
    (getbufferproc)lease_getbuffer,
    NULL,
};

static void
lease_dealloc(PoolLeaseObject *self)
{
    PyObject *block = self->block.obj;
    PoolBudgetObject *budget = self->budget;

    if (block != NULL) {
        Py_INCREF(block);
        PyBuffer_Release(&self->block);
        if (budget != NULL && self->cls <= budget->max_cached) {
            /* Deallocation may run while an exception is being raised: keep it. Failures here
               only mean the block is freed instead of pooled, so they are cleared, not reported
               (reporting would pass self, whose reference count is already zero). */
#if PY_VERSION_HEX >= 0x030C0000
            PyObject *exc = PyErr_GetRaisedException();
#else
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
#endif
            if (budget->cached + self->cls > budget->max_cached && budget->on_full != NULL &&
                budget->on_full != Py_None) {
                PyObject *cls = PyLong_FromSsize_t(self->cls);
                PyObject *res = cls != NULL ? PyObject_CallOneArg(budget->on_full, cls) : NULL;
                Py_XDECREF(cls);
                if (res == NULL) {
                    PyErr_Clear();
                }
                Py_XDECREF(res);
            }
            if (budget->cached + self->cls <= budget->max_cached) {
                if (PyList_Append(self->free_list, block) == 0) {
                    budget->cached += self->cls;
                } else {
                    PyErr_Clear();
                }
            }
#if PY_VERSION_HEX >= 0x030C0000
            PyErr_SetRaisedException(exc);
#else
            PyErr_Restore(type, value, tb);
#endif
        }
        Py_DECREF(block);
    }
    Py_XDECREF(self->free_list);
    Py_XDECREF(budget);
    PyObject_Free(self);
}

/* take_lease(free_list, budget, cls, new_block) -> PoolLease | None
 *
 * A lease on the last idle block of ``free_list`` (no longer counted as idle), else on
 * ``new_block`` (a fresh writable block of ``cls`` bytes), else (new_block None) None.
 */
static PyObject *
take_lease(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *free_list, *block;
    PoolBudgetObject *budget;
    PoolLeaseObject *lease;
    Py_ssize_t cls;

    (void)module;
    if (nargs != 4 || !PyList_Check(args[0]) || !PyObject_TypeCheck(args[1], &PoolBudget_Type)) {
        PyErr_SetString(PyExc_TypeError,
                        "take_lease(free_list: list, budget: PoolBudget, cls: int, new_block)");
        return NULL;
    }
    free_list = args[0];
    budget = (PoolBudgetObject *)args[1];
    cls = PyLong_AsSsize_t(args[2]);
    if (cls == -1 && PyErr_Occurred()) {
        return NULL;
    }
    block = budget_pop_block(budget, free_list, cls);
    if (block == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        if (args[3] == Py_None) {
            Py_RETURN_NONE;
        }
        block = args[3];
        Py_INCREF(block);
    }
    lease = PyObject_New(PoolLeaseObject, &PoolLease_Type);
    if (lease == NULL) {
        Py_DECREF(block);
        return NULL;
    }
    /* Until the lease is complete its dealloc returns nothing to the pool (budget NULL). */
    lease->block.obj = NULL;
    lease->free_list = NULL;
    lease->budget = NULL;
    if (PyObject_GetBuffer(block, &lease->block, PyBUF_WRITABLE) < 0) {
        lease->block.obj = NULL;
        Py_DECREF(block);
        Py_DECREF(lease);
        return NULL;
    }
    Py_DECREF(block); /* lease->block.obj holds it now */
    if (lease->block.len != cls) {
        PyErr_Format(PyExc_ValueError, "take_lease: a block of %zd bytes in size class %zd", lease->block.len,
                     cls);
        Py_DECREF(lease);
        return NULL;
    }
    Py_INCREF(free_list);
    lease->free_list = free_list;
    Py_INCREF(budget);
    lease->budget = budget;
    lease->cls = cls;
    return (PyObject *)lease;
}

static PyTypeObject PoolLease_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cai_mpi._src._bufexport.PoolLease",
    .tp_basicsize = sizeof(PoolLeaseObject),
    .tp_dealloc = (destructor)lease_dealloc,
    .tp_as_buffer = &lease_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A pooled block's memory (buffer protocol); the block goes back to its pool when this dies.",
};

static PyMethodDef module_methods[] = {
    {"take_lease", (PyCFunction)(void (*)(void))take_lease, METH_FASTCALL,
     "take_lease(free_list, budget, cls, new_block) -> a PoolLease on an idle block, else on new_block, "
     "else None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef bufexport_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cai_mpi._src._bufexport",
    .m_doc = "Buffer-protocol export base type for cai_mpi.Array (Python < 3.12 support), and the "
             "leases of the host receive pool.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__bufexport(void)
{
    PyObject *m;

    if (str_host_buffer_target == NULL) {
        str_host_buffer_target = PyUnicode_InternFromString("_host_buffer_target");
        if (str_host_buffer_target == NULL) {
            return NULL;
        }
    }
    if (str_host == NULL) {
        str_host = PyUnicode_InternFromString("host");
        if (str_host == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&BufferExporter_Type) < 0 || PyType_Ready(&PoolBudget_Type) < 0 ||
        PyType_Ready(&PoolLease_Type) < 0) {
        return NULL;
    }
    m = PyModule_Create(&bufexport_module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&BufferExporter_Type);
    if (PyModule_AddObject(m, "BufferExporter", (PyObject *)&BufferExporter_Type) < 0) {
        Py_DECREF(&BufferExporter_Type);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&PoolBudget_Type);
    if (PyModule_AddObject(m, "PoolBudget", (PyObject *)&PoolBudget_Type) < 0) {
        Py_DECREF(&PoolBudget_Type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
