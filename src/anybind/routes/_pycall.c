/* anybind's Python FFI handler: host code called on XLA's buffers with no jaxlib layer.
 *
 * Python host code lowers to a custom call to the target "anybind_python" with
 * one attribute:
 *
 *   anybind_callback  int64  the key of the callable in the registry: a dict set
 *                            from Python (_pyffi.py) of key -> (weak reference to
 *                            the callable, its signature, what it is: "anybind op
 *                            'f': the jvp rule"); keys are random 63-bit numbers
 *
 * On the execute stage the handler takes the GIL, checks the call's operands
 * against the signature registered with the callable (count, dtypes, shapes:
 * the key may come from a crafted program), makes NumPy arrays over XLA's
 * buffers without copying (inputs read-only, outputs writable), calls
 *
 *   callable(ins: list[ndarray], outs: list[ndarray])
 *
 * and turns a Python exception into an XLA error whose message is that of the
 * HostError, or "<what> raised <module>.<type>: <text>" of another exception.
 * The callable's result is ignored.
 *
 * Every view's base is a lease (below). An input's lease is read-only all the
 * way down, so that no flag host code sets makes an input view writable: the
 * caller's JAX array cannot change. XLA reuses the buffers once the call
 * returns, so a view, or a view derived from one, that host code keeps past
 * the call is caught there: a kept view, and every view derived from one that
 * Python can find (_host.repoint_kept), is pointed at a private copy of its
 * data, and the call fails with a HostError naming the op and the operand
 * (_host.kept_views).
 *
 * The registry, the table of NumPy dtypes by XLA dtype code and the hooks
 * (below) are set from Python (_pyffi.py). The registry holds callables weakly: the compiled
 * program holds them, as it holds XLA's own callbacks. Every access to them
 * happens with the GIL held, so the handler is safe to call from many threads at
 * once (XLA runs per-device calls concurrently).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "_ffi.h"

/* XLA's dims are int64_t, NumPy's npy_intp: the handler passes one as the other. */
_Static_assert(sizeof(npy_intp) == sizeof(int64_t), "anybind: npy_intp is not 64 bits");

#define N_DTYPES 64
#define STACK_OPERANDS 16
#define MSG_SIZE 4096

static PyObject *registry = NULL;             /* dict: int key -> weakref to a callable */
static PyArray_Descr *dtypes[N_DTYPES] = {0}; /* XLA_FFI_DataType -> NumPy dtype */

/* ---------------------------------------------------------------- leases
 *
 * Each view's base object is a lease: an empty NumPy array that ends a chain
 * of bases, so that every view NumPy derives from a view collapses its base to
 * the same lease. The views and their derived views thus hold a
 * reference to the view itself or to its lease. After the call the handler
 * owns one reference to each view and to each lease; any other means host code
 * kept a view of memory that XLA reuses once the call returns. Leases nobody
 * kept are reused (a free list per kind, under the GIL).
 *
 * An output's lease owns its (empty) data and is writable. An input's lease is
 * a read-only array over an empty bytes object: NumPy lets an array's WRITEABLE
 * flag be set again only where a base is writable or ends in a writable buffer,
 * and neither the lease nor the bytes is, so setflags(write=True) raises on an
 * input view, on every view derived from one, and on the lease itself.
 */

#define N_FREE 256
static PyObject *free_leases[2][N_FREE]; /* [writable] */
static int n_free[2] = {0, 0};
static PyObject *empty_bytes = NULL;

static PyObject *take_lease(int writable) {
  if (n_free[writable] > 0) return free_leases[writable][--n_free[writable]];
  npy_intp zero = 0;
  if (writable) return PyArray_SimpleNew(1, &zero, NPY_UINT8);
  PyObject *a = PyArray_NewFromDescr(&PyArray_Type, PyArray_DescrFromType(NPY_UINT8), 1,
                                     &zero, NULL, PyBytes_AS_STRING(empty_bytes),
                                     NPY_ARRAY_CARRAY_RO, NULL);
  if (a == NULL) return NULL;
  Py_INCREF(empty_bytes);
  if (PyArray_SetBaseObject((PyArrayObject *)a, empty_bytes) < 0) {
    Py_DECREF(a);
    return NULL;
  }
  return a;
}

