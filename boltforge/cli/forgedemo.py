"""``bolt demo --forge``: containerized work on GPU, CPU and storage nodes, end to end with the
bill. A server that accepts containers only (``--require-image``) and four agents running
podman: two 8-GPU hosts, a CPU node and a storage node. A job without an image is refused at
submit; a training container, a CPU batch container and a data pipeline each go to their
class; their artifacts come back with checked sha256; the bill meters GPU-hours, vCPU-hours
and dollars per job. Needs podman and the example image (``deploy/images/build.sh``)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.rule import Rule

from boltforge.cli import localfleet
from boltforge.cli.cost import print_cost
from boltforge.cli.demo import DemoError, in_fleet, stop_fleet
from boltforge.cli.localfleet import LocalFleet, Node
from boltforge.cli.story import Story, describer
from boltforge.client import ApiFailure, Client
from boltforge.wire.jobs import TERMINAL, JobDetail, SubmitRequest

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "examples" / "forge"
IMAGE = "localhost/boltforge-train:latest"
LIMIT_S = 240.0
PODMAN = ("--runtime", "podman")
CPU_NODE = (
    "name: cpu-0\npool: batch\nnode_class: cpu\ngpus: 0\ncpus: 64\nmemory_gb: 256\npod: p0\n"
    "rack: r1\ntier: on-demand\nprice_per_vcpu_hour: 0.048\naddress: 127.0.0.1\n"
)
STORAGE_NODE = (
    "name: store-0\npool: data\nnode_class: storage\ngpus: 0\ncpus: 32\nmemory_gb: 256\n"
    "storage_gb: 30000\nstorage_gbps: 12\npod: p0\nrack: r1\ntier: on-demand\n"
    "price_per_vcpu_hour: 0.09\naddress: 127.0.0.1\n"
)


def nodes() -> list[Node]:
    """Two H100 hosts, a CPU node and a storage node, every agent on podman."""
    gpus = [Node(f"host-{i}", localfleet.inventory(i), PODMAN) for i in range(2)]
    return [*gpus, Node("cpu-0", CPU_NODE, PODMAN), Node("store-0", STORAGE_NODE, PODMAN)]


def engine_problem() -> str | None:
    """Why the demo cannot run containers here (None when it can)."""
    if shutil.which("podman") is None:
        return "podman is not installed. To fix: apt-get install podman runc catatonit"
    run = subprocess.run(["podman", "image", "exists", IMAGE], capture_output=True, check=False)
    if run.returncode != 0:
        return f"image {IMAGE} is not built. To fix: run deploy/images/build.sh podman"
    return None


def run_forge_demo(console: Console) -> int:
    """Start the fleet in a temporary directory, run the three jobs, print the bill, stop.
    Returns 0 when every job succeeded and brought its artifacts back."""
    console.print(Rule("Boltforge demo: containers on GPU, CPU and storage nodes", align="left"))
    problem = engine_problem()
    if problem is not None:
        console.print(f"[bold red]error[/] {escape(problem)}", highlight=False)
        return 2
    return in_fleet(console, lambda root: _start(console, root), lambda f: _tell(console, f))


def _start(console: Console, root: Path) -> LocalFleet:
    port = localfleet.free_port()
    fleet = localfleet.start(root, 0, port, nodes=nodes(), server_args=("--require-image",))
    try:
        localfleet.wait_ready(fleet)
    except BaseException:
        stop_fleet(console, fleet)
        raise
    console.print("fleet up: 2 GPU hosts (16 GPUs), a CPU node, a storage node; podman")
    return fleet


def _tell(console: Console, fleet: LocalFleet) -> bool:
    with Client(fleet.url, fleet.admin_token) as client:
        console.print(Rule(style="dim"))
        _refused(console, client)
        story = Story(console, fleet.url, fleet.admin_token, base=time.time())
        try:
            jobs = [_submit(console, client, story, f) for f in ("train", "batch", "pipeline")]
            _follow(story, client, jobs)
        finally:
            story.close()
        console.print(Rule(style="dim"))
        ok = all([_where(console, client, job) for job in jobs])  # every job told
        console.print(Rule("the bill", style="dim", align="left"))
        bill = client.cost(by="job", since="1h")
        print_cost(bill)
        for row in bill.rows:  # the table rounds; seconds-long jobs need more places
            console.print(
                f"job {row.key} {row.name}: {row.gpu_hours:.5f} GPU-h, {row.vcpu_hours:.5f} "
                f"vCPU-h, ${row.dollars:.5f}",
                highlight=False,
            )
    return ok


def _refused(console: Console, client: Client) -> None:
    """Submit the job without an image and show the server's refusal."""
    text = (JOBS / "plain.yaml").read_text()
    try:
        client.submit(SubmitRequest(yaml=text, source="plain.yaml"))
    except ApiFailure as e:
        console.print("plain.yaml (no image) is refused at submit:", highlight=False)
        for p in e.problems:
            console.print(f"  {p.field}: {p.message}", highlight=False, soft_wrap=True)
        return
    raise DemoError("the server accepted a job without an image")


def _submit(console: Console, client: Client, story: Story, name: str) -> str:
    text = (JOBS / f"{name}.yaml").read_text()
    reply = client.submit(SubmitRequest(yaml=text, source=f"{name}.yaml"))
    console.print(f"submitted examples/forge/{name}.yaml: job {reply.job.id}", highlight=False)
    story.follow(reply.job.id)
    return reply.job.id


def _follow(story: Story, client: Client, jobs: list[str]) -> None:
    """Tell the jobs' events until each has ended and its artifacts arrived."""
    deadline = time.monotonic() + LIMIT_S
    describe = describer(client)
    while not all(_done(client, job) for job in jobs):
        if time.monotonic() > deadline:
            raise DemoError(f"gave up waiting for the jobs after {LIMIT_S:.0f} s")
        told = story.next(timeout=0.5)
        if told is not None:
            story.tell(told, describe)


def _done(client: Client, job: str) -> bool:
    d = client.job(job)
    if d.state not in TERMINAL:
        return False
    return d.state != "succeeded" or bool(client.artifacts(job).artifacts)


def _where(console: Console, client: Client, job: str) -> bool:
    """Print where ``job`` ran, which node class and why, and its artifacts."""
    d = client.job(job)
    nodes = sorted({r.node for r in d.placement})
    why = next((line.strip() for line in d.explanation if "node class" in line), "")
    console.print(f"job {d.id} {d.name}: {d.state} on {', '.join(nodes)}; {why}", highlight=False)
    failure = failure_words(d)
    if failure:
        console.print(f"  {failure}", highlight=False, soft_wrap=True)
    found = client.artifacts(job).artifacts
    for a in found:
        console.print(f"  artifact {a.name}: {a.size} bytes, sha256 {a.sha256[:16]}…")
    return d.state == "succeeded" and bool(found)


def failure_words(d: JobDetail) -> str:
    """What ended a failed job, from its timeline's last ``failed:`` event (for a container
    the engine could not run, the engine's own error); empty for any other job."""
    if d.state != "failed":
        return ""
    return next((e.message for e in reversed(d.events) if e.message.startswith("failed")), "")
