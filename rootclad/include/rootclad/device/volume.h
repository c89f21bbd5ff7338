// rootclad/device/volume.h — Conv3d, MaxPool3d and AvgPool3d as device kernels: one thread per
// element of ops/volume_geometry.h (device_kernels.h says how they are written). The
// convolution's gradients gather (an input or weight element per thread); the pools' backward
// scatters through add_to.
#ifndef ROOTCLAD_DEVICE_VOLUME_H
#define ROOTCLAD_DEVICE_VOLUME_H

#include "../ops/volume_geometry.h"
#include "core.h"

namespace rootclad {
namespace dev {

template <class On, class T>
void conv3d_forward(On on, T* out, const T* inp, const T* w, const T* bias, long B, int C, int OC,
                    int G, Vol v);

template <class On, class T>
void conv3d_backward_input(On on, T* d_inp, const T* d_out, const T* w, long B, int C, int OC,
                           int G, Vol v);

// d_w and d_bias (either may be null): one thread per weight element, then per channel
template <class On, class T>
void conv3d_backward_params(On on, T* d_w, T* d_bias, const T* d_out, const T* inp, long B, int C,
                            int OC, int G, Vol v);

template <class On, class T> void maxpool3d_forward(On on, T* out, const T* inp, long R, Vol v);

template <class On, class T>
void maxpool3d_backward(On on, T* d_inp, const T* d_out, const T* inp, long R, Vol v);

template <class On, class T>
void avgpool3d_forward(On on, T* out, const T* inp, long R, int count_include_pad, Vol v);

template <class On, class T>
void avgpool3d_backward(On on, T* d_inp, const T* d_out, long R, int count_include_pad, Vol v);

} // namespace dev
} // namespace rootclad

#ifndef ROOTCLAD_DECLARATIONS_ONLY // a device program declares; the device runtime defines
#include "volume_impl.h"
#endif

#endif // ROOTCLAD_DEVICE_VOLUME_H
