/* anybind's FFI shim: one XLA typed-FFI handler that calls compiled functions.
 *
 * Every compiled anybind op lowers to a custom call to the target
 * "anybind_compiled" with these attributes:
 *
 *   anybind_key    int64   which binding to call: a key of this process, or, in a
 *                          program for jax.export, a hash of the op's stable name
 *   anybind_name   string  that stable name ("f", "f.jvp", ...): must be the binding's
 *   anybind_rows   int64   0: call once; R > 0: call once per row of a batch of R,
 *                          with operands whose leading axis is 1 broadcast over the batch;
 *                          -1: likewise, R being the outputs' leading axis (a batch of
 *                          symbolic size in a program for jax.export)
 *   anybind_debug  int64   (optional) 1: fill the outputs with a sentinel before the
 *                          call and name the elements still holding it after
 *   anybind_tree   string  (optional, export) the call's argument structure, for Python
 *                          to check operands it has not seen against the op's shape rule
 *   anybind_fingerprint  int64  (export) what the program was exported with: a hash of
 *                          the stable name, the function's own name and the version the
 *                          user gave (ab.bind(export_version=)); a call by stable name
 *                          runs only where its binding's fingerprint is the same
 *   anybind_state  int64   (an op with ab.State) the id of the op's state: the function
 *                          gets the pointer registered under it (anybind_state_set) as
 *                          a tenth argument; an id not registered, or dropped, is refused
 *
 * and the handler calls the function with anybind's C calling convention
 * (documented in docs/guides/compiled.md and in _compiled.py):
 *
 *   int32_t fn(void *const *ins, void *const *outs, const int64_t *const *shapes,
 *              const int64_t *ranks, const int32_t *dtypes, int64_t n_in, int64_t n_out,
 *              char *err, int64_t err_size);
 *
 * or, bound for an op with state, the same with `void *state` after err_size.
 *
 * The same target has a second handler for XLA's CUDA platform
 * (anybind_gpu_handler), for device code (ab.bind(..., device=True)): the
 * buffers are XLA's device buffers, and the function (a launcher, compiled by
 * nvcc or any other way) gets XLA's stream first, to launch its kernels on:
 *
 *   int32_t launch(void *stream, void *const *ins, void *const *outs, ...as above...);
 *
 * It must not synchronise the device: it queues work on the stream and returns.
 * Shapes, ranks and dtypes are host memory; the buffers are not. A binding is
 * for one of the two handlers (its `gpu` flag): a host function is never
 * called with device buffers, nor a launcher with host ones. Debug mode's
 * sentinel fill and check read and write the outputs, so the GPU handler does
 * not do them (the lowering does not ask it to).
 *
 * A deserialised program is untrusted: every call is checked against the
 * operands its binding allows (count, dtype and shape of every operand and
 * output, and the batch rows) before the function runs. Python adds them
 * (anybind_allow) as it lowers each call; for a binding by stable name it may
 * also be asked about operands it has not seen (the validator, which checks
 * them against the op's shape rule and allows them). Anything else is refused
 * with an error naming the op.
 *
 * Bindings, and states, live in open-addressing tables that grow (doubling) as they fill.
 * Nothing that a running call may read is ever freed: a binding changed by
 * name (anybind_bind again) is replaced, an outgrown table is kept, the
 * allowed operands of a binding are a list that is only appended to, and a
 * dropped state keeps its entry, marked dropped. Writers
 * are serialised by the caller (a Python lock); entries are published with
 * release semantics and read with acquire semantics, so lookups take no lock.
 *
 * Only XLA's C API header is included, so this file builds with any C compiler.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "_ffi.h"

typedef int32_t (*anybind_fn)(void *const *ins, void *const *outs,
                              const int64_t *const *shapes, const int64_t *ranks,
                              const int32_t *dtypes, int64_t n_in, int64_t n_out,
                              char *err, int64_t err_size);
typedef int32_t (*anybind_state_fn)(void *const *ins, void *const *outs,
                                    const int64_t *const *shapes, const int64_t *ranks,
                                    const int32_t *dtypes, int64_t n_in, int64_t n_out,
                                    char *err, int64_t err_size, void *state);

/* Device code: the same, after XLA's stream (a cudaStream_t). */
typedef int32_t (*anybind_gpu_fn)(void *stream, void *const *ins, void *const *outs,
                                  const int64_t *const *shapes, const int64_t *ranks,
                                  const int32_t *dtypes, int64_t n_in, int64_t n_out,
                                  char *err, int64_t err_size);

