"""What the core reasons about: the topology tree, fleet state, gangs and jobs."""
