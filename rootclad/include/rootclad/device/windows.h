// rootclad/device/windows.h — the scores of a Swin Transformer's shifted-window attention on
// the device (ops/window_geometry.h says what they are): one thread per score, per table
// element for its gradient.
#ifndef ROOTCLAD_DEVICE_WINDOWS_H
#define ROOTCLAD_DEVICE_WINDOWS_H

#include "../ops/window_geometry.h"
#include "core.h"

namespace rootclad {
namespace dev {

template <class On, class T>
void window_bias_forward(On on, T* out, const T* x, const T* table, long B, Win w);

// d_x (null: not wanted) += d_out; d_table (null: not wanted) += the sum over the batch
template <class On, class T>
void window_bias_backward(On on, T* d_x, T* d_table, const T* d_out, long B, Win w);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "windows_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_WINDOWS_H
