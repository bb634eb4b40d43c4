"""Boltforge on an existing Slurm cluster: the Slurm bridge.

Slurm keeps its users' ``sbatch``, ``squeue`` and ``scancel``; ``deploy/slurm/job_submit.lua``
holds every job sent to the partitions Boltforge manages, and the bridge (``bolt slurm
bridge``) does the rest. To the control plane the bridge is the backend of those nodes: it
registers each Slurm node with its inventory and rack, keeps their leases while Slurm says
they respond, submits each held job as a gang, and carries out the intent the server holds
for the nodes (start a gang on exactly the nodes chosen, stop one with the checkpoint signal
and its grace, then requeue it held). What Slurm then does (started, finished, failed) comes
back as the replica reports an agent would send.

- ``model``: what ``squeue --json``, ``sinfo --json`` and ``topology.conf`` say, parsed.
- ``translate``: a Slurm node to an inventory, a held job to a job spec (pure).
- ``commands``: the Slurm commands the bridge runs.
- ``bridge``: the loop.
"""