static void give_back(PyObject *lease) {
  int w = PyArray_ISWRITEABLE((PyArrayObject *)lease) ? 1 : 0;
  if (Py_REFCNT(lease) == 1 && n_free[w] < N_FREE)
    free_leases[w][n_free[w]++] = lease;
  else
    Py_DECREF(lease); /* kept by a derived view: it goes when they do */
}

/* A NumPy array over one of XLA's buffers whose base is `lease` (a new
   reference), or NULL with an exception set. */
static PyObject *view(const XLA_FFI_Buffer *b, int writable, PyObject *lease) {
  int code = (int)b->dtype;
  PyArray_Descr *d = code >= 0 && code < N_DTYPES ? dtypes[code] : NULL;
  if (d == NULL)
    return PyErr_Format(PyExc_TypeError, "anybind: no NumPy dtype for XLA dtype code %d",
                        code);
  Py_INCREF(d); /* PyArray_NewFromDescr steals it */
  PyObject *a = PyArray_NewFromDescr(&PyArray_Type, d, (int)b->rank, (npy_intp *)b->dims,
                                     NULL, b->data,
                                     writable ? NPY_ARRAY_CARRAY : NPY_ARRAY_CARRAY_RO, NULL);
  if (a == NULL) return NULL;
  /* What PyArray_SetBaseObject does for a new view of foreign memory and a base
     that owns its data, without its checks: this runs for every operand. */
  Py_INCREF(lease);
  ((PyArrayObject_fields *)a)->base = lease;
  return a;
}

/* A list of views of `n` buffers; the handler's own references to the views
   and their leases go to `vs` and `ls` (NULL where not made). */
static PyObject *views(XLA_FFI_Buffer *const *buffers, int64_t n, int writable,
                       PyObject **vs, PyObject **ls) {
  PyObject *list = PyList_New((Py_ssize_t)n);
  if (list == NULL) return NULL;
  for (int64_t i = 0; i < n; ++i) {
    ls[i] = take_lease(writable);
    PyObject *a = ls[i] == NULL ? NULL : view(buffers[i], writable, ls[i]);
    if (a == NULL) {
      Py_DECREF(list);
      return NULL;
    }
    Py_INCREF(a);
    vs[i] = a;
    PyList_SET_ITEM(list, (Py_ssize_t)i, a);
  }
  return list;
}

/* Points array `a`, whose data lies in the `size` bytes at `start`, at the same
   place in `copy` (a byte-for-byte copy of them), so that reading it after the
   call reads what the buffer held, not memory that XLA has reused. 0 when `a`'s
   data lies elsewhere (nothing changed), 1 when done. */
static int repoint(PyObject *a, const char *start, npy_intp size, PyObject *copy) {
  PyArrayObject_fields *f = (PyArrayObject_fields *)a;
  if (f->data < start || f->data > start + size || (size > 0 && f->data == start + size))
    return 0;
  PyObject *old = f->base;
  f->data = PyArray_BYTES((PyArrayObject *)copy) + (f->data - start);
  Py_INCREF(copy);
  f->base = copy;
  Py_XDECREF(old);
  return 1;
}

/* ---------------------------------------------------------- messages */

/* str(obj) as UTF-8 (lone surrogates escaped) into msg; `fallback` if str fails.
   A pending exception stays pending. */
static void str_into(char *msg, size_t size, PyObject *obj, const char *fallback) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject *str = obj != NULL ? PyObject_Str(obj) : NULL;
  PyObject *bytes = str != NULL ? PyUnicode_AsEncodedString(str, "utf-8", "backslashreplace")
                                : NULL;
  if (bytes != NULL)
    utf8_into(msg, size, PyBytes_AS_STRING(bytes), (int64_t)PyBytes_GET_SIZE(bytes));
  else
    snprintf(msg, size, "%s", fallback);
  Py_XDECREF(bytes);
  Py_XDECREF(str);
  PyErr_Clear();
  PyErr_Restore(type, value, tb);
}

/* The pending exception, cleared, into msg: a HostError (which names its op
   itself) as "anybind.HostError: <text>", any other as "<what> raised
   <module>.<type>: <text>". */
