"""Placement: pure decisions about where workers go."""
