// nn/criterion.hpp: the training losses as objects, so a chain's train_step takes any of them:
// each is called as loss(output, target, doutput), writes the gradient of the mean loss into
// doutput and returns the mean loss (the functions of nn/loss.hpp, with PyTorch's names).
#pragma once

#include <cstdint>
#include <span>

#include "solder/nn/loss.hpp"

namespace solder::nn {

/// torch.nn.CrossEntropyLoss(label_smoothing): softmax cross-entropy of logits [B, C] against
/// integer labels in [0, C) (a span or vector of int32).
struct cross_entropy_loss {
  float label_smoothing = 0.0f;
  template <FloatInput L, FloatOutput G>
  float operator()(const L& logits, std::span<const std::int32_t> labels, G&& dlogits) const {
    return softmax_cross_entropy(logits, labels, dlogits, label_smoothing);
  }
};

/// torch.nn.MSELoss(): mean squared error against a target of the output's shape.
struct mse_loss {
  template <FloatInput X, FloatInput T, FloatOutput G>
  float operator()(const X& input, const T& target, G&& dinput) const {
    return mse(input, target, dinput);
  }
};

/// torch.nn.BCEWithLogitsLoss(): binary cross-entropy on logits against probabilities of the
/// output's shape.
struct bce_with_logits_loss {
  template <FloatInput X, FloatInput T, FloatOutput G>
  float operator()(const X& input, const T& target, G&& dinput) const {
    return bce_with_logits(input, target, dinput);
  }
};

}  // namespace solder::nn
