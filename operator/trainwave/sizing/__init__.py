"""GPU sizing: memory and FLOPs of a training step, from a model description.

Pure. `trainwave size` prints it for people; the operator uses the same code
to fill in shared-GPU memory requests and to refuse jobs that fit nowhere.
"""
