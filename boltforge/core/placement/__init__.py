"""Placing gangs: the search over the topology, its costs, and its explanations."""
