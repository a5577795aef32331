"""``edgekit fleet up``: broker (embedded unless --broker), collector, dashboard and optional simulated devices."""

from __future__ import annotations

import argparse
import logging
import time

from edgekit.cli.fleet_options import port_number
from edgekit.cli.options import console, json_parent, print_json, results


def register(fleet_subparsers: argparse._SubParsersAction) -> None:
    parser = fleet_subparsers.add_parser(
        "up", parents=[json_parent()], help="start a local fleet stack: broker, collector, dashboard (and simulated devices)",
        description="With no --broker an embedded pure-Python broker (amqtt, MQTT 3.1.1 only, no shared subscriptions) "
        "is started; real agents speak MQTT 5, so for them run Mosquitto and pass --broker.",
    )  # fmt: skip
    parser.add_argument("--broker", metavar="URL", help="use this broker instead of starting the embedded one")
    parser.add_argument("--broker-port", type=port_number, default=None,
                        help="port of the embedded broker (default 1883, or a free port when 1883 is taken; 0 = free)")
    parser.add_argument("--store", default="sqlite:///fleet.db", metavar="URL", help="fleet store (default sqlite:///fleet.db)")
    parser.add_argument("--port", type=port_number, default=None, help="dashboard port (default 8480, or a free port when 8480 is taken)")
    parser.add_argument("--host", default="127.0.0.1", help="dashboard address (default loopback)")
    parser.add_argument("--simulate", type=simulated_devices, default=0, metavar="N",
                        help="also run N simulated devices (SYNTHETIC numbers; default 0: none)")
    parser.add_argument("--rate", type=float, default=0.1, help="simulated telemetry windows per second per device")
    parser.add_argument("--fleet", default="sim", help="fleet id of the simulated devices")
    parser.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds (default: Ctrl-C)")
    parser.set_defaults(func=run)


#: The most simulated devices ``fleet up --simulate`` runs (as ``fleet simulate --devices``).
MAX_SIMULATED_DEVICES = 100_000


def simulated_devices(text: str) -> int:
    """``--simulate N``: a whole number of devices from 0 (none) to :data:`MAX_SIMULATED_DEVICES`."""
    what = f"a whole number of devices from 0 to {MAX_SIMULATED_DEVICES:,}, e.g. --simulate 20"
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of devices: give {what}") from None
    if not 0 <= count <= MAX_SIMULATED_DEVICES:
        raise argparse.ArgumentTypeError(f"{count} is out of range: give {what}")
    return count


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from edgekit.fleet import local_stack
    from edgekit.fleet.local_stack import LocalStack, LocalStackConfig
    from edgekit.fleet.store.urls import redact

    if args.verbose < 2:
        logging.getLogger("amqtt").setLevel(logging.WARNING)  # amqtt logs every connection at INFO
    # a port left to its default moves to a free one when taken (and says so); one given explicitly must be free
    config = LocalStackConfig(broker_url=args.broker, broker_port_fallback=args.broker_port is None,
                              broker_port=local_stack.DEFAULT_BROKER_PORT if args.broker_port is None else args.broker_port,
                              dashboard_port=local_stack.DEFAULT_DASHBOARD_PORT if args.port is None else args.port,
                              dashboard_port_fallback=args.port is None, store_url=args.store,
                              dashboard_host=args.host, simulate=args.simulate,
                              simulate_rate_per_s=args.rate, fleet=args.fleet)  # fmt: skip
    with LocalStack(config) as stack:
        kind = "embedded amqtt, MQTT 3.1.1" if stack.broker else "external"
        printer = results(args)  # what was started, where: the result (stdout unless --json)
        for note in stack.notes:
            console.print(f"[yellow]note:[/] {note}", soft_wrap=True)
        printer.print(f"broker    {stack.broker_url} ({kind})", soft_wrap=True)
        printer.print(f"store     {escape(redact(args.store))}", soft_wrap=True)
        printer.print(f"dashboard [bold]{stack.dashboard_url}[/]", soft_wrap=True)
        if args.simulate:
            printer.print(f"simulating {args.simulate} devices in fleet {args.fleet} (SYNTHETIC numbers)", soft_wrap=True)
        if args.json:
            print_json({"broker": stack.broker_url, "mqtt_version": stack.mqtt_version, "store": redact(args.store), "notes": stack.notes,
                        "dashboard": stack.dashboard_url, "simulated_devices": args.simulate})  # fmt: skip
        deadline = None if args.duration is None else time.monotonic() + args.duration
        try:
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.2)
        except KeyboardInterrupt:
            console.print("stopping")
    return 0
