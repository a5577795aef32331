"""``edgekit fleet simulate --broker URL --devices N --rate R``: virtual agents with synthetic numbers."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgekit.cli.fleet_options import name_list, positive_seconds
from edgekit.cli.fleet_simulate_behaviour import parse_behaviour
from edgekit.cli.fleet_simulate_history import add_history_options, run_history
from edgekit.cli.options import console, json_parent, print_json, results


def register(fleet_subparsers: argparse._SubParsersAction) -> None:
    parser = fleet_subparsers.add_parser(
        "simulate", parents=[json_parent()], help="run simulated devices (real MQTT clients, SYNTHETIC latency and power)",
        description="Simulated agents: each device is its own MQTT connection with the agent's messages (telemetry, "
        "retained status with an offline will, events) and answers ping/set_interval/deploy/rollback commands. "
        "Latency and power are SYNTHETIC, derived from the target profiles.",
    )  # fmt: skip
    parser.add_argument("--broker", metavar="URL", help="mqtt://HOST:1883 or mqtts://HOST:8883 (needed unless --history)")
    parser.add_argument("--devices", type=int, default=10, metavar="N", help="how many devices (default 10)")
    parser.add_argument("--rate", type=float, default=0.1, metavar="R",
                        help="telemetry windows per second per device (default 0.1: one 10 s window)")  # fmt: skip
    parser.add_argument("--duration", type=positive_seconds, default=None, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
    parser.add_argument("--fleet", default="sim", help="fleet id (default sim)")
    parser.add_argument("--targets", type=name_list, default=None, metavar="A,B", help="target profiles to cycle through (default: a mix)")
    parser.add_argument("--bundle", default="demo-v1", help="bundle id the devices start with ('' for none)")
    parser.add_argument("--mqtt-version", choices=("5", "3.1.1"), default="5", help="3.1.1 for brokers such as amqtt")
    parser.add_argument("--store", metavar="URL", help="also record each device's target in this fleet store")
    parser.add_argument("--bundle-behaviour", action="append", default=[], metavar="ID:KEY=V,...",
                        help="make a bundle misbehave, e.g. 'v2:error_rate=0.3' or 'v3:latency_factor=3' or "
                        "'v4:self_check=fail' (repeatable)")  # fmt: skip
    parser.add_argument("--deploy-watch-s", type=positive_seconds, default=2.0, metavar="S",
                        help="the simulated agent's health watch after a deploy (default 2)")
    parser.add_argument("--verify-downloads", action="store_true", help="check file:// bundles' sha256 on deploy")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the synthetic numbers")
    parser.add_argument("--processes", type=int, default=None, metavar="N",
                        help="simulator processes (default: one per 5,000 devices, at most one per CPU)")
    parser.add_argument("--max-connecting", type=int, default=64, metavar="N",
                        help="connections waiting for the broker's CONNACK at once, all processes together (default 64)")
    parser.add_argument("--tls-ca", type=Path, help="CA certificate for mqtts://")
    parser.add_argument("--username", help="broker user name")
    parser.add_argument("--password-file", type=Path, help="file holding the broker password")
    parser.add_argument("--allow-plaintext-password", action="store_true",
                        help="send the password over mqtt:// to a broker that is not on loopback (refused otherwise)")
    add_history_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgekit.fleet.sim.profiles import DEFAULT_TARGETS, profiles_for
    from edgekit.fleet.sim.shards import ShardedFleetSimulator, auto_processes
    from edgekit.fleet.simulate import DeployTiming, FleetSimulator, SimulationConfig, SimulationError

    if args.history:
        return run_history(args)
    if not args.broker:
        raise SimulationError("fleet simulate needs --broker URL (live devices) or --history DURATION --store URL (seeded history)",
                              hint="e.g. --broker mqtt://127.0.0.1:1883, or --history 24h --store sqlite:///fleet.db")  # fmt: skip
    targets = args.targets or DEFAULT_TARGETS
    config = SimulationConfig(
        args.broker, devices=args.devices, rate_per_s=args.rate, fleet=args.fleet, targets=targets,
        initial_bundle=args.bundle or None, mqtt_version=args.mqtt_version,
        behaviours=dict(parse_behaviour(text) for text in args.bundle_behaviour),  # type: ignore[misc]
        deploy_timing=DeployTiming(watch_s=args.deploy_watch_s), verify_downloads=args.verify_downloads, seed=args.seed,
        tls_ca=args.tls_ca, username=args.username, password_file=args.password_file, max_connecting=args.max_connecting,
        allow_plaintext_password=args.allow_plaintext_password,
    )  # fmt: skip
    processes = args.processes or auto_processes(args.devices)
    simulator: FleetSimulator | ShardedFleetSimulator = (FleetSimulator(config) if processes == 1
                                                         else ShardedFleetSimulator(config, processes=processes))  # fmt: skip
    if args.store:
        from edgekit.fleet.store import open_store

        with open_store(args.store) as store:
            simulator.record_targets(store)
    profiles = {profile.target: profile for profile in profiles_for(list(dict.fromkeys(targets)))}
    console.print(f"[bold]{args.devices}[/] simulated devices on {args.broker} (fleet {args.fleet}), "
                  f"{args.rate:g} windows/s each = {args.rate * args.devices:g} messages/s, {processes} process(es); "
                  "numbers are SYNTHETIC")  # fmt: skip
    for profile in profiles.values():
        console.print(f"  {profile.target}: p50 ~{profile.latency_p50_ms:g} ms, power {profile.idle_power_mw / 1000:.1f}-"
                      f"{profile.active_power_mw / 1000:.1f} W")  # fmt: skip
    simulator.start()
    console.print(f"  all {args.devices} connected in {simulator.connect_seconds:.1f} s")
    try:
        simulator.run_for(args.duration)
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        simulator.stop()
    counters = simulator.counters()
    results(args).print(f"published {counters.published} messages ({counters.windows} telemetry windows), {counters.acked} acknowledged",
                        soft_wrap=True)  # fmt: skip
    if args.json:
        print_json({"devices": counters.devices, "windows": counters.windows, "published": counters.published,
                    "acked": counters.acked, "synthetic": True})  # fmt: skip
    return 0
