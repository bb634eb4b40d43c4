"""Inference services: how many replicas a service should run, from its load and history."""
