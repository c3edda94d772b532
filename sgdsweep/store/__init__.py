"""Storing results: point stores, the aggregated ensemble, provenance, export and import."""
