// cuda.hpp: the CUDA backend added to the CPU library (nvcc only): device tensors,
// streams and copies (solder/device.hpp), assignments into device tensors as fused kernels,
// and the row ops, losses and optimizer updates on the device.
#pragma once

#include "solder/device.hpp"
#include "solder/eval/cuda/executor.hpp"
#include "solder/eval/cuda/row_kernels.hpp"
#include "solder/eval/cuda/update_kernels.hpp"
#include "solder/solder.hpp"