/* Asks Python whether operands not seen before are a valid call of the binding
   of `key`; 0: yes (Python has allowed them), else no, with a message in err. */
typedef int32_t (*anybind_validator)(uint64_t key, const char *tree, int64_t tree_len,
                                     int64_t rows, int64_t n_in, int64_t n_out,
                                     const int32_t *dtypes, const int64_t *ranks,
                                     const int64_t *const *shapes, char *err,
                                     int64_t err_size);

#define ERR_SIZE 1024
#define MSG_SIZE 2048
#define STACK_OPERANDS 32
#define SHOWN 10 /* unwritten elements named in a message, at most */

typedef struct allowed { /* one call a binding takes */
  struct allowed *next;
  int64_t rows, n_in, n_out, n_words;
  int64_t words[]; /* per operand: dtype, rank, dims */
} allowed;

typedef struct {
  void *fn; /* an anybind_fn, or (gpu) an anybind_gpu_fn */
  int64_t gpu; /* 1: device code, called by the GPU handler with XLA's stream */
  char *what; /* "anybind op 'f': the compiled jvp rule", for error messages */
  char *name; /* the stable name a call must give */
  size_t name_len;
  int64_t validate; /* 1: ask the validator about operands not allowed yet */
  uint64_t fingerprint; /* a by-name binding's: what a call by its name must carry */
  int64_t takes_state;  /* 1: called with the op's state as a tenth argument */
  allowed *first;
} binding;

typedef struct { /* an op's state: the pointer its compiled functions get */
  void *ptr;
  int32_t live; /* 0 once dropped (its op and programs gone, about to be freed) */
} state;

typedef struct {
  uint64_t key; /* 0: empty */
  void *b;      /* a binding, or a state */
} slot;

typedef struct {
  uint64_t size, used; /* size: a power of two */
  slot slots[];
} table;

static table *current = NULL; /* bindings */
static table *states = NULL;
static anybind_validator validator = NULL;

/* ------------------------------------------------------------ registry */

static slot *find(table *t, uint64_t key) {
  if (t == NULL) return NULL;
  for (uint64_t i = 0; i < t->size; ++i) {
    slot *s = &t->slots[(key + i) & (t->size - 1)];
    uint64_t k = __atomic_load_n(&s->key, __ATOMIC_ACQUIRE);
    if (k == key) return s;
    if (k == 0) return NULL;
  }
  return NULL;
}

static table *new_table(uint64_t size) {
  table *t = calloc(1, sizeof(table) + size * sizeof(slot));
  if (t != NULL) t->size = size;
  return t;
}

static void put(table *t, uint64_t key, void *b) {
  for (uint64_t i = 0;; ++i) {
    slot *s = &t->slots[(key + i) & (t->size - 1)];
    if (s->key == 0) {
      s->b = b;
      __atomic_store_n(&s->key, key, __ATOMIC_RELEASE);
      t->used += 1;
      return;
    }
  }
}

static char *copy_of(const char *s) {
  size_t n = strlen(s);
  char *c = malloc(n + 1);
  if (c != NULL) memcpy(c, s, n + 1);
  return c;
}

/* Set `key` to `value` in the table at `where`, replacing any value it had (which
   stays allocated: calls may hold it). 0: done; 2: out of memory. */
