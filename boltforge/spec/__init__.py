"""YAML specs users write (fleets, jobs, fleet states), validated with clear, fixable errors."""
