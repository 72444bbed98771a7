"""Input pipeline: loader defaults from the pod's CPU quota, the H2D prefetcher, the
length-grouped sampler."""
