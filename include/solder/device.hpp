// device.hpp: device tensors, streams and copies; host code, compiles with any C++ compiler that
// finds cuda_runtime.h (programs link CUDA::cudart). Evaluating expressions into device tensors
// needs the CUDA backend as well (solder/cuda.hpp, compiled by nvcc).
#pragma once

#include "solder/eval/cuda/copy.hpp"
#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/memory.hpp"
#include "solder/eval/cuda/stream.hpp"
#include "solder/eval/cuda/tensor.hpp"
#include "solder/tensor.hpp"