static int32_t insert(table **where, uint64_t key, void *value) {
  table *t = *where;
  slot *s = find(t, key);
  if (s != NULL) {
    __atomic_store_n(&s->b, value, __ATOMIC_RELEASE);
    return 0;
  }
  if (t == NULL || 2 * (t->used + 1) > t->size) { /* grow: a new table, the old one kept */
    table *g = new_table(t == NULL ? 1024 : 2 * t->size);
    if (g == NULL) return 2;
    for (uint64_t i = 0; t != NULL && i < t->size; ++i)
      if (t->slots[i].key != 0) put(g, t->slots[i].key, t->slots[i].b);
    __atomic_store_n(where, g, __ATOMIC_RELEASE);
    t = g;
  }
  put(t, key, value);
  return 0;
}

/* Bind `key` to `fn` (a new binding, with nothing allowed yet), replacing any
   binding it had; `gpu`: device code, for the GPU handler. 0: done; 2: out of memory. */
int32_t anybind_bind(uint64_t key, void *fn, const char *name, const char *what,
                     int64_t validate, uint64_t fingerprint, int64_t gpu,
                     int64_t takes_state) {
  if (key == 0) key = 1;
  binding *b = calloc(1, sizeof(binding));
  if (b == NULL) return 2;
  b->fn = fn;
  b->gpu = gpu;
  b->name = copy_of(name);
  b->what = copy_of(what);
  b->validate = validate;
  b->fingerprint = fingerprint;
  b->takes_state = takes_state;
  if (b->name == NULL || b->what == NULL) return 2;
  b->name_len = strlen(b->name);
  return insert(&current, key, b);
}

/* Register an op's state under `id` (not 0). 0: done; 2: out of memory; 3: id taken. */
int32_t anybind_state_set(uint64_t id, void *ptr) {
  if (id == 0) return 3;
  if (find(states, id) != NULL) return 3;
  state *st = malloc(sizeof(state));
  if (st == NULL) return 2;
  st->ptr = ptr;
  st->live = 1;
  return insert(&states, id, st);
}

/* Drop the state of `id`: calls naming it are refused from now on. 0: done; 1: unknown. */
int32_t anybind_state_drop(uint64_t id) {
  slot *s = find(states, id);
  if (s == NULL) return 1;
  state *st = __atomic_load_n(&s->b, __ATOMIC_ACQUIRE);
  __atomic_store_n(&st->live, 0, __ATOMIC_RELEASE);
  return 0;
}

static int same_call(const allowed *a, int64_t rows, int64_t n_in, int64_t n_out,
                     const int32_t *dtypes, const int64_t *ranks,
                     const int64_t *const *shapes) {
  if (a->rows != rows || a->n_in != n_in || a->n_out != n_out) return 0;
  int64_t p = 0;
  for (int64_t i = 0; i < n_in + n_out; ++i) {
    if (p + 2 > a->n_words || a->words[p] != dtypes[i] || a->words[p + 1] != ranks[i])
      return 0;
    if (p + 2 + ranks[i] > a->n_words) return 0;
    for (int64_t d = 0; d < ranks[i]; ++d)
      if (a->words[p + 2 + d] != shapes[i][d]) return 0;
    p += 2 + ranks[i];
  }
  return p == a->n_words;
}

/* Allow the binding of `key` a call: rows, then per operand dtype, rank, dims.
   0: done (or allowed already); 1: no such key; 2: out of memory; 3: malformed. */
int32_t anybind_allow(uint64_t key, int64_t rows, int64_t n_in, int64_t n_out,
                      const int64_t *words, int64_t n_words) {
  if (key == 0) key = 1;
  slot *s = find(current, key);
  if (s == NULL) return 1;
  binding *b = (binding *)s->b;
  int32_t dtypes[STACK_OPERANDS];
  int64_t ranks[STACK_OPERANDS];
  const int64_t *shapes[STACK_OPERANDS];
  if (n_in < 0 || n_out < 0 || n_in + n_out > STACK_OPERANDS) goto append; /* no dedup */
  int64_t p = 0;
  for (int64_t i = 0; i < n_in + n_out; ++i) {
    if (p + 2 > n_words || words[p + 1] < 0 || p + 2 + words[p + 1] > n_words) return 3;
    dtypes[i] = (int32_t)words[p];
    ranks[i] = words[p + 1];
    shapes[i] = words + p + 2;
    p += 2 + words[p + 1];
  }
  if (p != n_words) return 3;
  for (allowed *a = b->first; a != NULL; a = a->next)
    if (same_call(a, rows, n_in, n_out, dtypes, ranks, shapes)) return 0;
append:;
  allowed *a = malloc(sizeof(allowed) + (size_t)n_words * sizeof(int64_t));
  if (a == NULL) return 2;
  a->rows = rows;
  a->n_in = n_in;
  a->n_out = n_out;
  a->n_words = n_words;
  memcpy(a->words, words, (size_t)n_words * sizeof(int64_t));
  a->next = b->first;
  __atomic_store_n(&b->first, a, __ATOMIC_RELEASE);
  return 0;
}

