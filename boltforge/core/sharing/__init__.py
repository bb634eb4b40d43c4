"""GPU sharing: MIG instances and fractional shares of one GPU, placed beside whole-GPU work."""