static void describe_exception(char *msg, size_t size, const char *what) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  char name[256] = "exception", text[MSG_SIZE];
  if (type != NULL && PyType_Check(type)) {
    PyObject *mod = PyObject_GetAttrString(type, "__module__");
    const char *m = mod != NULL && PyUnicode_Check(mod) ? PyUnicode_AsUTF8(mod) : NULL;
    const char *q = ((PyTypeObject *)type)->tp_name;
    const char *dot = strrchr(q, '.');
    if (m != NULL && strcmp(m, "builtins") != 0)
      snprintf(name, sizeof name, "%s.%s", m, dot ? dot + 1 : q);
    else
      snprintf(name, sizeof name, "%s", dot ? dot + 1 : q);
    PyErr_Clear();
    Py_XDECREF(mod);
  }
  str_into(text, sizeof text, value, "(its str() failed)");
  if (strcmp(name, "anybind.HostError") == 0)
    snprintf(msg, size, "%s: %.3500s", name, text);
  else
    snprintf(msg, size, "%.400s raised %.200s: %.3400s", what, name, text);
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}

/* ------------------------------------------------------- signatures
 *
 * A callable's signature, registered with it (_pyffi.register), is a bytes
 * object of int64: n_in, n_out, then per operand its XLA dtype code, its rank
 * and its dims (-1: any extent). A call whose operands differ is refused
 * before host code sees them: the key may come from a crafted program.
 */

static int shape_into(char *out, size_t size, int64_t code, int64_t rank, const int64_t *dims) {
  int o = snprintf(out, size, "%s[", anybind_dtype_name(code));
  for (int64_t d = 0; d < rank && o > 0 && (size_t)o < size; ++d) {
    if (dims[d] < 0)
      o += snprintf(out + o, size - o, d ? ", *" : "*");
    else
      o += snprintf(out + o, size - o, d ? ", %lld" : "%lld", (long long)dims[d]);
  }
  if (o > 0 && (size_t)o < size) snprintf(out + o, size - o, "]");
  return 0;
}

/* 0 when the frame's operands are those of the signature; else -1, with msg. */
static int check_signature(XLA_FFI_CallFrame *frame, PyObject *sig, PyObject *what_obj,
                           char *msg, size_t size) {
  char what[512];
  const int64_t *s = (const int64_t *)PyBytes_AS_STRING(sig);
  int64_t len = (int64_t)(PyBytes_GET_SIZE(sig) / (Py_ssize_t)sizeof(int64_t));
  int64_t n_in = frame->args.size, n_out = frame->rets.size;
  if (len < 2 || s[0] != n_in || s[1] != n_out) {
    str_into(what, sizeof what, what_obj, "anybind host code");
    snprintf(msg, size, "%s was called with %lld inputs and %lld outputs, but its program "
             "declared %lld and %lld; host code runs only on the operands its program "
             "declared", what, (long long)n_in, (long long)n_out,
             (long long)(len < 2 ? -1 : s[0]), (long long)(len < 2 ? -1 : s[1]));
    return -1;
  }
  int64_t p = 2;
  for (int64_t i = 0; i < n_in + n_out; ++i) {
    int input = i < n_in;
    int64_t j = input ? i : i - n_in;
    int is_buffer = input ? frame->args.types[j] == XLA_FFI_ArgType_BUFFER
                          : frame->rets.types[j] == XLA_FFI_RetType_BUFFER;
    const XLA_FFI_Buffer *b = is_buffer ? (input ? (const XLA_FFI_Buffer *)frame->args.args[j]
                                                 : (const XLA_FFI_Buffer *)frame->rets.rets[j])
                                        : NULL;
    if (p + 2 > len || p + 2 + s[p + 1] > len || s[p + 1] < 0) {
      str_into(what, sizeof what, what_obj, "anybind host code");
      snprintf(msg, size, "%s: its registered signature is malformed", what);
      return -1;
    }
    int64_t code = s[p], rank = s[p + 1];
    const int64_t *dims = s + p + 2;
    p += 2 + rank;
    int ok = b != NULL && (int64_t)b->dtype == code && b->rank == rank;
    for (int64_t d = 0; ok && d < rank; ++d) ok = dims[d] < 0 || dims[d] == b->dims[d];
    if (!ok) {
      char got[256] = "not an array", want[256];
      if (b != NULL) shape_into(got, sizeof got, (int64_t)b->dtype, b->rank, b->dims);
      shape_into(want, sizeof want, code, rank, dims);
      str_into(what, sizeof what, what_obj, "anybind host code");
      snprintf(msg, size, "%s was called with %s %lld of %s, but its program declared %s; "
               "host code runs only on the operands its program declared", what,
               input ? "input" : "output", (long long)j, got, want);
      return -1;
    }
  }
  return 0;
}

