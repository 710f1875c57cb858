"""Training health: loss and gradient-norm divergence."""
