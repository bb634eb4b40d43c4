"""The pure scheduling core: topology, fleet state, gangs and placement. No I/O, no clock."""
