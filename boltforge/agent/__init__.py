"""The node agent: registers a node's inventory, holds its lease, runs the replicas the control
plane assigns to it and reports what happened to them. It never decides placement.

- ``inventory``: GPUs through NVML, or a declared inventory file.
- ``processes``: a replica's environment, launch in its own process group, signals.
- ``preflight``: the node's checks before a replica starts (NVML, prolog scripts).
- ``hooks``: running prolog and epilog scripts with a timeout.
- ``cleanup``: after a replica ended, its leftover processes and shared memory files.
- ``leftovers``: the record of launched replicas, through which an agent restarted after it
  was killed finds the replicas it left running (and ends them before it registers).
- ``tails``: reading what replicas append to their log and progress files.
- ``replica``: one launched replica and what it has produced.
- ``outbox``: reports waiting to be sent, in order and bounded in memory.
- ``client``: the HTTP client for the agent endpoints.
- ``lease``: the session and the lease clock that fences replicas.
- ``converge``: which replicas to start and stop for a desired state (pure).
- ``loop``: the agent itself (register, heartbeat, long-poll, converge, monitor, report).
"""
