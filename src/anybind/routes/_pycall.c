/* anybind's Python FFI handler: host code called on XLA's buffers with no jaxlib layer.
 *
 * Python host code lowers to a custom call to the target "anybind_python" with
 * one attribute:
 *
 *   anybind_callback  int64  the key of the callable in the registry: a dict of
 *                            weak references, set from Python (_hostffi.py)
 *
 * On the execute stage the handler takes the GIL, makes NumPy arrays over XLA's
 * buffers without copying (inputs read-only, outputs writable), calls
 *
 *   callable(ins: list[ndarray], outs: list[ndarray])
 *
 * and turns a Python exception into an XLA error whose message is
 * "<module>.<type>: <text>" of the exception. The callable's result is ignored.
 *
 * The registry and the table of NumPy dtypes by XLA dtype code are set from
 * Python (_hostffi.py). The registry holds callables weakly: the compiled
 * program holds them, as it holds XLA's own callbacks. Every access to them
 * happens with the GIL held, so the handler is safe to call from many threads at
 * once (XLA runs per-device calls concurrently).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "xla/ffi/api/c_api.h"

/* XLA's dims are int64_t, NumPy's npy_intp: the handler passes one as the other. */
_Static_assert(sizeof(npy_intp) == sizeof(int64_t), "anybind: npy_intp is not 64 bits");

#define N_DTYPES 64
#define MSG_SIZE 4096

static PyObject *registry = NULL;             /* dict: int key -> weakref to a callable */
static PyArray_Descr *dtypes[N_DTYPES] = {0}; /* XLA_FFI_DataType -> NumPy dtype */

/* ------------------------------------------------------------- helpers */

static XLA_FFI_Error *fail(const XLA_FFI_Api *api, XLA_FFI_Error_Code code, const char *msg) {
  XLA_FFI_Error_Create_Args args;
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.extension_start = NULL;
  args.message = msg;
  args.errc = code;
  return api->XLA_FFI_Error_Create(&args);
}

static XLA_FFI_Error *handshake(XLA_FFI_CallFrame *frame) {
  XLA_FFI_Metadata_Extension *ext = (XLA_FFI_Metadata_Extension *)frame->extension_start;
  if (ext->extension_base.struct_size < XLA_FFI_Metadata_Extension_STRUCT_SIZE ||
      ext->metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE)
    return fail(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                "anybind: XLA's FFI metadata is older than the FFI headers anybind was "
                "built against; reinstall anybind against this jaxlib");
  ext->metadata->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
  ext->metadata->api_version.extension_start = NULL;
  ext->metadata->api_version.major_version = XLA_FFI_API_MAJOR;
  ext->metadata->api_version.minor_version = XLA_FFI_API_MINOR;
  ext->metadata->traits = 0;
  return NULL;
}

/* A NumPy array over one of XLA's buffers (a new reference), or NULL with an
   exception set. */
static PyObject *view(const XLA_FFI_Buffer *b, int writable) {
  int code = (int)b->dtype;
  PyArray_Descr *d = code >= 0 && code < N_DTYPES ? dtypes[code] : NULL;
  if (d == NULL)
    return PyErr_Format(PyExc_TypeError, "anybind: no NumPy dtype for XLA dtype code %d",
                        code);
  Py_INCREF(d); /* PyArray_NewFromDescr steals it */
  return PyArray_NewFromDescr(&PyArray_Type, d, (int)b->rank, (npy_intp *)b->dims, NULL,
                              b->data, writable ? NPY_ARRAY_CARRAY : NPY_ARRAY_CARRAY_RO,
                              NULL);
}

static PyObject *views(XLA_FFI_Buffer *const *buffers, int64_t n, int writable) {
  PyObject *list = PyList_New((Py_ssize_t)n);
  if (list == NULL) return NULL;
  for (int64_t i = 0; i < n; ++i) {
    PyObject *a = view(buffers[i], writable);
    if (a == NULL) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SET_ITEM(list, (Py_ssize_t)i, a);
  }
  return list;
}

/* The pending exception as "<module>.<type>: <text>", cleared; into msg. */
static void describe_exception(char *msg, size_t size) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  const char *module = NULL, *name = "exception", *text = "";
  PyObject *mod = NULL, *qual = NULL, *str = NULL;
  if (type != NULL) {
    mod = PyObject_GetAttrString(type, "__module__");
    qual = PyObject_GetAttrString(type, "__qualname__");
    if (mod != NULL && PyUnicode_Check(mod)) module = PyUnicode_AsUTF8(mod);
    if (qual != NULL && PyUnicode_Check(qual)) name = PyUnicode_AsUTF8(qual);
  }
  if (value != NULL) str = PyObject_Str(value);
  if (str != NULL) text = PyUnicode_AsUTF8(str);
  if (text == NULL) text = "(its message cannot be shown)";
  if (module != NULL && strcmp(module, "builtins") != 0)
    snprintf(msg, size, "%s.%s: %s", module, name ? name : "?", text);
  else
    snprintf(msg, size, "%s: %s", name ? name : "?", text);
  PyErr_Clear();
  Py_XDECREF(mod);
  Py_XDECREF(qual);
  Py_XDECREF(str);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}

