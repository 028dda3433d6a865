/* What anybind's two XLA FFI handlers share: _pycall.c (Python host code) and
 * _shim.c (compiled code). Both are plain C over XLA's FFI C API.
 *
 * ====================  ===================================================
 * piece                 what it does
 * ====================  ===================================================
 * ANYBIND_FFI_API_MINOR the FFI API version the handlers declare
 * fail                  an XLA_FFI_Error with a code and a message
 * handshake             the answer to XLA's metadata query at registration
 * ====================  ===================================================
 */
#ifndef ANYBIND_FFI_H
#define ANYBIND_FFI_H

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

#endif
