/*
 * cai_mpi._src._wirefast: the per-message header check of the receive hot path, in C.
 *
 * A stream of messages of one shape and dtype repeats one header byte for byte but for
 * the payload tag (an int32 at byte 24). recv_array keeps the last such header that
 * wire.decode_plain fully validated, with its tag bytes zeroed, as a "template"; a new
 * header equal to the template outside the tag field needs no decoding: only its tag is
 * read. In Python that comparison (two slices or startswith calls and a struct unpack)
 * cost half a microsecond per message, about 1% of a 1 MiB transfer's bandwidth.
 *
 * wire.py holds the pure-Python equivalent, used when this module was not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define TAG_OFFSET 24
#define TAG_END 28

/* plain_payload_tag(buf: bytearray, nbytes: int, template: bytes) -> int
 *
 * The payload tag of the header in buf[:nbytes] when it equals ``template`` outside
 * bytes 24-27 and the tag is not negative; otherwise -1.
 */
static PyObject *
plain_payload_tag(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const char *buf, *tmpl;
    Py_ssize_t n, tmpl_len;
    int32_t tag;

    (void)module;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "plain_payload_tag() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyByteArray_Check(args[0]) || !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "plain_payload_tag(buf: bytearray, nbytes: int, template: bytes)");
        return NULL;
    }
    n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    tmpl_len = PyBytes_GET_SIZE(args[2]);
    if (n != tmpl_len || n < TAG_END || n > PyByteArray_GET_SIZE(args[0])) {
        return PyLong_FromLong(-1);
    }
    buf = PyByteArray_AS_STRING(args[0]);
    tmpl = PyBytes_AS_STRING(args[2]);
    if (memcmp(buf, tmpl, TAG_OFFSET) != 0 || memcmp(buf + TAG_END, tmpl + TAG_END, (size_t)(n - TAG_END)) != 0) {
        return PyLong_FromLong(-1);
    }
    memcpy(&tag, buf + TAG_OFFSET, sizeof tag); /* the wire is little-endian */
#if PY_BIG_ENDIAN
    tag = (int32_t)(((uint32_t)tag >> 24) | (((uint32_t)tag >> 8) & 0xff00u) | (((uint32_t)tag << 8) & 0xff0000u) |
                    ((uint32_t)tag << 24));
#endif
    return PyLong_FromLong(tag < 0 ? -1 : (long)tag);
}

static PyMethodDef wirefast_methods[] = {
    {"plain_payload_tag", (PyCFunction)(void (*)(void))plain_payload_tag, METH_FASTCALL,
     "plain_payload_tag(buf, nbytes, template) -> the payload tag of buf[:nbytes] if it equals template "
     "outside bytes 24-27 (and is not negative), else -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef wirefast_module = {
    PyModuleDef_HEAD_INIT,
    "cai_mpi._src._wirefast",
    "The receive hot path's header check, in C (see wire.plain_payload_tag).",
    -1,
    wirefast_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__wirefast(void)
{
    return PyModule_Create(&wirefast_module);
}
