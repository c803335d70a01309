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

static struct PyModuleDef bufexport_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cai_mpi._src._bufexport",
    .m_doc = "Buffer-protocol export base type for cai_mpi.Array (Python < 3.12 support).",
    .m_size = -1,
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
    if (PyType_Ready(&BufferExporter_Type) < 0) {
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
    return m;
}
