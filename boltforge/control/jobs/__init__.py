"""Jobs entering and leaving: submission, intake, cancellation, restarts, budgets."""
