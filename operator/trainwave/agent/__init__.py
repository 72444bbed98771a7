"""Node agent: discovers GPUs, NVLink islands and RDMA NICs and describes the node."""
