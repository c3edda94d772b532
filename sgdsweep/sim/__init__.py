"""Simulating points: the engine and its compiled kernels, noise, random streams, observables, estimators."""
