"""From a YAML config to a validated sweep: schema, grid of points, identities, plan, cost."""
