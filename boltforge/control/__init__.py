"""The control plane: the API, the store, the scheduling loop, leases and reconciliation."""
