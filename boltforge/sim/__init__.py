"""Trace-driven simulation: replay job traces through the scheduling core on a simulated clock."""
