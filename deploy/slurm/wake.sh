#!/bin/sh
# slurm.conf's EpilogSlurmctld for Boltforge: slurmctld runs it (as SlurmUser, on the
# controller) each time a job ends; for a job of a managed partition it touches WAKE, the
# file `bolt slurm-bridge --wake-file` watches, so the bridge sees the end at once rather
# than at its next --poll and places what waits. Set MANAGED and WAKE as in job_submit.lua.
MANAGED="bolt"
WAKE="/run/boltforge/slurm-wake"
case ",$MANAGED," in
*",$SLURM_JOB_PARTITION,"*) touch "$WAKE" 2>/dev/null ;;
esac
exit 0