/* -------------------------------------------------------- after the call */

static PyObject *on_kept = NULL;    /* _host.kept_views(what, inputs, outputs): raises */
static PyObject *on_failure = NULL; /* _host.release_frames(exc, everything) */
static PyObject *on_derived = NULL; /* _host.repoint_kept([(lease, start, size, copy)]) */
static PyObject *on_held = NULL;    /* core._jax.collect_garbage(): jaxlib's garbage, freed */

static void release_frames(PyObject *exc, int everything) {
  if (on_failure == NULL || exc == NULL) return;
  PyObject *r = PyObject_CallFunction(on_failure, "Oi", exc, everything);
  Py_XDECREF(r);
  PyErr_Clear();
}

/* Whether view i (or one derived from it) is still held by anyone but the handler. */
static int derived_held(PyObject **vs, PyObject **ls, int64_t i) {
  PyArrayObject_fields *f = (PyArrayObject_fields *)vs[i];
  return Py_REFCNT(ls[i]) > 1 + (f->base == ls[i]);
}

/* What settle knows of one operand: whether host code kept its view or a view
   derived from it, and where a kept one's data was and now is. */
typedef struct {
  int kept;
  const char *start; /* the buffer */
  npy_intp size;
  PyObject *copy; /* a private copy of the buffer, or NULL */
} keeping;

/* Points every view derived from a kept operand's view that Python can find
   (_host.repoint_kept) at that operand's copy. */
static void repoint_derived(PyObject **vs, PyObject **ls, keeping *k, int64_t n) {
  PyObject *list = on_derived != NULL ? PyList_New(0) : NULL;
  for (int64_t i = 0; list != NULL && i < n; ++i) {
    if (k[i].copy == NULL || !derived_held(vs, ls, i)) continue;
    PyObject *t = Py_BuildValue("(OnnO)", ls[i], (Py_ssize_t)(uintptr_t)k[i].start,
                                (Py_ssize_t)k[i].size, k[i].copy);
    if (t != NULL) PyList_Append(list, t);
    Py_XDECREF(t);
  }
  if (list != NULL && PyList_GET_SIZE(list) > 0) {
    PyObject *r = PyObject_CallFunctionObjArgs(on_derived, list, NULL);
    Py_XDECREF(r);
  }
  Py_XDECREF(list);
  PyErr_Clear();
}

/* Host code left references to views of XLA's buffers. Every kept view, and
   every view derived from one that Python can find, is pointed at a private
   copy of its buffer (they stay valid). If the call failed, its exception's
   frames, which hold views, are released first (anybind's own frames; the
   user's too where they hold views derived from the buffers), and the
   exception stands. Otherwise any kept view is an error naming it. */
