"""The learner: model + optimizer + objective + parallel strategy, on one torch.distributed rank."""
