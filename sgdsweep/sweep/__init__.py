"""From a YAML config to a validated sweep: schema, grid of points, identities, devices, plan,
cost, and the rounds of precision targets and edge searches."""
