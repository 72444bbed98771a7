"""Gradient communication: DDP comm hooks (compression, hierarchical allreduce), the cost
model and trials behind `auto`, joining the process group."""
