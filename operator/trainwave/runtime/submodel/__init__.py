"""The submodel allocator: train a model inside a device-memory budget.

`partition` cuts a sequential model into contiguous groups of roughly equal
peak memory; `executor` runs a training step group by group, keeping only the
active group's parameters, gradients, optimizer state and activations on the
device and the rest in host memory; `arbiter` is the node-local server that
gives jobs sharing one GPU turns on its memory.

This module imports nothing, so the arbiter server starts without torch.
"""
