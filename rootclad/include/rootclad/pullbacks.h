// rootclad/pullbacks.h — Clad custom derivatives for every kernel: each op's pullback is at
// the end of its family's header (ops/*.h), so this is kernels.h itself, kept as the name the
// engines and users include.
#ifndef ROOTCLAD_PULLBACKS_H
#define ROOTCLAD_PULLBACKS_H

#include "kernels.h"

#endif // ROOTCLAD_PULLBACKS_H
