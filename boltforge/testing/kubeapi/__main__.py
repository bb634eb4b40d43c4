"""``python -m boltforge.testing.kubeapi --port 0 --kubeconfig PATH``: the fake API server
as its own process. Prints its URL on stdout once it listens; stops on SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio

from boltforge.testing.kubeapi.cluster import Cluster, Settings
from boltforge.testing.kubeapi.serving import Uvicorn, listen, new_loop, write_kubeconfig


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m boltforge.testing.kubeapi")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--kubeconfig", help="write a kubeconfig for the server here")
    p.add_argument("--no-kubelet", action="store_true", help="no kubelet emulation")
    p.add_argument("--kubelet-start-delay", type=float, default=0.0)
    p.add_argument("--kubelet-grace-cap", type=float, default=0.2)
    p.add_argument("--log-size", type=int, default=10_000)
    p.add_argument("--bookmark-interval", type=float, default=2.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    settings = Settings(
        not args.no_kubelet,
        args.kubelet_start_delay,
        args.kubelet_grace_cap,
        args.log_size,
        args.bookmark_interval,
    )
    sock = listen(args.host, args.port)
    url = f"http://{args.host}:{sock.getsockname()[1]}"
    if args.kubeconfig:
        write_kubeconfig(url, args.kubeconfig)
    server = Uvicorn(Cluster(settings), lambda: print(url, flush=True))
    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
