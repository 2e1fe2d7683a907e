// ops.hpp: every op solder defines: the elementwise ones (arithmetic, activations, comparisons,
// dropout), the row ones (softmax, layer norm, batch norm and its fold, losses), the pooling
// windows and the optimizer math; see docs/ops.md for each op's formula, derivative, NaN/Inf
// rule and kink convention.
#pragma once

#include "solder/ops/activations.hpp"
#include "solder/ops/arithmetic.hpp"
#include "solder/ops/batch_norm.hpp"
#include "solder/ops/compare.hpp"
#include "solder/ops/dropout.hpp"
#include "solder/ops/layer_norm.hpp"
#include "solder/ops/loss.hpp"
#include "solder/ops/optimizer.hpp"
#include "solder/ops/pool.hpp"
#include "solder/ops/softmax.hpp"
