"""Boltforge on Kubernetes: a secondary scheduler for the pods that name it.

Pods that set ``schedulerName: boltforge`` are placed by the core as gangs on the topology
that node labels describe, bound through ``pods/binding``, preempted through the Eviction
API, and explained where Kubernetes users look (the pod's ``PodScheduled`` condition and
events). To the control plane the scheduler is the backend of the cluster's nodes, exactly
as the Slurm bridge is of Slurm's: it registers each node, carries out the intent the server
holds, and reports what the kubelet did.

- ``model``: Nodes, Pods, PodGroups, PriorityClasses and PodDisruptionBudgets, parsed.
- ``translate``: a Node into an inventory, a gang into a job spec, priorities (pure).
- ``gangs``: which pods are one gang, and when a gang is ready (pure).
- ``taints``, ``fit``: which nodes a pod may run on, and so which pools its gang (pure).
- ``budgets``: which gangs PodDisruptionBudgets protect, which evictions they refuse (pure).
- ``words``: why a pod waits, as its condition and events say it.
- ``informer``: list-then-watch caches; ``leader``: Lease-based leader election.
- ``actions``: the writes (bind, evict, conditions, events); ``state``: what a pass keeps.
- ``nodes``: Nodes registered, let go and cordoned as they change.
- ``scheduler``: the loop; ``shutdown``: SIGTERM; ``connect``: the API client.
"""
