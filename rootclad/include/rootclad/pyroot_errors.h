// ROOT's messages from C++ that Python called with the GIL released (rootclad's readers and
// score_tree), or from ROOT's own threads. PyROOT's error handler turns a warning into a Python
// warning, which needs the GIL: without it the process died (a truncated file's "trying to
// recover" warning during score_tree). This handler passes a message on to PyROOT's only in a
// thread holding the GIL, and prints it as ROOT does otherwise. For Cling in a Python process
// only (rootclad.data.cling installs it): it calls the Python C API.
#ifndef ROOTCLAD_PYROOT_ERRORS_H
#define ROOTCLAD_PYROOT_ERRORS_H

#include "TError.h"

extern "C" int PyGILState_Check(void);

namespace rootclad::detail {

inline ErrorHandlerFunc_t& python_error_handler() {
  static ErrorHandlerFunc_t handler = nullptr;
  return handler;
}

inline void gil_safe_error_handler(int level, Bool_t abort, const char* location, const char* msg) {
  if (python_error_handler() && PyGILState_Check())
    python_error_handler()(level, abort, location, msg);
  else
    DefaultErrorHandler(level, abort, location, msg);
}

// Wraps the handler in place (PyROOT's); once, whatever the number of calls.
inline void install_gil_safe_error_handler() {
  if (GetErrorHandler() == &gil_safe_error_handler)
    return;
  python_error_handler() = GetErrorHandler();
  SetErrorHandler(&gil_safe_error_handler);
}

} // namespace rootclad::detail

#endif // ROOTCLAD_PYROOT_ERRORS_H