static void settle(PyObject **vs, PyObject **ls, int64_t n_in, int64_t n, PyObject *what,
                   int failed) {
  PyObject *type = NULL, *value = NULL, *tb = NULL;
  if (failed) {
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && tb != NULL) PyException_SetTraceback(value, tb);
    release_frames(value, 0);
  }
  int derived = 0;
  for (int64_t i = 0; i < n && !derived; ++i) derived = derived_held(vs, ls, i);
  if (failed && derived) release_frames(value, 1);
  keeping stack[STACK_OPERANDS], *k = stack;
  if (n > STACK_OPERANDS && (k = PyMem_Calloc((size_t)n, sizeof(keeping))) == NULL) {
    if (failed)
      PyErr_Restore(type, value, tb); /* its own error stands */
    else
      PyErr_NoMemory(); /* the call fails */
    return;
  }
  int any = 0;
  derived = 0;
  for (int64_t i = 0; i < n; ++i) {
    int der = derived_held(vs, ls, i);
    derived |= der;
    k[i].kept = Py_REFCNT(vs[i]) > 1 || der;
    k[i].start = PyArray_BYTES((PyArrayObject *)vs[i]);
    k[i].size = PyArray_NBYTES((PyArrayObject *)vs[i]);
    k[i].copy = k[i].kept ? PyArray_NewCopy((PyArrayObject *)vs[i], NPY_CORDER) : NULL;
    if (k[i].kept && k[i].copy == NULL) PyErr_Clear();
    any |= k[i].kept;
  }
  if (derived) repoint_derived(vs, ls, k, n);
  for (int64_t i = 0; i < n; ++i)
    if (k[i].copy != NULL && Py_REFCNT(vs[i]) > 1)
      repoint(vs[i], k[i].start, k[i].size, k[i].copy);
  PyObject *ins = failed || !any ? NULL : PyList_New(0);
  PyObject *outs = failed || !any ? NULL : PyList_New(0);
  for (int64_t i = 0; i < n; ++i) {
    Py_XDECREF(k[i].copy);
    PyObject *index = ins != NULL && outs != NULL && k[i].kept
                          ? PyLong_FromLongLong(i < n_in ? i : i - n_in) : NULL;
    if (index != NULL) {
      PyList_Append(i < n_in ? ins : outs, index);
      Py_DECREF(index);
    }
  }
  if (k != stack) PyMem_Free(k);
  if (failed) {
    PyErr_Restore(type, value, tb);
    return;
  }
  if (!any) return;
  if (ins != NULL && outs != NULL && on_kept != NULL) {
    PyObject *r = PyObject_CallFunctionObjArgs(on_kept, what, ins, outs, NULL);
    Py_XDECREF(r);
  }
  if (!PyErr_Occurred())
    PyErr_SetString(PyExc_RuntimeError, "anybind: host code kept a view of XLA's buffers");
  Py_XDECREF(ins);
  Py_XDECREF(outs);
}

/* -------------------------------------------------------------- handler */

/* Whether anyone but the handler holds a view or its lease. */
static int still_held(PyObject **vs, PyObject **ls, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (Py_REFCNT(vs[i]) != 1 || Py_REFCNT(ls[i]) != 2) return 1;
  return 0;
}


static XLA_FFI_Error *handler(XLA_FFI_CallFrame *frame) {
  PREAMBLE(frame);

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
  char msg[MSG_SIZE], what_text[512];
#define WHAT (str_into(what_text, sizeof what_text, what, "anybind host code"), what_text)
  int64_t n_in = frame->args.size, n = n_in + frame->rets.size;
  PyObject *stack[2 * STACK_OPERANDS], **vs = stack, **ls = stack + STACK_OPERANDS;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *k = PyLong_FromLongLong(key), *ins = NULL, *outs = NULL, *res = NULL, *fn = NULL;
  PyObject *entry = k != NULL && registry != NULL ? PyDict_GetItemWithError(registry, k) : NULL;
  PyObject *what = NULL, *heap = NULL;
  if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3) entry = NULL;
  if (entry != NULL && PyWeakref_Check(PyTuple_GET_ITEM(entry, 0)) &&
      PyBytes_Check(PyTuple_GET_ITEM(entry, 1))) {
    PyObject *ref = PyTuple_GET_ITEM(entry, 0);
    Py_INCREF(entry); /* the registry may drop it while host code runs */
    what = PyTuple_GET_ITEM(entry, 2);
#if PY_VERSION_HEX >= 0x030D0000
    if (PyWeakref_GetRef(ref, &fn) < 0) fn = NULL;
#else
    fn = PyWeakref_GetObject(ref);
    fn = fn == Py_None ? NULL : fn;
    Py_XINCREF(fn);
#endif
  } else {
    entry = NULL;
  }
  if (fn == NULL) {
    if (PyErr_Occurred()) {
      describe_exception(msg, sizeof msg, WHAT);
    } else {
      snprintf(msg, sizeof msg, "anybind: no Python host callback %lld in this process (a "
               "program that calls Python host code runs only in the process that "
               "compiled it, while the program lives)", (long long)key);
    }
    error = fail(api, XLA_FFI_Error_Code_NOT_FOUND, msg);
    goto done;
  }
  if (check_signature(frame, PyTuple_GET_ITEM(entry, 1), what, msg, sizeof msg) < 0) {
    error = fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
    goto done;
  }
  if (n > STACK_OPERANDS) {
    heap = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(2 * n * sizeof(PyObject *)));
    if (heap == NULL) {
      describe_exception(msg, sizeof msg, WHAT);
      error = fail(api, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, msg);
      goto done;
    }
    vs = (PyObject **)PyBytes_AS_STRING(heap);
    ls = vs + n;
  }
  memset(vs, 0, (size_t)n * sizeof(PyObject *));
  memset(ls, 0, (size_t)n * sizeof(PyObject *));
  ins = views((XLA_FFI_Buffer *const *)frame->args.args, n_in, 0, vs, ls);
  if (ins != NULL)
    outs = views((XLA_FFI_Buffer *const *)frame->rets.rets, n - n_in, 1, vs + n_in, ls + n_in);
  if (outs != NULL) {
    PyObject *argv[2] = {ins, outs};
    res = PyObject_Vectorcall(fn, argv, 2, NULL);
    Py_CLEAR(ins);
    Py_CLEAR(outs);
    int held = still_held(vs, ls, n);
    if (held && res != NULL) { /* jaxlib's garbage (a NumPy array that a zero-copy transfer
                                  of host code's held, let go of without the GIL) or garbage
                                  awaiting the collector (reference cycles) may hold them; a
                                  failed call's frames are released instead (settle) */
      if (on_held != NULL) {
        PyObject *r = PyObject_CallNoArgs(on_held);
        Py_XDECREF(r);
        PyErr_Clear();
        held = still_held(vs, ls, n);
      }
      if (held) { /* a full collection costs tens of ms with large libraries loaded */
        PyGC_Collect();
        held = still_held(vs, ls, n);
      }
    }
    if (held) {
      settle(vs, ls, n_in, n, what, res == NULL);
      if (res != NULL && PyErr_Occurred()) Py_CLEAR(res);
    }
  }
  if (res == NULL) {
    describe_exception(msg, sizeof msg, WHAT);
    error = fail(api, XLA_FFI_Error_Code_INTERNAL, msg);
  }
  for (int64_t i = n - 1; i >= 0 && fn != NULL; --i) { /* the next call takes them in order */
    Py_XDECREF(vs[i]);
    if (ls[i] != NULL) give_back(ls[i]);
  }
