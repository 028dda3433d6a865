/* anybind's FFI shim: one XLA typed-FFI handler that calls compiled functions.
 *
 * Every compiled anybind op lowers to a custom call to the target
 * "anybind_compiled" with three attributes:
 *
 *   anybind_key   int64   which registered function to call (a hash of its stable name)
 *   anybind_name  string  that stable name (read only to report an unknown key)
 *   anybind_rows  int64   0: call once; R > 0: call once per row of a batch of R,
 *                         with operands whose leading axis is 1 broadcast over the batch
 *
 * and the handler calls the function with anybind's C calling convention
 * (documented in docs/guides/compiled.md and in _compiled.py):
 *
 *   int32_t fn(void *const *ins, void *const *outs, const int64_t *const *shapes,
 *              const int64_t *ranks, const int32_t *dtypes, int64_t n_in, int64_t n_out,
 *              char *err, int64_t err_size);
 *
 * Functions are registered from Python (anybind_register) when an op is bound,
 * in a fixed open-addressing table that is only ever appended to: entries are
 * written before their key is published with release semantics, and the
 * handler reads keys with acquire semantics, so lookups take no lock.
 * Registrations are serialised by the caller (a Python lock).
 *
 * Only XLA's C API header is included, so this file builds with any C compiler.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xla/ffi/api/c_api.h"

typedef int32_t (*anybind_fn)(void *const *ins, void *const *outs,
                              const int64_t *const *shapes, const int64_t *ranks,
                              const int32_t *dtypes, int64_t n_in, int64_t n_out,
                              char *err, int64_t err_size);

#define TABLE_SIZE 8192 /* a power of two */
#define ERR_SIZE 1024
#define STACK_OPERANDS 32

typedef struct {
  uint64_t key; /* 0: empty */
  anybind_fn fn;
  char *what; /* "anybind op 'f': the compiled jvp rule", for error messages */
} entry;

static entry table[TABLE_SIZE];

/* ------------------------------------------------------------ registry */

static entry *find(uint64_t key) {
  for (uint64_t i = 0; i < TABLE_SIZE; ++i) {
    entry *e = &table[(key + i) & (TABLE_SIZE - 1)];
    uint64_t k = __atomic_load_n(&e->key, __ATOMIC_ACQUIRE);
    if (k == key) return e;
    if (k == 0) return NULL;
  }
  return NULL;
}

/* 0: registered; 1: the key already holds another function; 2: the table is full. */
int32_t anybind_register(uint64_t key, void *fn, const char *what) {
  if (key == 0) key = 1;
  for (uint64_t i = 0; i < TABLE_SIZE; ++i) {
    entry *e = &table[(key + i) & (TABLE_SIZE - 1)];
    if (e->key == key) return e->fn == (anybind_fn)fn ? 0 : 1;
    if (e->key == 0) {
      size_t len = strlen(what);
      char *copy = malloc(len + 1);
      if (copy == NULL) return 2;
      memcpy(copy, what, len + 1);
      e->fn = (anybind_fn)fn;
      e->what = copy;
      __atomic_store_n(&e->key, key, __ATOMIC_RELEASE);
      return 0;
    }
  }
  return 2;
}

/* The FFI API version this shim was built against, for Python to report. */
int32_t anybind_api_version(void) { return XLA_FFI_API_MAJOR * 1000 + XLA_FFI_API_MINOR; }

/* Bumped with every change to this file, so that Python never loads a stale build. */
int32_t anybind_shim_version(void) { return 1; }

/* ------------------------------------------------------------- helpers */

static XLA_FFI_Error *fail(const XLA_FFI_Api *api, XLA_FFI_Error_Code code, const char *msg) {
  XLA_FFI_Error_Create_Args args;
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.extension_start = NULL;
  args.message = msg;
  args.errc = code;
  return api->XLA_FFI_Error_Create(&args);
}

static int64_t item_size(XLA_FFI_DataType t) {
  switch (t) {
    case XLA_FFI_DataType_PRED: case XLA_FFI_DataType_S8: case XLA_FFI_DataType_U8:
    case XLA_FFI_DataType_F8E5M2: case XLA_FFI_DataType_F8E3M4: case XLA_FFI_DataType_F8E4M3:
    case XLA_FFI_DataType_F8E4M3FN: case XLA_FFI_DataType_F8E4M3B11FNUZ:
    case XLA_FFI_DataType_F8E5M2FNUZ: case XLA_FFI_DataType_F8E4M3FNUZ:
    case XLA_FFI_DataType_F8E8M0FNU:
      return 1;
    case XLA_FFI_DataType_S16: case XLA_FFI_DataType_U16: case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16:
      return 2;
    case XLA_FFI_DataType_S32: case XLA_FFI_DataType_U32: case XLA_FFI_DataType_F32:
      return 4;
    case XLA_FFI_DataType_S64: case XLA_FFI_DataType_U64: case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_C64:
      return 8;
    case XLA_FFI_DataType_C128:
      return 16;
    default:
      return -1; /* sub-byte and token types have no row stride */
  }
}

