"""Theory of the models: exact stationary moments, escape times and spectra at finite learning rate,
and the continuous-time laws they tend to; :mod:`sgdsweep.models.predict` gathers a point's numbers."""
