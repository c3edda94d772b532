"""Sharing finished sweeps: export one as a verifiable file, verify it, import it, merge exports
and open one where it lies. Above the sweep and analysis stages: an import rebuilds the sweep
from its config and a merge refits the merged ensemble."""
