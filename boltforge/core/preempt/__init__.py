"""Preemption: who may be displaced, at what cost, and how to say so."""
