"""Capacity planning: queueing models and the simulation of scaling policies (issue 14)."""