done:
  Py_XDECREF(res);
  Py_XDECREF(outs);
  Py_XDECREF(ins);
  Py_XDECREF(heap);
  Py_XDECREF(fn);
  Py_XDECREF(entry);
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

static PyObject *py_set_hooks(PyObject *self, PyObject *args) {
  PyObject *kept, *failure, *derived, *held;
  if (!PyArg_ParseTuple(args, "OOOO", &kept, &failure, &derived, &held)) return NULL;
  Py_INCREF(kept);
  Py_INCREF(failure);
  Py_INCREF(derived);
  Py_INCREF(held);
  Py_XSETREF(on_held, held);
  Py_XSETREF(on_kept, kept);
  Py_XSETREF(on_failure, failure);
  Py_XSETREF(on_derived, derived);
  Py_RETURN_NONE;
}

static PyObject *py_repoint(PyObject *self, PyObject *args) {
  PyObject *a, *copy;
  Py_ssize_t start, size;
  if (!PyArg_ParseTuple(args, "O!nnO!", &PyArray_Type, &a, &start, &size, &PyArray_Type,
                        &copy))
    return NULL;
  if (size < 0 || PyArray_NBYTES((PyArrayObject *)copy) != size ||
      !PyArray_CHKFLAGS((PyArrayObject *)copy, NPY_ARRAY_OWNDATA))
    return PyErr_Format(PyExc_ValueError, "anybind: repoint needs a copy of the buffer");
  return PyBool_FromLong(repoint(a, (const char *)(uintptr_t)start, size, copy));
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
    {"set_hooks", py_set_hooks, METH_VARARGS,
     "set_hooks(kept, release, derived, held): called when host code kept views of XLA's "
     "buffers."},
    {"repoint", py_repoint, METH_VARARGS,
     "repoint(array, start, size, copy): point an array whose data lies in the buffer of "
     "`size` bytes at address `start` at the same place in `copy`, a copy of that buffer; "
     "whether it did."},
    {"set_dtype", py_set_dtype, METH_VARARGS, "set_dtype(xla_code, dtype)"},
    {"api_version", py_api_version, METH_NOARGS, "The FFI API version built against."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "anybind._pycall",
                                    "anybind's FFI handler for Python host code.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__pycall(void) {
  import_array();
  empty_bytes = PyBytes_FromStringAndSize("", 0);
  if (empty_bytes == NULL) return NULL;
  return PyModule_Create(&module);
}
