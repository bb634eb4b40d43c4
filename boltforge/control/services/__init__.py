"""Inference services on the server: their rows, their load, and the autoscaler's loop."""