void anybind_set_validator(void *fn) { validator = (anybind_validator)fn; }

/* The FFI API version this shim was built against, for Python to report. */
int32_t anybind_api_version(void) { return XLA_FFI_API_MAJOR * 1000 + XLA_FFI_API_MINOR; }

/* Bumped with every change to this file, so that Python never loads a stale build. */
int32_t anybind_shim_version(void) { return 8; }

/* ------------------------------------------------------------- helpers */

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

/* Whether an attribute's name is the literal `want` (its length known at compile time). */
#define ATTR_IS(name, want) \
  ((name)->len == sizeof(want) - 1 && memcmp((name)->ptr, want, sizeof(want) - 1) == 0)

/* "float64[4, 3]" into out. */
static void operand_into(char *out, size_t size, int32_t dtype, int64_t rank,
                         const int64_t *dims) {
  int o = snprintf(out, size, "%s[", anybind_dtype_name(dtype));
  for (int64_t d = 0; d < rank && o > 0 && (size_t)o < size; ++d)
    o += snprintf(out + o, size - o, d ? ", %lld" : "%lld", (long long)dims[d]);
  if (o > 0 && (size_t)o < size) snprintf(out + o, size - o, "]");
}

/* "float64[4], float64[4] -> float64[4]" of a call into out. */
static void call_into(char *out, size_t size, int64_t n_in, int64_t n_out,
                      const int32_t *dtypes, const int64_t *ranks,
                      const int64_t *const *shapes) {
  size_t o = 0;
  out[0] = '\0';
  for (int64_t i = 0; i < n_in + n_out && o + 80 < size; ++i) {
    if (i == n_in) o += (size_t)snprintf(out + o, size - o, i ? " -> " : "() -> ");
    else if (i) o += (size_t)snprintf(out + o, size - o, ", ");
    operand_into(out + o, size - o, dtypes[i], ranks[i], shapes[i]);
    o += strlen(out + o);
  }
}

/* --------------------------------------------------------- debug mode
 *
 * As core/_debug.py: the sentinel is a NaN with the payload 0xA5... for
 * floating and complex dtypes, the byte 0xA5 repeated for the others; an
 * element is unwritten when all its bytes (of either part, if complex) still
 * hold it. */

static int is_float(int32_t t) {
  return t == XLA_FFI_DataType_F16 || t == XLA_FFI_DataType_F32 ||
         t == XLA_FFI_DataType_F64 || t == XLA_FFI_DataType_C64 ||
         t == XLA_FFI_DataType_C128 || t == XLA_FFI_DataType_BF16;
}

/* The sentinel of one component of `t`, and that component's size in bytes. */
static uint64_t sentinel(int32_t t, int64_t *size) {
  int complex = t == XLA_FFI_DataType_C64 || t == XLA_FFI_DataType_C128;
  int64_t s = item_size((XLA_FFI_DataType)t) / (complex ? 2 : 1);
  uint64_t bytes = 0;
  for (int64_t i = 0; i < s; ++i) bytes = (bytes << 8) | 0xA5;
  *size = s;
  if (!is_float(t) || t == XLA_FFI_DataType_BF16) return bytes;
  int64_t bits = 8 * s, exp_bits = s == 2 ? 5 : s == 4 ? 8 : 11, mant = bits - 1 - exp_bits;
  uint64_t exp = ((((uint64_t)1) << exp_bits) - 1) << mant;
  uint64_t payload = (bytes & ((((uint64_t)1) << (mant - 1)) - 1)) | 1;
  return exp | payload;
}

