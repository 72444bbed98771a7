"""The kubelet side of the DRA driver gpu.trainwave.io: registration, prepare, CDI."""
