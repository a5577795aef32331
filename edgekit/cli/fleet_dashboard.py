"""``edgekit fleet dashboard --store URL``: the fleet's web page (device table, plots, bundles, rollouts)."""

from __future__ import annotations

import argparse
import time

from edgekit.cli.fleet_options import port_number
from edgekit.cli.options import console, json_parent, print_json, results

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def register(fleet_subparsers: argparse._SubParsersAction) -> None:
    parser = fleet_subparsers.add_parser("dashboard", parents=[json_parent()], help="serve the fleet dashboard (web page)",
                                         description="Serve a web page of the fleet store: device table, latency and power "
                                                     "plots, bundles and rollouts. Read-only: the store must exist (`edgekit "
                                                     "fleet collect` creates it).")  # fmt: skip
    parser.add_argument("--store", required=True, metavar="URL", help="sqlite:///fleet.db or postgresql://...")
    parser.add_argument("--port", type=port_number, default=8480, metavar="P", help="TCP port (default 8480; 0 picks a free one)")
    parser.add_argument("--host", default="127.0.0.1", metavar="ADDR", help="address to listen on (default loopback only)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="a host name the page may be opened under, besides loopback names and --host (repeatable; "
                             "other Host headers are refused against DNS rebinding)")  # fmt: skip
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgekit.fleet.dashboard import DashboardServer
    from edgekit.fleet.store import open_store

    with open_store(args.store, must_exist=True):  # a read-only page: refuse a store that is not there (a typo)
        pass
    if args.host not in LOOPBACK_HOSTS:
        console.print(f"[yellow]warning:[/] listening on {args.host}: the dashboard has no login; anyone who can reach "
                      "this address can read the fleet's telemetry. Put it behind a reverse proxy with authentication. "
                      "Pages are served only under loopback names, the address listened on and --allow-host names.")  # fmt: skip
    server = DashboardServer(args.store, host=args.host, port=args.port)
    server.http.allow_hosts(args.allow_host)
    with server:
        results(args).print(f"dashboard on [bold]{server.url}[/] (store {args.store}); Ctrl-C to stop", soft_wrap=True)
        if args.json:
            print_json({"url": server.url, "store": args.store})
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            console.print("stopping")
    return 0
