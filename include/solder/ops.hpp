// ops.hpp: every elementwise op solder defines (arithmetic, activations, comparisons, dropout);
// see docs/ops.md for each op's formula, derivative, NaN/Inf rule and kink convention.
#pragma once

#include "solder/ops/activations.hpp"
#include "solder/ops/arithmetic.hpp"
#include "solder/ops/compare.hpp"
#include "solder/ops/dropout.hpp"
