"""``edgekit-agent``: the device agent's command line.

* ``edgekit-agent run --config agent.yaml``: run until SIGTERM or SIGINT (what systemd starts);
* ``edgekit-agent check --config agent.yaml``: check the config, the bundles (signature, hashes,
  self-check), the power sensor, the paths and the broker (a real connection with the config's TLS
  settings and credentials), print what is wrong, exit non-zero on problems;
* ``edgekit-agent install --config agent.yaml BUNDLE``: first provisioning of a device, the same
  checks as a deploy, without a broker;
* ``edgekit-agent detect [--root PATH] [--json]``: the device's identity, power mode and the edgekit
  target profile it matches, with the evidence (exit 1 when none matches, saying why).

Exit codes: 0 fine, 1 the check found problems (or ``run`` failed), 2 the config is invalid.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit_runtime import __version__
from edgekit_runtime.agent.config import AgentConfig, load_config
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.errors import EdgekitError

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_CONFIG = 2

logger = logging.getLogger("edgekit_runtime.agent")


@dataclass
class CheckReport:
    """What ``check`` found: lines that passed, problems (exit 1) and warnings (no effect on exit)."""

    passed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "passed": self.passed, "problems": self.problems, "warnings": self.warnings}


def check_agent(config: AgentConfig, *, broker_timeout_s: float = 5.0) -> CheckReport:
    """Everything ``edgekit-agent check`` looks at, as a report (no output). The broker is probed with one
    connection under its own client id (a running agent keeps its session), ``broker_timeout_s`` at most."""
    from edgekit_runtime.agent.broker_check import probe_broker
    from edgekit_runtime.agent.loading import load_bundle
    from edgekit_runtime.agent.store import BundleStore
    from edgekit_runtime.sensors import create_sensor
    from edgekit_runtime.signing import load_public_key, public_key_fingerprint

    report = CheckReport()
    report.passed.append(f"config {config.source} is valid (device {config.device_id}, fleet {config.fleet})")
    if config.bundles.public_key is not None:
        try:
            key = load_public_key(config.bundles.public_key)
            report.passed.append(f"fleet public key {config.bundles.public_key} (fingerprint {public_key_fingerprint(key)})")
        except EdgekitError as err:
            report.problems.append(str(err))
    if config.bundles.allow_unsigned:
        report.warnings.append("bundles.allow_unsigned is true: unsigned bundles are accepted (development only)")

    # bundles.dir holds the bundles only without a models: repository; with one, models.dir holds them
    key, directory = ("bundles.dir", config.bundles.dir) if config.models is None else ("models.dir", config.models.dir)
    if not directory.is_dir():
        report.problems.append(f"{key} '{directory}' does not exist; create it (install a bundle with `edgekit-agent install`)")
    elif not os.access(directory, os.W_OK):
        report.problems.append(f"{key} '{directory}' is not writable by this user; deploys would fail")
    # one store per model of the repository (models:), else bundles.dir itself
    stores = [(None, config.bundles.dir)]
    if config.models is not None:
        from edgekit_runtime.agent.repository import ModelRepository

        stores = [(slot.key, slot.store.root) for slot in ModelRepository(config, lambda event: None).slots()]
    for model, directory in stores:
        store = BundleStore(directory)
        what, install = ("", "") if model is None else (f"model {model}: ", f" --model {model}")
        for link, required in (("current", True), ("previous", False)):
            path = store.target(link)
            if path is None:
                message = f"{what}no {link} bundle in {directory}"
                (report.problems if required else report.warnings).append(
                    message + (f"; install one: edgekit-agent install --config CONFIG{install} BUNDLE" if required else "")
                )
                continue
            try:
                loaded = load_bundle(path, config.bundles)
            except EdgekitError as err:
                (report.problems if required else report.warnings).append(f"{what}{link} bundle {path}: {err}")
                continue
            loaded.runner.close()
            signed = f"signed by {loaded.signed_by}" if loaded.signed_by else "unsigned"
            report.passed.append(f"{what}{link} bundle {loaded.name}: {signed}, {len(loaded.bundle.files)} files verified, "
                                 f"self-check passed on {', '.join(loaded.check.providers)}")  # fmt: skip

    try:
        sensor = create_sensor(config.power.sensor, config.power.root)
        with sensor:
            if sensor.available():
                report.passed.append(f"power sensor {config.power.sensor}: {sensor.source}")
            else:
                report.problems.append(f"power sensor '{config.power.sensor}' is unavailable: {sensor.unavailable_reason}")
    except EdgekitError as err:
        report.problems.append(f"power sensor '{config.power.sensor}': {err}")

    if config.broker is None:
        report.warnings.append("no broker configured: telemetry and fleet commands are off")
    else:
        if config.broker.password_file is not None and not os.access(config.broker.password_file, os.R_OK):
            report.problems.append(f"broker.password_file '{config.broker.password_file}' is not readable by this user")
        probe = probe_broker(config.broker, f"edgekit-{config.fleet}-{config.device_id}", broker_timeout_s)
        clear_text = _clear_text_password_warning(config)  # a password over mqtt:// is never "ok", even if it worked
        if clear_text is not None:
            report.warnings.append((probe.message + "; " if probe.ok else "") + clear_text)
        elif probe.ok:
            report.passed.append(probe.message)
        if not probe.ok:
            report.problems.append(probe.message + (f"; {probe.hint}" if probe.hint else ""))
        spool_dir = config.telemetry.spool.path.parent
        if not spool_dir.is_dir() or not os.access(spool_dir, os.W_OK):
            report.problems.append(f"telemetry.spool.path: directory '{spool_dir}' is missing or not writable")
    address = config.api.address
    if address.unix_path is not None and not address.unix_path.parent.is_dir():
        report.warnings.append(f"api.address: directory '{address.unix_path.parent}' does not exist yet (run creates it)")
    report.passed.append(f"API address {address}")
    return report


def _clear_text_password_warning(config: AgentConfig) -> str | None:
    """Why the broker password crosses the network unencrypted (``mqtt://`` with a password), or None."""
    from edgekit_runtime.agent.broker import is_loopback_host, parse_broker_url, sends_password_in_clear

    broker = config.broker
    if broker is None or not sends_password_in_clear(broker.url, has_password=broker.password_file is not None):
        return None
    host = parse_broker_url(broker.url).host
    if is_loopback_host(host):
        return (f"{config.source}: broker.password_file: the password goes in clear text over {broker.url} (no TLS); "
                f"{host} is loopback, so only this machine sees it, but use mqtts:// before the broker moves off it")
    return (f"{config.source}: broker.password_file: the password goes in clear text over {broker.url} to {host} "
            "because broker.allow_plaintext_password is true; anyone on the network path can read it: use mqtts://")


def _load(config_path: Path) -> AgentConfig | None:
    try:
        return load_config(config_path)
    except AgentConfigError as err:
        _print_error(err)
        return None


def _print_error(err: EdgekitError) -> None:
    sys.stderr.write(f"error: {err.message}\n")
    if err.hint:
        sys.stderr.write(f"  hint: {err.hint}\n")


def _cmd_check(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return EXIT_CONFIG
    if args.broker_timeout_s <= 0:
        _print_error(AgentConfigError(f"--broker-timeout-s must be positive, got {args.broker_timeout_s:g}",
                                      hint="give the broker a few seconds, e.g. --broker-timeout-s 5"))  # fmt: skip
        return EXIT_CONFIG
    report = check_agent(config, broker_timeout_s=args.broker_timeout_s)
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict()) + "\n")
    else:
        for line in report.passed:
            sys.stdout.write(f"ok    {line}\n")
        for line in report.warnings:
            sys.stdout.write(f"warn  {line}\n")
        for line in report.problems:
            sys.stdout.write(f"FAIL  {line}\n")
        summary = "all checks passed" if report.ok else f"{len(report.problems)} problem(s)"
        sys.stdout.write(f"{summary}\n")
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _cmd_install(args: argparse.Namespace) -> int:
    from edgekit_runtime.agent.ota import DeployRequest
    from edgekit_runtime.agent.repository import ModelRepository

    config = _load(args.config)
    if config is None:
        return EXIT_CONFIG
    failures: list[str] = []

    def emit(event: dict[str, Any]) -> None:
        # progress to stderr; the outcome (deploy_result) and anything else to stdout
        stream = sys.stderr if event["kind"] == "deploy_progress" else sys.stdout
        stream.write(f"{event['kind']}: {event['message']}\n")
        if event["level"] == "error":
            failures.append(event["message"])

    models = ModelRepository(config, emit)
    try:
        request = DeployRequest.from_args(
            {"url": str(args.bundle), "sha256": args.sha256, "signature": args.signature}, require_sha256=False
        )
        models.hold()  # refused while an agent serves this models.dir, before any model folder is made
        slot = models.get(args.model, create=True)  # None: the default model (the one model of bundles.dir)
        slot.store.prepare()
        outcome = slot.deployer.deploy(request, watch=False, check_source=False)
    except EdgekitError as err:
        _print_error(err)
        return EXIT_PROBLEMS
    finally:
        models.close()
    return EXIT_OK if outcome == "succeeded" else EXIT_PROBLEMS


