// rootclad/uncaught.h — an exception nobody catches in a ROOT macro, reported as a ROOT error.
//
// `root -b -q macro.C` runs the macro without a handler: an exception that leaves it calls
// std::terminate, which aborts with "terminate called" and exit code 250, where an
// interactive session would have printed the message and gone on. rootclad's hosts
// (rootclad::Model, the readers) install, when first constructed in root.exe (Cling or
// ACLiC code; not PyROOT, whose process keeps C++'s own behaviour, nor a g++ program), a
// terminate handler that prints the exception as `Error in <rootclad>: ...` and ends the
// process with exit code 1.
//
// The handler is declared into the interpreter, with an object that installs it and puts the
// previous one back when Cling unloads that code (a macro run again, .U): a handler left
// pointing into unloaded code would make std::terminate jump into freed memory.
#ifndef ROOTCLAD_UNCAUGHT_H
#define ROOTCLAD_UNCAUGHT_H

#if defined(__CLING__) || defined(__ACLIC__)
#include <TApplication.h>
#include <TInterpreter.h>
#endif

namespace rootclad {
namespace detail {

inline void report_uncaught_in_root_sessions() {
#if defined(__CLING__) || defined(__ACLIC__)
  if (!gApplication || !gApplication->InheritsFrom("TRint") || !gInterpreter)
    return; // PyROOT, or a program that made no ROOT session
  static const char* handler = R"cxx(
#ifndef ROOTCLAD_UNCAUGHT_HANDLER
#define ROOTCLAD_UNCAUGHT_HANDLER
#include <TError.h>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
namespace rootclad_session {
[[noreturn]] inline void report_uncaught() {
  std::string what = "an exception that is not a std::exception";
  try {
    if (std::exception_ptr e = std::current_exception())
      std::rethrow_exception(e);
    what = "std::terminate called without an exception";
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  ::Error("rootclad", "uncaught exception, the macro stopped: %s", what.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}
// installed while this code is loaded; Cling unloading it runs the destructor
struct Installed {
  std::terminate_handler previous = std::set_terminate(report_uncaught);
  ~Installed() { std::set_terminate(previous); }
};
static Installed installed;
}
#endif
)cxx";
  gInterpreter->Declare(handler);
#endif
}

} // namespace detail
} // namespace rootclad

#endif // ROOTCLAD_UNCAUGHT_H
