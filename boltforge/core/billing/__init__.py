"""What holding GPUs costs: the meter and what sharing saved."""