static void fill(void *data, int32_t t, int64_t count) {
  int64_t s;
  uint64_t v = sentinel(t, &s);
  if (s <= 0) return;
  unsigned char *p = data;
  for (int64_t i = 0; i < count * (item_size((XLA_FFI_DataType)t) / s); ++i)
    memcpy(p + i * s, &v, (size_t)s); /* little-endian hosts, as XLA's CPU backend */
}

/* Count, and name in msg (from offset o), the unwritten elements of one output. */
static int64_t unwritten(const void *data, int32_t t, int64_t rank, const int64_t *dims,
                         char *msg, size_t size, size_t o) {
  int64_t s, count = 1, left = 0;
  uint64_t v = sentinel(t, &s);
  if (s <= 0) return 0;
  int64_t parts = item_size((XLA_FFI_DataType)t) / s;
  for (int64_t d = 0; d < rank; ++d) count *= dims[d];
  const unsigned char *p = data;
  for (int64_t i = 0; i < count; ++i) {
    int hit = 0;
    for (int64_t c = 0; c < parts && !hit; ++c) {
      uint64_t got = 0;
      memcpy(&got, p + (i * parts + c) * s, (size_t)s);
      hit = got == v;
    }
    if (!hit) continue;
    if (left < SHOWN && o + 64 < size) {
      o += (size_t)snprintf(msg + o, size - o, left ? ", [" : "[");
      int64_t rest = i, stride = count;
      for (int64_t d = 0; d < rank; ++d) {
        stride /= dims[d];
        o += (size_t)snprintf(msg + o, size - o, d ? ", %lld" : "%lld",
                              (long long)(rest / stride));
        rest %= stride;
      }
      o += (size_t)snprintf(msg + o, size - o, "]");
    }
    left += 1;
  }
  if (left > SHOWN && o + 32 < size)
    snprintf(msg + o, size - o, " and %lld more", (long long)(left - SHOWN));
  return left;
}

/* -------------------------------------------------------------- handler */

/* XLA's stream for this call (a cudaStream_t on CUDA), or NULL with *error set. */
static void *stream_of(XLA_FFI_CallFrame *frame, XLA_FFI_Error **error) {
  XLA_FFI_Stream_Get_Args args;
  args.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
  args.extension_start = NULL;
  args.ctx = frame->ctx;
  args.stream = NULL;
  *error = frame->api->XLA_FFI_Stream_Get(&args);
  return args.stream;
}

/* The binding's function on these buffers: a launcher gets the stream first, a function
   with a state gets it last. */
static int32_t call_fn(const binding *e, void *stream, void **ptrs, const int64_t **shapes,
                       const int64_t *ranks, const int32_t *dtypes, int64_t n_in,
                       int64_t n_out, char *err, void *state_ptr) {
  if (e->gpu)
    return ((anybind_gpu_fn)e->fn)(stream, ptrs, ptrs + n_in, shapes, ranks, dtypes, n_in,
                                   n_out, err, ERR_SIZE);
  if (e->takes_state)
    return ((anybind_state_fn)e->fn)(ptrs, ptrs + n_in, shapes, ranks, dtypes, n_in, n_out,
                                     err, ERR_SIZE, state_ptr);
  return ((anybind_fn)e->fn)(ptrs, ptrs + n_in, shapes, ranks, dtypes, n_in, n_out, err,
                             ERR_SIZE);
}

/* One call of a binding: by the CPU handler (gpu = 0), the CUDA one (gpu = 1), or the
   CUDA one's work on the CPU with no stream (gpu = 2, for tests). */
