"""``edgekit fleet deploy BUNDLE --broker URL --store URL --devices a,b|--target T [--canary 10%]``."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgekit.cli.options import console, json_parent, print_json


def register(fleet_subparsers: argparse._SubParsersAction) -> None:
    parser = fleet_subparsers.add_parser(
        "deploy", parents=[json_parent()], help="roll a signed bundle out to devices: canary first, widen only if healthy",
        description="Publishes signed deploy commands (command.v1) to a canary, watches their deploy results and "
        "telemetry in the fleet store (a collector must be writing to it), widens to the rest when healthy and "
        "rolls the canary back when not. Exit code 0 when every device took the bundle, 1 otherwise.",
    )  # fmt: skip
    parser.add_argument("bundle", type=Path, help="signed bundle directory, or the .tar from `edgekit pack`")
    parser.add_argument("--broker", required=True, metavar="URL", help="mqtt://HOST:1883 or mqtts://HOST:8883")
    parser.add_argument("--store", required=True, metavar="URL", help="the fleet store the collector writes")
    selection = parser.add_mutually_exclusive_group(required=True)
    selection.add_argument("--devices", metavar="A,B", help="device ids")
    selection.add_argument("--target", metavar="NAME", help="every device of this target profile")
    parser.add_argument("--fleet", help="fleet id (needed when a device id exists in several fleets)")
    parser.add_argument("--canary", default="10%", help="share ('10%%') or number ('1') of devices to try first")
    parser.add_argument("--health-window-s", type=float, default=60.0, help="how long the canary is watched (default 60)")
    parser.add_argument("--deploy-timeout-s", type=float, default=180.0, help="wait this long for each deploy result")
    parser.add_argument("--max-error-rate", type=float, default=0.02, help="canary error-rate limit (default 0.02)")
    parser.add_argument("--max-p99-ratio", type=float, default=1.5, help="canary p99 after/before limit (default 1.5)")
    parser.add_argument("--url-base", metavar="URL", help="where devices download the .tar (default: its file:// URL)")
    parser.add_argument("--key", type=Path, metavar="fleet.key.pem", help="fleet key (private or public PEM) to check the signature with first")
    parser.add_argument("--sign-commands", type=Path, metavar="fleet.key.pem",
                        help="sign every command with the fleet's private key (agents with commands.require_signed need it)")
    parser.add_argument("--bundle-id", help="bundle id to deploy as (default <name>-<12 hex of the manifest hash>)")
    parser.add_argument("--mqtt-version", choices=("5", "3.1.1"), default="5", help="3.1.1 for brokers such as amqtt")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgekit.fleet.rollout import RolloutPolicy, run_rollout
    from edgekit.fleet.rollout_bundle import prepare_bundle

    artifact = prepare_bundle(args.bundle, url_base=args.url_base, key=args.key, bundle_id=args.bundle_id)
    policy = RolloutPolicy(canary=args.canary, health_window_s=args.health_window_s, deploy_timeout_s=args.deploy_timeout_s,
                           max_error_rate=args.max_error_rate, max_p99_ratio=args.max_p99_ratio)  # fmt: skip
    console.print(f"deploying {artifact.bundle_id} ({artifact.url}, sha256 {artifact.sha256[:12]}…, {artifact.size_bytes} bytes)")
    last_state: list[str] = []

    def show(record: object) -> None:
        state = getattr(record, "state")
        if not last_state or last_state[-1] != state:
            last_state.append(state)
            console.print(f"  {state}" + (f": {record.reason}" if getattr(record, "reason", None) else ""))  # type: ignore[attr-defined]

    devices = [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices else None
    record = run_rollout(artifact, broker_url=args.broker, store_url=args.store, devices=devices, target=args.target,
                         fleet=args.fleet, policy=policy, mqtt_version=args.mqtt_version, on_update=show,
                         publisher_options={"signing_key": args.sign_commands} if args.sign_commands else None)  # fmt: skip
    ok = record.state == "completed"
    colour = "green" if ok else "red"
    console.print(f"[{colour}]rollout {record.rollout_id} {record.state}[/]" + (f": {record.reason}" if record.reason else ""))
    for device, outcome in sorted(record.outcomes.items()):
        console.print(f"  {device}: {outcome}{' (canary)' if device in record.canary else ''}")
    if args.json:
        print_json(record.to_json())
    return 0 if ok else 1
