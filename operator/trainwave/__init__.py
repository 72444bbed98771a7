"""trainwave: a Kubernetes operator for distributed AI training jobs."""

__version__ = "0.1.0"
