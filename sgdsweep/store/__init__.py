"""Storing results: point stores, the lanes that precision rounds extend, the aggregated
ensemble, provenance, export and import."""
