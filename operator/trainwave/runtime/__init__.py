"""The acceleration runtime: runs inside worker containers.

Imports torch, the standard library and `trainwave.contract` only (enforced by
import-linter): the init container copies this package into the worker, next
to whatever the user's image already has, so it must not drag the operator's
dependencies along.
"""
