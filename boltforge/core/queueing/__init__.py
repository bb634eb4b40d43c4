"""The queue: ordering, fair share, quotas, lending, estimates and deadlines."""
