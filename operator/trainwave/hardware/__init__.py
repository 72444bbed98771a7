"""What the node agent, the in-pod doctor and placement agree on about a node's hardware.

Standard library and `trainwave.contract` only: the worker runtime copies this
package into training images next to the contract, so the doctor in the pod
and the agent on the node run the same checks, and the operator reads the
agent's inventory annotation through the same types the agent wrote it from.
"""
