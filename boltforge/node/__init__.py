"""The node side of Boltforge, shared by every backend: the agent (one host), the Slurm
bridge (a Slurm cluster's nodes) and the Kubernetes scheduler (a cluster's Nodes).

- ``converge``: the pure rules that turn a node's desired state into starts, stops and
  stops of replicas that never started (reported as exited, once).
- ``follower``: following the server for any number of nodes: one batched long-poll of the
  desired states, batched heartbeats that renew the nodes' leases, and a report outbox
  that sends every node's events in one call and keeps what did not go through.
- ``backend``: ``NodeBackend``, the one thing that differs per kind of node: how a replica
  is started, stopped (with its grace), signalled and observed there;
- ``driver``: ``NodeDriver``, which keeps a ``NodeBackend``'s nodes registered, converged
  and reported with the parts above.

The Slurm bridge and the Kubernetes scheduler follow the server through ``follower``; all
three report a stop of a replica that never started with ``converge.never_started``; the
agent converges with ``converge.plan``.

See ``docs/architecture.md`` ("Writing a node backend") for a new backend's skeleton."""
