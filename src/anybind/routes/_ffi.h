/* What anybind's two XLA FFI handlers share: _pycall.c (Python host code) and
 * _shim.c (compiled code). Both are plain C over XLA's FFI C API.
 *
 * ====================  ===================================================
 * piece                 what it does
 * ====================  ===================================================
 * ANYBIND_FFI_API_MINOR the FFI API version the handlers declare
 * fail                  an XLA_FFI_Error with a code and a message
 * handshake             the answer to XLA's metadata query at registration
 * PREAMBLE              what every handler does before its own work: check
 *                       the call frame, answer the handshake, skip the stages
 *                       other than execute
 * utf8_into             text as valid UTF-8 (other bytes as \xNN), so that
 *                       XLA's message decodes in Python whatever was written
 * ====================  ===================================================
 */
#ifndef ANYBIND_FFI_H
#define ANYBIND_FFI_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "xla/ffi/api/c_api.h"

/* The FFI API version the handlers declare: the oldest whose structs they use. XLA
   accepts a handler no newer than itself, and jaxlib 0.8-0.10 speak 0.1-0.3, so a
   handler built against newer headers still registers with an older jaxlib. */
#define ANYBIND_FFI_API_MINOR 1

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
  ext->metadata->api_version.minor_version = ANYBIND_FFI_API_MINOR;
  ext->metadata->traits = 0;
  return NULL;
}

/* The start of every handler: a call frame older than the headers is refused, XLA's
   metadata query at registration is answered, and every stage but execute is done. */
#define PREAMBLE(frame)                                                                  \
  do {                                                                                   \
    if ((frame)->struct_size < XLA_FFI_CallFrame_STRUCT_SIZE)                            \
      return fail((frame)->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,                     \
                  "anybind: XLA's FFI call frame is older than the FFI headers anybind " \
                  "was built against; reinstall anybind against this jaxlib");           \
    if ((frame)->extension_start != NULL &&                                              \
        (frame)->extension_start->type == XLA_FFI_Extension_Metadata)                    \
      return handshake(frame);                                                           \
    if ((frame)->stage != XLA_FFI_ExecutionStage_EXECUTE) return NULL;                   \
  } while (0)

/* `text` (len bytes, or up to its NUL when len < 0) as UTF-8 into out: valid
   sequences copied, any other byte (and NUL) as \xNN, so that XLA's message
   decodes in Python whatever a function wrote. Returns the length written. */
static size_t utf8_into(char *out, size_t size, const char *text, int64_t len) {
  const unsigned char *s = (const unsigned char *)text;
  size_t n = len < 0 ? strlen(text) : (size_t)len, o = 0;
  for (size_t i = 0; i < n && o + 5 < size;) {
    unsigned char c = s[i];
    size_t k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
             : (c & 0xF8) == 0xF0 ? 4 : 0;
    int ok = k > 0 && i + k <= n && c != 0 && !(k == 2 && c < 0xC2);
    for (size_t j = 1; ok && j < k; ++j) ok = (s[i + j] & 0xC0) == 0x80;
    if (ok && k == 3) {
      unsigned cp = ((c & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6);
      ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
    }
    if (ok && k == 4) {
      unsigned cp = ((c & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12);
      ok = cp >= 0x10000 && cp <= 0x10FFFF;
    }
    if (ok && o + k < size) {
      memcpy(out + o, s + i, k);
      o += k;
      i += k;
    } else if (ok) {
      break;
    } else {
      o += (size_t)snprintf(out + o, size - o, "\\x%02x", c);
      i += 1;
    }
  }
  out[o < size ? o : size - 1] = '\0';
  return o;
}

/* The NumPy name of an XLA_FFI_DataType code, for messages. */
static inline const char *anybind_dtype_name(int64_t code) {
  switch (code) {
    case XLA_FFI_DataType_PRED: return "bool";
    case XLA_FFI_DataType_S8: return "int8";
    case XLA_FFI_DataType_S16: return "int16";
    case XLA_FFI_DataType_S32: return "int32";
    case XLA_FFI_DataType_S64: return "int64";
    case XLA_FFI_DataType_U8: return "uint8";
    case XLA_FFI_DataType_U16: return "uint16";
    case XLA_FFI_DataType_U32: return "uint32";
    case XLA_FFI_DataType_U64: return "uint64";
    case XLA_FFI_DataType_F16: return "float16";
    case XLA_FFI_DataType_F32: return "float32";
    case XLA_FFI_DataType_F64: return "float64";
    case XLA_FFI_DataType_C64: return "complex64";
    case XLA_FFI_DataType_BF16: return "bfloat16";
    case XLA_FFI_DataType_C128: return "complex128";
    default: return "another dtype";
  }
}

#endif
