"""The launcher's parts: the environment it prepares for training, the pod's annotations, /status.

`trainwave.runtime.launch` (run as `python -m`) is the entry point; these are
its internals.
"""
