"""``edgekit fleet deploy BUNDLE --broker URL --store URL --key KEY --devices a,b|--target T [--waves 1,10%,100%]``;
``--model NAME`` deploys to one model of the devices' repositories, ``--pipeline a=DIR,b=DIR`` to several at once."""

from __future__ import annotations

import argparse
import datetime as dt
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.cli.fleet_options import growth_ratio, positive_seconds, share
from edgekit.cli.options import console, json_parent, print_json, results
from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from rich.console import Console

    from edgekit.fleet.rollout_state import RolloutRecord


def register(fleet_subparsers: argparse._SubParsersAction) -> None:
    parser = fleet_subparsers.add_parser(
        "deploy", parents=[json_parent()], help="roll a verified, signed bundle out to devices in waves, with a health gate between them",
        description="Verifies the bundle first (every file against its sha256, the signature with --key) and checks that "
        "every device reports the bundle's target (--force deploys anyway). Then publishes deploy commands (command.v1) "
        "wave by wave, waits for each device's deploy_result in the fleet store (a collector must be writing to it), "
        "and between waves watches the telemetry of the devices switched so far; a failed wave or gate rolls all of "
        "them back and leaves later waves untouched. Exit code 0 when every device took the bundle, 1 when some did not "
        "(or the deploy stopped on an error after commands went out), 2 when a check before sending failed (nothing was sent).",
    )  # fmt: skip
    parser.add_argument("bundle", type=Path, nargs="?",
                        help="signed bundle directory, or the .tar from `edgekit pack` (not with --pipeline)")
    models = parser.add_mutually_exclusive_group()
    models.add_argument("--model", metavar="NAME", help="deploy to this model of the devices' model repositories "
                        "(models: in the agent config; default: each device's default model)")  # fmt: skip
    models.add_argument("--pipeline", metavar="M=BUNDLE,...",
                        help="deploy several models together, all or none on each device: MODEL=BUNDLE pairs, or a YAML "
                        "file with models: {MODEL: BUNDLE}; one deploy_pipeline command per device")  # fmt: skip
    parser.add_argument("--broker", required=True, metavar="URL", help="mqtt://HOST:1883 or mqtts://HOST:8883")
    parser.add_argument("--store", required=True, metavar="URL", help="the fleet store the collector writes")
    selection = parser.add_mutually_exclusive_group(required=True)
    selection.add_argument("--devices", metavar="A,B", help="device ids")
    selection.add_argument("--target", metavar="NAME", help="every device of this target profile")
    parser.add_argument("--fleet", help="fleet id (needed when a device id exists in several fleets)")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--waves", metavar="W1,W2,...", help="cumulative wave sizes, shares or counts, ending with 100%% "
                       "(e.g. 1,10%%,50%%,100%%); a health gate runs after every wave but the last")  # fmt: skip
    sizes.add_argument("--canary", default="10%", help="shorthand for --waves CANARY,100%% (default 10%%)")
    parser.add_argument("--health-window-s", type=positive_seconds, default=60.0, help="how long each gate watches, seconds above 0 (default 60)")
    parser.add_argument("--deploy-timeout-s", type=positive_seconds, default=180.0,
                        help="wait this long for each deploy result, seconds above 0 (default 180)")
    parser.add_argument("--max-error-rate", type=share, default=0.02, help="gate: error-rate limit, from 0 to 1 (default 0.02)")
    parser.add_argument("--max-p99-ratio", type=growth_ratio, default=1.5, help="gate: p99 after/before limit, above 0 (default 1.5)")
    parser.add_argument("--force", action="store_true",
                        help="deploy to devices that report another target than the bundle's, or none (recorded in the rollout)")
    parser.add_argument("--allow-downgrade", action="store_true", help="let devices that ran a newer bundle_version take this one")
    parser.add_argument("--allow-signature-change", action="store_true", help="let the bundle change the served inputs/outputs")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url-base", metavar="URL", help="devices download the .tar from URL/<tar name> (an allowed source of theirs)")
    where.add_argument("--inbox", type=Path, metavar="DIR",
                       help="copy the .tar into DIR (the agents' bundles.inbox or an allowed_sources directory) and send its file:// URL")
    where.add_argument("--file-url", action="store_true",
                       help="send the bundle's own file:// URL to real agents too (their bundles.allowed_sources list its directory); "
                       "without it, --inbox or --url-base, only simulated devices are sent a file:// URL")  # fmt: skip
    parser.add_argument("--key", type=Path, metavar="fleet.pub.pem",
                        help="fleet key (public or private PEM) to check the bundle's signature with before publishing; required "
                        "unless --sign-commands gives the private key or --skip-signature-check")  # fmt: skip
    parser.add_argument("--skip-signature-check", action="store_true", help="leave the signature check to the devices alone")
    parser.add_argument("--sign-commands", type=Path, metavar="fleet.key.pem",
                        help="sign every command with the fleet's private key (agents with commands.require_signed need it)")
    parser.add_argument("--bundle-id", help="bundle id to deploy as (default <name>-<12 hex of the manifest hash>)")
    parser.add_argument("--mqtt-version", choices=("5", "3.1.1"), default="5", help="3.1.1 for brokers such as amqtt")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgekit.fleet.rollout import RolloutPolicy, parse_waves, run_rollout
    from edgekit.fleet.rollout_bundle import RolloutError, prepare_bundle
    from edgekit.fleet.rollout_models import ModelDeploy, check_model_name, parse_pipeline
    from edgekit.fleet.rollout_state import DeployTerminated

    key = args.key if args.key is not None else args.sign_commands
    if (args.bundle is None) == (args.pipeline is None):
        raise RolloutError("fleet deploy takes a BUNDLE or --pipeline MODEL=BUNDLE,..., not both nor neither",
                           hint="edgekit fleet deploy build/yolo --model detector ..., or --pipeline detector=build/yolo,...")  # fmt: skip
    if args.pipeline is not None and args.bundle_id:
        raise RolloutError("--bundle-id names one bundle; a pipeline deploys each under its own id", hint="drop --bundle-id")
    bundles = parse_pipeline(args.pipeline) if args.pipeline is not None else [(args.model, args.bundle)]
    models: list[ModelDeploy] = []
    artifacts = []
    for name, path in bundles:
        artifacts.append(prepare_bundle(path, url_base=args.url_base, key=key, bundle_id=args.bundle_id,
                                        skip_signature_check=args.skip_signature_check, inbox=args.inbox,
                                        file_url=args.file_url))  # fmt: skip
        if name is not None:
            models.append(ModelDeploy(check_model_name(name), artifacts[-1]))
    artifact = artifacts[0]
    policy = RolloutPolicy(canary=args.canary, waves=parse_waves(args.waves) if args.waves else None,
                           health_window_s=args.health_window_s, deploy_timeout_s=args.deploy_timeout_s,
                           max_error_rate=args.max_error_rate, max_p99_ratio=args.max_p99_ratio, force=args.force,
                           allow_downgrade=args.allow_downgrade, allow_signature_change=args.allow_signature_change)  # fmt: skip
    for checked in artifacts:
        signature = f"signature verified (key {checked.signed_by})" if checked.signed_by else "signature NOT checked here"
        console.print(f"verified {checked.bundle_id}: {checked.files_verified} file(s) match manifest.json, {signature}; "
                      f"target {checked.target or 'none'}", soft_wrap=True)  # fmt: skip
    show = _progress_printer(artifact)
    started: list[RolloutRecord] = []  # once the rollout has saved its record, commands go out

    def on_update(record: RolloutRecord) -> None:
        started[:] = [record]
        show(record)

    devices = [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices else None
    previous = _sigterm_raises()
    try:
        record = run_rollout(artifact, broker_url=args.broker, store_url=args.store, devices=devices, target=args.target,
                             fleet=args.fleet, policy=policy, mqtt_version=args.mqtt_version, on_update=on_update,
                             publisher_options={"signing_key": args.sign_commands} if args.sign_commands else None,
                             models=models, pipeline=args.pipeline is not None)  # fmt: skip
    except DeployTerminated:
        if not started:
            console.print("[red]terminated (SIGTERM)[/] before any command went out: nothing was sent", soft_wrap=True)
        else:
            console.print(f"[red]terminated (SIGTERM)[/]: rollout {started[0].rollout_id} is recorded stopped; no rollback was "
                          f"sent; `edgekit fleet report --fleet {started[0].fleet}` shows which devices took the bundle", soft_wrap=True)  # fmt: skip
        return 128 + signal.SIGTERM
    except EdgekitError as err:
        if not started:
            raise  # a check before sending: exit 2, nothing was sent
        from rich.markup import escape

        console.print(f"[bold red]error:[/] {escape(err.message)}" + (f"\n  [yellow]hint:[/] {escape(err.hint)}" if err.hint else ""),
                      soft_wrap=True)  # fmt: skip
        console.print(f"rollout {started[0].rollout_id} stopped after commands went out ({started[0].state}): devices may run "
                      f"the new bundle; `edgekit fleet report --fleet {started[0].fleet}` shows its record", soft_wrap=True)  # fmt: skip
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print_record(record, results(args))  # stdout, or stderr with --json
    if args.json:
        print_json(record.to_json())
    return 0 if record.state == "completed" else 1


def _sigterm_raises() -> Any:
    """Turn SIGTERM (systemd stop, ``timeout``, a cancelled CI job) into :class:`DeployTerminated` while the rollout
    runs, so it records ``stopped`` as on Ctrl-C instead of staying ``deploying`` and blocking the next deploy of the
    fleet. A second SIGTERM is ignored while that record is saved. Returns the handler to put back (None off the main
    thread, where Python cannot set one)."""
    from edgekit.fleet.rollout_state import DeployTerminated

    if threading.current_thread() is not threading.main_thread():
        return None

    def terminated(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise DeployTerminated("SIGTERM")

    return signal.signal(signal.SIGTERM, terminated)


def _progress_printer(artifact: Any) -> Callable[[RolloutRecord], None]:
    """The ``on_update`` of ``fleet deploy``: one line per wave step on stderr, and while a gate watches a live
    line (rewritten in place on a terminal, one line per update otherwise) with the wave's figures so far."""
    from edgekit.fleet.rollout_state import FINAL_STATES

    seen: list[tuple[str, int]] = []
    live = {"open": False}

    def end_live_line() -> None:
        if live["open"]:
            console.file.write("\n")
            live["open"] = False

    def show(record: RolloutRecord) -> None:
        if not seen:  # the devices and waves passed their checks: commands go out now
            console.print(f"rollout {record.rollout_id}: {artifact.url} (sha256 {artifact.sha256[:12]}…, {artifact.size_bytes} "
                          f"bytes) to {plural(len(record.devices), 'device')} in {plural(len(record.waves), 'wave')}", soft_wrap=True)  # fmt: skip
            for dropped in record.options.get("dropped_waves") or ():
                console.print(f"  wave {dropped['spec']} dropped: {dropped['reason']}", soft_wrap=True)
            seen.append(("", 0))
        active = next((w for w in record.waves if w["state"] in ("deploying", "watching")), None)
        key = (record.state, active["index"] if active else 0)
        if (active or record.state == "rolling_back") and seen[-1] != key:
            end_live_line()
            seen.append(key)
            where = f" wave {active['index']}/{len(record.waves)} ({active['spec']}: {plural(len(active['devices']), 'device')})" if active else ""
            console.print(f"  {record.state}{where}" + (f": {record.reason}" if record.reason else ""), soft_wrap=True)
        if active and active["state"] == "watching" and active.get("health") and not active["health"].get("final"):
            line = "    " + watch_line(active, len(record.waves))
            if console.is_terminal:
                console.file.write("\r\x1b[K" + line)
                console.file.flush()
                live["open"] = True
            else:
                console.print(line, soft_wrap=True, markup=False)
        elif record.state in FINAL_STATES:
            end_live_line()

    return show


def plural(count: int, noun: str) -> str:
    """``1 device``, ``2 devices``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def watch_line(wave: dict[str, Any], waves: int, now: dt.datetime | None = None) -> str:
    """A watched wave so far: devices switched, healthy (heard from on the new bundle), failed; the gate's
    figures against their limits; seconds left in the health window."""
    health = wave.get("health") or {}
    now = now or dt.datetime.now(dt.timezone.utc)
    left = ""
    if wave.get("watch_ends_at"):
        seconds = max(0.0, (dt.datetime.fromisoformat(wave["watch_ends_at"]) - now).total_seconds())
        left = f"; {seconds:.0f} s left"
    return (f"wave {wave['index']}/{waves} watching: {health.get('devices', 0)} switched, {health.get('healthy', 0)} healthy, "
            f"{health.get('failed', 0)} failed; {gate_text(health)}{left}")  # fmt: skip


def gate_text(health: dict[str, Any]) -> str:
    """The health gate's figures beside their limits: ``error rate 0.0% (limit 2.0%), p99 4.02 -> 4.11 ms (1.02x,
    limit 1.50x), 212 inferences``."""
    rate, limit = health.get("error_rate"), health.get("max_error_rate")
    errors = "error rate –" if rate is None else f"error rate {rate:.1%}"
    errors += f" (limit {limit:.1%})" if limit is not None else ""
    before, after, ratio = health.get("p99_before_ms"), health.get("p99_after_ms"), health.get("p99_ratio")
    p99 = f"p99 {_ms(before)} -> {_ms(after)} ms"
    p99 += f" ({ratio:.2f}x" if ratio is not None else " (no ratio"
    p99 += f", limit {health['max_p99_ratio']:.2f}x)" if health.get("max_p99_ratio") is not None else ")"
    return f"{errors}, {p99}, {health.get('inferences', 0)} inferences"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def print_record(record: RolloutRecord, out: Console = console) -> None:
    """A rollout's outcome for people: the state, each wave, each device that did not take the bundle and why."""
    from rich.markup import escape

    from edgekit.fleet.rollout_state import FINAL_STATES

    colour = "green" if record.state == "completed" else "red" if record.state in FINAL_STATES else "yellow"
    took = record.to_json()["seconds"]
    # issue 20: the model deployed to, or a pipeline of several (their model=bundle pairs are the bundle_id)
    what = "pipeline " if record.options.get("pipeline") else ""
    if record.options.get("model"):
        what = f"model {escape(str(record.options['model']))}: "
    out.print(f"[{colour}]rollout {record.rollout_id} {record.state}[/] {what}"
              + f"{escape(record.bundle_id)} (target "
              f"{escape(record.target or 'none')}), started {record.started_at:%Y-%m-%d %H:%M:%S} UTC, {took:.1f} s"
              + (f": {escape(record.reason)}" if record.reason else ""), soft_wrap=True)  # fmt: skip
    silent = record.silent_s()
    if silent is not None:
        out.print(f"  [red]no update for {silent / 60:.0f} min[/]: the fleet deploy that ran it has most likely ended "
                  "(killed, or its host lost); its devices keep what they were last sent", soft_wrap=True)  # fmt: skip
    for wave in record.waves:
        seconds = f", {wave['seconds']:.1f} s" if wave.get("seconds") is not None else ""
        out.print(f"  wave {wave['index']} ({wave['spec']}, {plural(len(wave['devices']), 'device')}): {wave['state']}{seconds}"
                  + (f": {escape(wave['reason'])}" if wave.get("reason") else ""), soft_wrap=True)  # fmt: skip
        if wave.get("health"):
            out.print(f"      gate: {escape(gate_text(wave['health']))}", soft_wrap=True)
    for dropped in record.options.get("dropped_waves") or ():
        out.print(f"  wave {escape(str(dropped['spec']))} dropped: {escape(str(dropped['reason']))}", soft_wrap=True)
    counts: dict[str, int] = {}
    for outcome in record.outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    if counts:
        out.print("  devices: " + ", ".join(f"{n} {o}" for o, n in sorted(counts.items(), key=lambda i: (-i[1], i[0]))), soft_wrap=True)
    for device, why in record.forced.items():
        out.print(f"  [yellow]forced[/] {device}: {escape(why)}, bundle target {escape(record.target or 'none')}", soft_wrap=True)
    for device, outcome in sorted(record.outcomes.items()):
        result = record.device_results.get(device, {})
        in_wave = f" (wave {result['wave']})" if result.get("wave") else ""
        line = f"  {device}: {outcome}{in_wave}"
        if result.get("reason") and outcome not in ("succeeded", "pending", "not_started", "skipped_offline"):
            line += f": {escape(str(result['reason']))}"
            if result.get("hint"):
                line += f"\n      hint: {escape(str(result['hint']))}"
        out.print(line, soft_wrap=True)