static int attr_is(const XLA_FFI_ByteSpan *name, const char *want) {
  size_t n = strlen(want);
  return name->len == n && memcmp(name->ptr, want, n) == 0;
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

/* -------------------------------------------------------------- handler */

XLA_FFI_Error *anybind_handler(XLA_FFI_CallFrame *frame) {
  if (frame->struct_size < XLA_FFI_CallFrame_STRUCT_SIZE)
    return fail(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                "anybind: XLA's FFI call frame is older than the FFI headers anybind was "
                "built against; reinstall anybind against this jaxlib");
  if (frame->extension_start != NULL &&
      frame->extension_start->type == XLA_FFI_Extension_Metadata)
    return handshake(frame);
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;

  const XLA_FFI_Api *api = frame->api;
  uint64_t key = 0;
  int64_t rows = 0;
  const XLA_FFI_ByteSpan *name = NULL;
  for (int64_t i = 0; i < frame->attrs.size; ++i) {
    const XLA_FFI_ByteSpan *a = frame->attrs.names[i];
    if (frame->attrs.types[i] == XLA_FFI_AttrType_SCALAR) {
      const XLA_FFI_Scalar *s = (const XLA_FFI_Scalar *)frame->attrs.attrs[i];
      if (s->dtype != XLA_FFI_DataType_S64) continue;
      if (attr_is(a, "anybind_key")) key = *(const uint64_t *)s->value;
      else if (attr_is(a, "anybind_rows")) rows = *(const int64_t *)s->value;
    } else if (frame->attrs.types[i] == XLA_FFI_AttrType_STRING && attr_is(a, "anybind_name")) {
      name = (const XLA_FFI_ByteSpan *)frame->attrs.attrs[i];
    }
  }
  entry *e = find(key == 0 ? 1 : key);
  if (e == NULL) {
    char msg[512];
    snprintf(msg, sizeof msg,
             "anybind: no compiled function is registered under the name '%.*s' in this "
             "process; import the module that binds it (with ab.bind) before running a "
             "program that calls it",
             name ? (int)name->len : 1, name ? name->ptr : "?");
    return fail(api, XLA_FFI_Error_Code_NOT_FOUND, msg);
  }

  int64_t n_in = frame->args.size, n_out = frame->rets.size, n = n_in + n_out;
  void *ptr_stack[STACK_OPERANDS], *base_stack[STACK_OPERANDS];
  const int64_t *shape_stack[STACK_OPERANDS];
  int64_t rank_stack[STACK_OPERANDS], stride_stack[STACK_OPERANDS];
  int32_t dtype_stack[STACK_OPERANDS];
  void **ptrs = ptr_stack, **base = base_stack;
  const int64_t **shapes = shape_stack;
  int64_t *ranks = rank_stack, *strides = stride_stack;
  int32_t *dtypes = dtype_stack;
  void *heap = NULL;
  if (n > STACK_OPERANDS) {
    heap = malloc((size_t)n * (3 * sizeof(void *) + 2 * sizeof(int64_t) + sizeof(int32_t)));
    if (heap == NULL) return fail(api, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, "anybind: out of memory");
    ptrs = (void **)heap;
    base = ptrs + n;
    shapes = (const int64_t **)(base + n);
    ranks = (int64_t *)(shapes + n);
    strides = ranks + n;
    dtypes = (int32_t *)(strides + n);
  }

  for (int64_t i = 0; i < n; ++i) {
    const XLA_FFI_Buffer *b = i < n_in ? (const XLA_FFI_Buffer *)frame->args.args[i]
                                       : (const XLA_FFI_Buffer *)frame->rets.rets[i - n_in];
    base[i] = ptrs[i] = b->data;
    shapes[i] = b->dims;
    ranks[i] = b->rank;
    dtypes[i] = (int32_t)b->dtype;
  }

  char err[ERR_SIZE];
  err[0] = '\0';
  int32_t status = 0;
  int64_t row = 0;
  XLA_FFI_Error *error = NULL;
  if (rows == 0) {
    status = e->fn(ptrs, ptrs + n_in, shapes, ranks, dtypes, n_in, n_out, err, ERR_SIZE);
  } else {
    /* Row b of an operand whose leading axis is `rows`; operands with a leading
       axis of 1 are the same row for every b. */
    for (int64_t i = 0; i < n; ++i) {
      int64_t size = item_size((XLA_FFI_DataType)dtypes[i]);
      if (ranks[i] < 1 || size < 0 || (shapes[i][0] != rows && shapes[i][0] != 1)) {
        snprintf(err, sizeof err, "%s: operand %lld cannot be split into %lld rows",
                 e->what, (long long)i, (long long)rows);
        error = fail(api, XLA_FFI_Error_Code_INTERNAL, err);
        goto done;
      }
      strides[i] = size;
      for (int64_t d = 1; d < ranks[i]; ++d) strides[i] *= shapes[i][d];
      if (shapes[i][0] == 1 && rows != 1) strides[i] = 0;
      shapes[i] += 1;
      ranks[i] -= 1;
    }
    for (row = 0; row < rows && status == 0; ++row) {
      for (int64_t i = 0; i < n; ++i) ptrs[i] = (char *)base[i] + row * strides[i];
      status = e->fn(ptrs, ptrs + n_in, shapes, ranks, dtypes, n_in, n_out, err, ERR_SIZE);
    }
    row -= 1;
  }
  if (status != 0) {
    char msg[ERR_SIZE + 512];
    err[ERR_SIZE - 1] = '\0';
    char at[64] = "";
    if (rows > 0) snprintf(at, sizeof at, " at batch index %lld", (long long)row);
    snprintf(msg, sizeof msg, "%s returned status %d%s%s%s", e->what, (int)status, at,
             err[0] ? ": " : "", err);
    error = fail(api, XLA_FFI_Error_Code_INTERNAL, msg);
  }
done:
  free(heap);
  return error;
}