def _cmd_run(args: argparse.Namespace) -> int:
    from edgekit_runtime.agent.service import AgentService

    config = _load(args.config)
    if config is None:
        return EXIT_CONFIG
    service = AgentService(config)

    def on_signal(signum: int, _frame: object) -> None:
        logger.info("received %s; stopping", signal.Signals(signum).name)
        service.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        service.run_forever()
    except EdgekitError as err:
        _print_error(err)
        return EXIT_PROBLEMS
    return EXIT_OK


def _cmd_detect(args: argparse.Namespace) -> int:
    from edgekit_runtime.sensors.target_detect import inspect_device

    root = Path(args.root)
    if not root.is_dir():
        _print_error(AgentConfigError(f"detect --root {str(root)!r} is not a directory",
                                      hint="point --root at a filesystem root: / (the default), a mounted device "
                                           "image or a fixture tree"))  # fmt: skip
        return EXIT_CONFIG
    report = inspect_device(root)
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict()) + "\n")
    else:
        sys.stdout.write("".join(f"{line}\n" for line in _detect_lines(report)))
    return EXIT_OK if report.detection.target is not None else EXIT_PROBLEMS


def _detect_lines(report: Any) -> list[str]:
    identity, mode, detection = report.identity, report.power_mode, report.detection
    lines = [f"target       {detection.target}" if detection.target else f"target       none: {detection.reason}"]
    lines += [f"  evidence   {line}" for line in detection.evidence]
    lines += [f"  note       {line}" for line in (*detection.notes, *identity.notes)]

    def show(value: object) -> str:
        return "-" if value in (None, "", ()) else str(value)

    cpu = f"{show(identity.cpu_model)}, {show(identity.cpu_cores)} cores, {show(identity.cpu_arch)}"
    if identity.isa_flags:
        cpu += f" ({' '.join(identity.isa_flags)})"
    memory = "-" if identity.memory_total_mb is None else f"{identity.memory_total_mb:.0f} MiB"
    ort = show(identity.onnxruntime)
    if identity.onnxruntime_providers:
        ort += f" ({', '.join(identity.onnxruntime_providers)})"
    power = "-" if mode.mode_name is None and mode.mode_id is None else f"{show(mode.mode_name)} (id {mode.mode_id}, {mode.mode_source})"
    clocks = {True: "locked (min = max)", False: "not locked", None: "-"}[mode.clocks_locked]
    lines += [f"board        {show(identity.board)}", f"soc          {show(identity.soc)}", f"os           {show(identity.os_name)}",
              f"l4t          {show(identity.l4t)}", f"jetpack      {show(identity.jetpack)}", f"cuda         {show(identity.cuda)}",
              f"tensorrt     {show(identity.tensorrt)}", f"onnxruntime  {ort}", f"cpu          {cpu}", f"memory       {memory}",
              f"gpu          {show(identity.gpu_name)}", f"power mode   {power}", f"clocks       {clocks}"]  # fmt: skip
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgekit-agent", description="The edgekit device agent.")
    parser.add_argument("--version", action="version", version=f"edgekit-agent {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = commands.add_parser("run", help="run the agent until SIGTERM",
                              description="Serve the current bundle on the local API, send telemetry to the broker and "
                                          "answer fleet commands, until SIGTERM or SIGINT (what systemd starts).")  # fmt: skip
    run.add_argument("--config", "-c", type=Path, required=True, metavar="CONFIG", help="agent YAML (see agent.example.yaml)")
    run.set_defaults(func=_cmd_run)

    check = commands.add_parser("check", help="check config, bundles, sensors and the broker, then exit (non-zero on problems)",
                                description="Check the config, the bundles (signature, hashes, self-check), the power "
                                            "sensor, the paths, and connect to the broker with the config's TLS settings "
                                            "and credentials. Exit 0 when all pass, 1 on problems, 2 on an invalid config.")  # fmt: skip
    check.add_argument("--config", "-c", type=Path, required=True, metavar="CONFIG", help="agent YAML (see agent.example.yaml)")
    check.add_argument("--json", action="store_true", help="print the report as one JSON line")
    check.add_argument("--broker-timeout-s", type=float, default=5.0, metavar="S",
                       help="give up on the broker after S seconds (connect, TLS and login; default 5)")
    check.set_defaults(func=_cmd_check)

    install = commands.add_parser("install", help="install a bundle (directory or .tar) as the current one",
                                  description="First provisioning of a device: verify a bundle (signature, hashes, "
                                              "self-check) as a deploy does, without a broker, and make it the current one.")  # fmt: skip
    install.add_argument("bundle", metavar="BUNDLE", help="bundle directory, .tar from `edgekit pack`, or http(s) URL")
    install.add_argument("--config", "-c", type=Path, required=True, metavar="CONFIG", help="agent YAML (see agent.example.yaml)")
    install.add_argument("--sha256", help="expected sha256 of the tar (or of a directory's manifest.json)")
    install.add_argument("--signature", help="base64 signature over manifest.json, if the bundle has no manifest.sig")
    install.add_argument("--model", help="the model of the repository to install it as (config models:); default: the default model")
    install.set_defaults(func=_cmd_install)

    detect = commands.add_parser("detect", help="name the target profile this device matches, with the evidence",
                                 description="Read the device's identity (board, SoC, JetPack, CPU, memory) and power mode "
                                             "and name the edgekit target profile it matches, with the evidence.")  # fmt: skip
    detect.add_argument("--root", type=Path, default=Path("/"), help="filesystem root to read (default /)")
    detect.add_argument("--json", action="store_true", help="print identity, power mode and target as one JSON line")
    detect.set_defaults(func=_cmd_detect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose + (1 if args.command == "run" else 0), 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