static XLA_FFI_Error *handle(XLA_FFI_CallFrame *frame, int64_t gpu) {
  PREAMBLE(frame);

  const XLA_FFI_Api *api = frame->api;
  uint64_t key = 0;
  int64_t rows = 0, debug = 0;
  uint64_t fingerprint = 0, state_id = 0;
  const XLA_FFI_ByteSpan *name = NULL, *tree = NULL;
  for (int64_t i = 0; i < frame->attrs.size; ++i) {
    const XLA_FFI_ByteSpan *a = frame->attrs.names[i];
    if (frame->attrs.types[i] == XLA_FFI_AttrType_SCALAR) {
      const XLA_FFI_Scalar *s = (const XLA_FFI_Scalar *)frame->attrs.attrs[i];
      if (s->dtype != XLA_FFI_DataType_S64) continue;
      if (ATTR_IS(a, "anybind_key")) key = *(const uint64_t *)s->value;
      else if (ATTR_IS(a, "anybind_rows")) rows = *(const int64_t *)s->value;
      else if (ATTR_IS(a, "anybind_debug")) debug = *(const int64_t *)s->value;
      else if (ATTR_IS(a, "anybind_fingerprint")) fingerprint = *(const uint64_t *)s->value;
      else if (ATTR_IS(a, "anybind_state")) state_id = *(const uint64_t *)s->value;
    } else if (frame->attrs.types[i] == XLA_FFI_AttrType_STRING) {
      if (ATTR_IS(a, "anybind_name")) name = (const XLA_FFI_ByteSpan *)frame->attrs.attrs[i];
      else if (ATTR_IS(a, "anybind_tree")) tree = (const XLA_FFI_ByteSpan *)frame->attrs.attrs[i];
    }
  }
  char msg[MSG_SIZE], called[512];
  slot *s = find(__atomic_load_n(&current, __ATOMIC_ACQUIRE), key == 0 ? 1 : key);
  binding *e = s == NULL ? NULL : (binding *)__atomic_load_n(&s->b, __ATOMIC_ACQUIRE);
  if (e == NULL || name == NULL || name->len != e->name_len ||
      memcmp(name->ptr, e->name, name->len) != 0) /* for the message: any bytes at all */
    utf8_into(called, sizeof called, name ? name->ptr : "?", name ? (int64_t)name->len : 1);
  if (e == NULL) {
    snprintf(msg, sizeof msg,
             "anybind: no compiled function is registered under the name '%s' in this "
             "process; import the module that binds it (with ab.bind) before running a "
             "program that calls it", called);
    return fail(api, XLA_FFI_Error_Code_NOT_FOUND, msg);
  }
  if (name == NULL || name->len != e->name_len || memcmp(name->ptr, e->name, name->len) != 0) {
    snprintf(msg, sizeof msg, "%s: a program called it as '%s', which is not its name; "
             "the program was not lowered by anybind for this op", e->what, called);
    return fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
  }
  if (e->validate && fingerprint != e->fingerprint) { /* a call by stable name: an export */
    snprintf(msg, sizeof msg,
             "%s: a program exported with %s under the name '%s' runs here (the program's "
             "fingerprint %016llx, this process's %016llx). Bind the function it was "
             "exported with, under the same export_version, or export the program again",
             e->what, fingerprint ? "another function or export_version"
                                  : "no fingerprint (by an older anybind)",
             e->name, (unsigned long long)fingerprint, (unsigned long long)e->fingerprint);
    return fail(api, XLA_FFI_Error_Code_FAILED_PRECONDITION, msg);
  }
  if (e->gpu != (gpu != 0)) {
    snprintf(msg, sizeof msg, "%s is %s, but a program compiled for %s called it", e->what,
             e->gpu ? "device code (device=True), a launcher given XLA's stream"
                    : "host code, given host buffers",
             gpu ? "a GPU" : "the CPU");
    return fail(api, XLA_FFI_Error_Code_FAILED_PRECONDITION, msg);
  }
  void *stream = NULL;
  if (gpu == 1) {
    XLA_FFI_Error *got = NULL;
    stream = stream_of(frame, &got);
    if (got != NULL) return got;
  }
  if (gpu) debug = 0; /* the outputs are device memory: see the top of this file */

  void *state_ptr = NULL;
  if (e->takes_state || state_id != 0) {
    slot *ss = find(__atomic_load_n(&states, __ATOMIC_ACQUIRE), state_id);
    state *st = ss == NULL ? NULL : (state *)__atomic_load_n(&ss->b, __ATOMIC_ACQUIRE);
    if (!e->takes_state || st == NULL || !__atomic_load_n(&st->live, __ATOMIC_ACQUIRE)) {
      snprintf(msg, sizeof msg, "%s: %s", e->what,
               !e->takes_state ? "a program passes it a state, but it takes none"
               : st == NULL ? "a program calls it with a state this process never made "
                              "(an op's ab.State lives in its process only)"
                            : "a program calls it with a state that was freed (its op and "
                              "every program holding it were gone)");
      return fail(api, XLA_FFI_Error_Code_FAILED_PRECONDITION, msg);
    }
    state_ptr = st->ptr;
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
    if (heap == NULL)
      return fail(api, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, "anybind: out of memory");
    ptrs = (void **)heap;
    base = ptrs + n;
    shapes = (const int64_t **)(base + n);
    ranks = (int64_t *)(shapes + n);
    strides = ranks + n;
    dtypes = (int32_t *)(strides + n);
  }

  XLA_FFI_Error *error = NULL;
  for (int64_t i = 0; i < n; ++i) {
    int buffer = i < n_in ? frame->args.types[i] == XLA_FFI_ArgType_BUFFER
                          : frame->rets.types[i - n_in] == XLA_FFI_RetType_BUFFER;
    if (!buffer) {
      snprintf(msg, sizeof msg, "%s: a program called it with %s %lld that is not an array",
               e->what, i < n_in ? "input" : "output", (long long)(i < n_in ? i : i - n_in));
      error = fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
      goto done;
    }
    const XLA_FFI_Buffer *b = i < n_in ? (const XLA_FFI_Buffer *)frame->args.args[i]
                                       : (const XLA_FFI_Buffer *)frame->rets.rets[i - n_in];
    base[i] = ptrs[i] = b->data;
    shapes[i] = b->dims;
    ranks[i] = b->rank;
    dtypes[i] = (int32_t)b->dtype;
  }

  if (rows < 0) { /* a batch of symbolic size: every output leads with it */
    if (n_out < 1 || ranks[n_in] < 1) {
      snprintf(msg, sizeof msg, "%s: a program called it by rows with no batched output",
               e->what);
      error = fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
      goto done;
    }
    rows = shapes[n_in][0];
    if (rows == 0) goto done; /* an empty batch: nothing to call */
  }

  /* Only calls the binding allows: those lowered in this process, or (by stable
     name) those the validator finds the op's shape rule gives. */
  int known = 0;
  for (allowed *a = __atomic_load_n(&e->first, __ATOMIC_ACQUIRE); a != NULL && !known;
       a = a->next)
    known = same_call(a, rows, n_in, n_out, dtypes, ranks, shapes);
  if (!known) {
    char err[ERR_SIZE], text[ERR_SIZE], operands[768];
    err[0] = '\0';
    int32_t status = 1;
    if (e->validate && validator != NULL)
      status = validator(key, tree ? tree->ptr : "", tree ? (int64_t)tree->len : 0, rows,
                         n_in, n_out, dtypes, ranks, shapes, err, ERR_SIZE);
    if (status != 0) {
      err[ERR_SIZE - 1] = '\0';
      utf8_into(text, sizeof text, err, -1);
      call_into(operands, sizeof operands, n_in, n_out, dtypes, ranks, shapes);
      snprintf(msg, sizeof msg, "%s was called with operands it does not take (%s%s): %s",
               e->what, operands, rows ? ", by rows" : "",
               text[0] ? text : "no program lowered in this process calls it so");
      error = fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
      goto done;
    }
  }

  if (debug)
    for (int64_t i = n_in; i < n; ++i) {
      int64_t count = 1;
      for (int64_t d = 0; d < ranks[i]; ++d) count *= shapes[i][d];
      fill(ptrs[i], dtypes[i], count);
    }

  char err[ERR_SIZE];
  err[0] = '\0';
  int32_t status = 0;
  int64_t row = 0;
  if (rows == 0) {
    status = call_fn(e, stream, ptrs, shapes, ranks, dtypes, n_in, n_out, err, state_ptr);
  } else {
    /* Row b of an operand whose leading axis is `rows`; operands with a leading
       axis of 1 are the same row for every b. */
    for (int64_t i = 0; i < n; ++i) {
      int64_t size = item_size((XLA_FFI_DataType)dtypes[i]);
      /* an output leads with the batch itself: one broadcast over it would let a
         tampered row count call the function any number of times on one row */
      if (ranks[i] < 1 || size < 0 ||
          (shapes[i][0] != rows && (shapes[i][0] != 1 || i >= n_in))) {
        snprintf(msg, sizeof msg, "%s: operand %lld cannot be split into %lld rows",
                 e->what, (long long)i, (long long)rows);
        error = fail(api, XLA_FFI_Error_Code_INTERNAL, msg);
        goto done;
      }
      strides[i] = size;
      for (int64_t d = 1; d < ranks[i]; ++d) strides[i] *= shapes[i][d];
      if (shapes[i][0] == 1 && rows != 1) strides[i] = 0;
      shapes[i] += 1;
      ranks[i] -= 1;
    }
    /* rows of nothing (every output empty): nothing to write, however many a
       program claims */
    int64_t out_bytes = 0;
    for (int64_t i = n_in; i < n; ++i) out_bytes += strides[i];
    if (out_bytes == 0) rows = 0;
    for (row = 0; row < rows && status == 0; ++row) {
      for (int64_t i = 0; i < n; ++i) ptrs[i] = (char *)base[i] + row * strides[i];
      status = call_fn(e, stream, ptrs, shapes, ranks, dtypes, n_in, n_out, err, state_ptr);
    }
    row -= 1;
    for (int64_t i = 0; i < n; ++i) { /* back to whole buffers, for the debug check */
      shapes[i] -= 1;
      ranks[i] += 1;
      ptrs[i] = base[i];
    }
  }
  if (status != 0) {
    char text[ERR_SIZE], at[64] = "";
    err[ERR_SIZE - 1] = '\0';
    utf8_into(text, sizeof text, err, -1);
    if (rows > 0) snprintf(at, sizeof at, " at batch index %lld", (long long)row);
    snprintf(msg, sizeof msg, "%s returned status %d%s%s%s", e->what, (int)status, at,
             text[0] ? ": " : "", text);
    error = fail(api, XLA_FFI_Error_Code_INTERNAL, msg);
    goto done;
  }
  for (int64_t i = n_in; debug && i < n; ++i) {
    int64_t count = 1;
    for (int64_t d = 0; d < ranks[i]; ++d) count *= shapes[i][d];
    int o = snprintf(msg, sizeof msg, "%s left ", e->what);
    char list[MSG_SIZE / 2];
    list[0] = '\0';
    int64_t left = unwritten(ptrs[i], dtypes[i], ranks[i], shapes[i], list, sizeof list, 0);
    if (left > 0) {
      snprintf(msg + o, sizeof msg - o, "%lld of %lld elements of output %lld unwritten: %s\n"
               "(debug mode: outputs are filled with a sentinel before a compiled function "
               "runs)", (long long)left, (long long)count, (long long)(i - n_in), list);
      error = fail(api, XLA_FFI_Error_Code_INTERNAL, msg);
      goto done;
    }
  }
done:
  free(heap);
  return error;
}

XLA_FFI_Error *anybind_handler(XLA_FFI_CallFrame *frame) { return handle(frame, 0); }

XLA_FFI_Error *anybind_gpu_handler(XLA_FFI_CallFrame *frame) { return handle(frame, 1); }

/* The CUDA handler's work on the CPU, with a NULL stream: device code's calls (which
   binding, which operands, by rows, errors) tested where there is no GPU. */
XLA_FFI_Error *anybind_gpu_handler_on_cpu(XLA_FFI_CallFrame *frame) {
  return handle(frame, 2);
}