/* -------------------------------------------------------------- handler */

static XLA_FFI_Error *handler(XLA_FFI_CallFrame *frame) {
  if (frame->struct_size < XLA_FFI_CallFrame_STRUCT_SIZE)
    return fail(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                "anybind: XLA's FFI call frame is older than the FFI headers anybind was "
                "built against; reinstall anybind against this jaxlib");
  if (frame->extension_start != NULL &&
      frame->extension_start->type == XLA_FFI_Extension_Metadata)
    return handshake(frame);
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;

  const XLA_FFI_Api *api = frame->api;
  int64_t key = -1;
  for (int64_t i = 0; i < frame->attrs.size; ++i) {
    const XLA_FFI_ByteSpan *a = frame->attrs.names[i];
    if (frame->attrs.types[i] == XLA_FFI_AttrType_SCALAR && a->len == 16 &&
        memcmp(a->ptr, "anybind_callback", 16) == 0) {
      const XLA_FFI_Scalar *s = (const XLA_FFI_Scalar *)frame->attrs.attrs[i];
      if (s->dtype == XLA_FFI_DataType_S64) key = *(const int64_t *)s->value;
    }
  }

  XLA_FFI_Error *error = NULL;
  char msg[MSG_SIZE];
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *k = PyLong_FromLongLong(key), *ins = NULL, *outs = NULL, *res = NULL, *fn = NULL;
  PyObject *ref = k != NULL && registry != NULL ? PyDict_GetItemWithError(registry, k) : NULL;
  if (ref != NULL && PyWeakref_Check(ref)) {
#if PY_VERSION_HEX >= 0x030D0000
    if (PyWeakref_GetRef(ref, &fn) < 0) fn = NULL;
#else
    fn = PyWeakref_GetObject(ref);
    fn = fn == Py_None ? NULL : fn;
    Py_XINCREF(fn);
#endif
  }
  if (fn == NULL) {
    if (PyErr_Occurred()) {
      describe_exception(msg, sizeof msg);
    } else {
      snprintf(msg, sizeof msg, "anybind: no Python host callback %lld in this process (a "
               "program that calls Python host code runs only in the process that "
               "compiled it, while the program lives)", (long long)key);
    }
    error = fail(api, XLA_FFI_Error_Code_NOT_FOUND, msg);
    goto done;
  }
  ins = views((XLA_FFI_Buffer *const *)frame->args.args, frame->args.size, 0);
  if (ins != NULL) outs = views((XLA_FFI_Buffer *const *)frame->rets.rets, frame->rets.size, 1);
  if (outs != NULL) {
    PyObject *argv[2] = {ins, outs};
    res = PyObject_Vectorcall(fn, argv, 2, NULL);
  }
  if (res == NULL) {
    describe_exception(msg, sizeof msg);
    error = fail(api, XLA_FFI_Error_Code_INTERNAL, msg);
  }
done:
  Py_XDECREF(res);
  Py_XDECREF(outs);
  Py_XDECREF(ins);
  Py_XDECREF(fn);
  Py_XDECREF(k);
  PyGILState_Release(gil);
  return error;
}

/* ---------------------------------------------------------------- module */

static PyObject *py_handler(PyObject *self, PyObject *noargs) {
  return PyCapsule_New((void *)&handler, NULL, NULL);
}

static PyObject *py_set_registry(PyObject *self, PyObject *dict) {
  if (!PyDict_Check(dict)) return PyErr_Format(PyExc_TypeError, "expected a dict");
  Py_INCREF(dict);
  Py_XSETREF(registry, dict);
  Py_RETURN_NONE;
}

static PyObject *py_set_dtype(PyObject *self, PyObject *args) {
  int code;
  PyObject *dtype;
  if (!PyArg_ParseTuple(args, "iO", &code, &dtype)) return NULL;
  if (code < 0 || code >= N_DTYPES) return PyErr_Format(PyExc_ValueError, "bad code %d", code);
  PyArray_Descr *d = NULL;
  if (!PyArray_DescrConverter(dtype, &d)) return NULL;
  Py_XSETREF(dtypes[code], d);
  Py_RETURN_NONE;
}

static PyObject *py_api_version(PyObject *self, PyObject *noargs) {
  return PyLong_FromLong(XLA_FFI_API_MAJOR * 1000 + XLA_FFI_API_MINOR);
}

static PyMethodDef methods[] = {
    {"handler", py_handler, METH_NOARGS, "The FFI handler, as a capsule for XLA."},
    {"set_registry", py_set_registry, METH_O, "The dict of callables by key."},
    {"set_dtype", py_set_dtype, METH_VARARGS, "set_dtype(xla_code, dtype)"},
    {"api_version", py_api_version, METH_NOARGS, "The FFI API version built against."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "anybind._pycall",
                                    "anybind's FFI handler for Python host code.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__pycall(void) {
  import_array();
  return PyModule_Create(&module);
}
