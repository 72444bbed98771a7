"""What `prepare()` does to the model and optimizer: AMP, fused optimizers, compile, LAMB/LARS,
the shared-GPU memory budget, gang checkpoints."""
