--[[
Boltforge's hold on a Slurm cluster's GPU partitions.

Every job submitted to a partition Boltforge manages is held (priority 0) and tagged in its
comment, so Slurm's own scheduler leaves it alone; Boltforge's Slurm bridge reads the held
jobs, places each on the topology, and starts it on exactly the nodes it chose
(scontrol update NodeList=..., then scontrol release). Jobs to other partitions pass through.

Install: copy this file beside slurm.conf and add `JobSubmitPlugins=lua` to slurm.conf
(docs/slurm.md). Set MANAGED to the partitions Boltforge runs; a job that names no partition
counts as the cluster's default one, DEFAULT_PARTITION.

Only the bridge (root) releases a job it holds: slurm_job_modify refuses its user's release.

For every job it holds it also touches WAKE, the file `bolt slurm-bridge --wake-file` watches,
so the bridge reads the new job at once instead of at its next squeue poll. The directory must
be writable by SlurmUser; where it is missing, nothing is touched and the poll finds the job.
]]

local MANAGED = { bolt = true }
local DEFAULT_PARTITION = "bolt"
local TAG = "boltforge: held for placement"
local WAKE = "/run/boltforge/slurm-wake"

local function managed(partition)
    local p = partition or DEFAULT_PARTITION
    for name in string.gmatch(p, "[^,]+") do
        if not MANAGED[name] then
            return false
        end
    end
    return true
end

local function wake()
    local f = io.open(WAKE, "w")
    if f then
        f:close()
    end
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    if managed(job_desc.partition) then
        job_desc.priority = 0
        -- The QOS asked for is Boltforge's priority class; without slurmdbd Slurm drops it,
        -- so the tag keeps it.
        if job_desc.qos ~= nil and job_desc.qos ~= "" then
            job_desc.comment = TAG .. " [qos=" .. job_desc.qos .. "]"
        else
            job_desc.comment = TAG
        end
        wake()
    end
    return slurm.SUCCESS
end

-- A job Boltforge holds is started by the bridge alone (it runs as root): its user may not
-- release it (`scontrol release` sets its priority), or it would run where Slurm puts it,
-- outside Boltforge's placement, quotas and image policy. Its user may still hold it, cancel
-- it, change it, or move it to a partition Boltforge does not manage.
local NO_VAL = 4294967294 -- the priority of an update that does not change it
local BRIDGE_UID = 0

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    local priority = job_desc.priority
    local releases = priority ~= nil and priority ~= NO_VAL and priority ~= 0
    local stays = job_desc.partition == nil or managed(job_desc.partition)
    if modify_uid ~= BRIDGE_UID and releases and stays and managed(job_rec.partition) then
        slurm.log_user("boltforge: Boltforge starts the jobs of partition %s; it was not " ..
            "released. To have Slurm schedule it instead: scontrol update JobId=%s " ..
            "Partition=<another partition>", tostring(job_rec.partition), tostring(job_rec.job_id))
        return slurm.ESLURM_ACCESS_DENIED
    end
    return slurm.SUCCESS
end

slurm.log_info("boltforge job_submit.lua loaded")
return slurm.SUCCESS
