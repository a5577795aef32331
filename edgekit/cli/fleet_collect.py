"""``edgekit fleet collect``: subscribe to the agents' telemetry, status and events and store them, in one process
or ``--workers N`` (one shared subscription group, each worker started again when it dies), ``--retire`` to end a
collector's persistent session for good. The collector itself is :class:`edgekit.fleet.collector.Collector`."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import threading
import time
from typing import Any, Callable

from rich.markup import escape

from edgekit.cli.fleet_options import MAX_PORT, finite_number, port_number, store_option
from edgekit.cli.options import console, json_parent, print_json, results

DEFAULT_METRICS_PORT = 9108
DEFAULT_RETENTION_HOURS = 1.0
#: Shared subscription group of ``fleet collect --workers N`` when no --shared-group is given.
DEFAULT_WORKER_GROUP = "edgekit-collectors"
#: ``fleet collect``'s --session-expiry default (seconds): a day, as edgekit.fleet.collector.DEFAULT_SESSION_EXPIRY_S.
DEFAULT_SESSION_EXPIRY_S = 24 * 3600
#: A dead ``--workers`` process is started again after this long, doubled on each quick death up to the maximum.
WORKER_RESTART_DELAY_S, WORKER_RESTART_MAX_DELAY_S = 1.0, 30.0
#: A worker that ran this long before it died is restarted after the first delay again.
WORKER_STABLE_S = 60.0
#: ``--workers N`` retires the sessions of workers N, N+1, ... left by a run with more, up to the first without one.
MAX_SURPLUS_WORKERS = 64
#: Days ``fleet collect`` keeps per-device rollups (5-minute buckets: about 290 rows a device a day).
DEFAULT_ROLLUP_RETENTION_DAYS = 30.0


def register(fleet_subparsers: argparse._SubParsersAction) -> None:
    parser = fleet_subparsers.add_parser(
        "collect", parents=[json_parent()], help="subscribe to the agents' telemetry and store it (until Ctrl-C)",
        description="Subscribe to every device's telemetry, status and events, validate each message against the "
                    "agent's JSON Schema, and store it. Run several with the same --shared-group to split the load.",
    )  # fmt: skip
    parser.add_argument("--broker", required=True, metavar="URL", help="mqtt://HOST:1883 or mqtts://HOST:8883")
    store_option(parser)
    parser.add_argument("--fleet", metavar="F", help="collect only this fleet (default: every fleet)")
    parser.add_argument("--shared-group", metavar="G", help="MQTT 5 shared subscription group ($share/G/...)")
    parser.add_argument("--client-id", metavar="ID",
                        help="MQTT client id, the same at every start so the broker keeps the session (default "
                             "edgekit-collector-HOST-FLEET[-GROUP]; workers add -0, -1, ...)")  # fmt: skip
    parser.add_argument("--session-expiry", type=int, default=DEFAULT_SESSION_EXPIRY_S, metavar="S",
                        help="keep the MQTT session S seconds after a disconnect, so messages published while the "
                             f"collector is down wait for it (default {DEFAULT_SESSION_EXPIRY_S}; MQTT 3.1.1: a "
                             "clean_session=false session; 0: a clean session, which loses them)")  # fmt: skip
    parser.add_argument("--metrics-port", type=port_number, default=DEFAULT_METRICS_PORT, metavar="P",
                        help=f"serve Prometheus /metrics on this port (default {DEFAULT_METRICS_PORT}; 0 picks a free one)")
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="ADDR", help="address of /metrics (default loopback)")
    parser.add_argument("--no-metrics", action="store_true", help="do not serve /metrics")
    parser.add_argument("--metrics-per-device", action="store_true",
                        help="also serve per-device series on /metrics (about 15 a device; they are always on "
                             "/metrics/devices[?fleet=F]); by default /metrics holds fleet-level series only")  # fmt: skip
    parser.add_argument("--metrics-cache-seconds", type=float, default=5.0, metavar="S",
                        help="read the store for the fleet-level series every S seconds while /metrics is scraped, "
                             "in the background (default 5; 0 reads it in every scrape)")  # fmt: skip
    parser.add_argument("--retention-hours", type=finite_number, default=DEFAULT_RETENTION_HOURS, metavar="H",
                        help=f"keep raw windows H hours, then roll them up into buckets (default {DEFAULT_RETENTION_HOURS:g}; "
                             "0 keeps them forever)")  # fmt: skip
    parser.add_argument("--rollup-minutes", type=int, default=5, metavar="M", help="rollup bucket size (default 5)")
    parser.add_argument("--rollup-retention-days", type=finite_number, default=DEFAULT_ROLLUP_RETENTION_DAYS, metavar="D",
                        help=f"keep each device's rollups and the fleet's 1-minute figures D days (default "
                             f"{DEFAULT_ROLLUP_RETENTION_DAYS:g}; 0 keeps them forever; the fleet's hourly figures and "
                             "each device's totals are always kept)")  # fmt: skip
    parser.add_argument("--username", help="broker username")
    parser.add_argument("--password-file", metavar="PATH", help="file holding the broker password")
    parser.add_argument("--allow-plaintext-password", action="store_true",
                        help="send the password over mqtt:// (no TLS) to a broker that is not on loopback (refused "
                             "otherwise; only on a network you trust)")  # fmt: skip
    parser.add_argument("--tls-ca", metavar="PEM", help="CA that signed the broker's certificate (mqtts)")
    parser.add_argument("--tls-cert", metavar="PEM", help="client certificate (mqtts)")
    parser.add_argument("--tls-key", metavar="PEM", help="client key (mqtts)")
    parser.add_argument("--mqtt-version", choices=("5", "3.1.1"), default="3.1.1",
                        help="MQTT protocol of the collector (default 3.1.1: cheaper to receive; QoS 1, retained status, "
                             "wills and $share work on Mosquitto and EMQX; 5 for brokers that share only with MQTT 5)")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=500, help="records per store write (default 500)")
    parser.add_argument("--max-payload-kib", type=int, default=256, help="largest message accepted (default 256 KiB)")
    parser.add_argument("--ack-after-store", action=argparse.BooleanOptionalAction, default=True,
                        help="acknowledge messages only once stored, so a killed collector loses nothing (default; "
                             "give the broker a max_inflight_messages well above --batch-size); --no-ack-after-store "
                             "acknowledges on arrival")  # fmt: skip
    parser.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: run until Ctrl-C)")
    parser.add_argument("--retire", action="store_true",
                        help="end this collector's persistent session for good (scale-in): resume it, stop the broker "
                             "routing to it, store what it holds, then end it and exit; same --client-id (or "
                             "--fleet/--shared-group for the default id) as the collector ran with")  # fmt: skip
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="run N collector processes in one shared subscription group (--shared-group, default "
                             f"{DEFAULT_WORKER_GROUP}) to use N cores, and start again any that dies; worker i serves "
                             "/metrics on P+i (default 1)")  # fmt: skip
    parser.add_argument("--alerts", action="store_true",
                        help="evaluate the shipped alert rules (edgekit/fleet/alerts/default_rules.yaml; docs/fleet.md, Alerts)")
    parser.add_argument("--alert-rules", metavar="FILE",
                        help="evaluate the alert rules in FILE (YAML, schema edgekit/fleet/alerts/alert_rules.schema.json); "
                             "alerts go to edgekit/v1/FLEET/alerts and the store's events")  # fmt: skip
    parser.add_argument("--alert-webhook", metavar="URL", help="also POST each alert firing/resolved notice to URL as JSON")
    parser.set_defaults(func=run_collect)


def run_collect(args: argparse.Namespace) -> int:
    if getattr(args, "retire", False):
        return _retire(args)
    if getattr(args, "workers", 1) != 1:
        return _run_collect_workers(args)
    return _collect(args)


def _retire_session(args: argparse.Namespace, store: Any, client_id: str, shared_group: str | None) -> int | None:
    """Drain and end ``client_id``'s session (see ``Collector.retire``); None when the broker had none."""
    from edgekit.fleet.collector import Collector

    return Collector(
        args.broker, store, client_id=client_id, fleet=args.fleet, shared_group=shared_group,
        max_payload_bytes=args.max_payload_kib * 1024, batch_size=args.batch_size, username=args.username,
        password_file=args.password_file, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
        session_expiry_s=args.session_expiry, retention=None, mqtt_version=args.mqtt_version,
        allow_plaintext_password=getattr(args, "allow_plaintext_password", False),
    ).retire()  # fmt: skip


def _retire(args: argparse.Namespace) -> int:
    from edgekit.fleet.collector import default_client_id
    from edgekit.fleet.errors import FleetError
    from edgekit.fleet.store import open_store

    _check_collect_options(args)
    if args.session_expiry == 0:
        raise FleetError("--retire needs the persistent session the collector ran with, not --session-expiry 0",
                         hint="leave --session-expiry out (or give the value the collector used)")  # fmt: skip
    if args.workers != 1:
        raise FleetError("--retire ends one session; --workers retires the sessions of workers it no longer has "
                         "by itself", hint="run --retire with the --client-id of the session to end")  # fmt: skip
    client_id = args.client_id or default_client_id(args.fleet, args.shared_group)
    with open_store(args.store) as store:
        drained = _retire_session(args, store, client_id, args.shared_group)
    console.print(f"no session for {escape(client_id)} on {escape(args.broker)}" if drained is None else
                  f"retired the session of {escape(client_id)}: stored what it held ({drained} messages)")  # fmt: skip
    if args.json:
        print_json({"event": "retired", "client_id": client_id, "session_found": drained is not None,
                    "drained": drained or 0})  # fmt: skip
    return 0


def _check_collect_options(args: argparse.Namespace) -> None:
    from edgekit.fleet.errors import FleetError

    if args.rollup_retention_days < 0:
        raise FleetError(f"--rollup-retention-days must be >= 0, got {args.rollup_retention_days:g}",
                         hint="0 keeps rollups forever")  # fmt: skip
    if args.retention_hours < 0:
        raise FleetError(f"--retention-hours must be >= 0, got {args.retention_hours:g}", hint="0 keeps raw windows forever")
    if args.rollup_minutes < 1:
        raise FleetError(f"--rollup-minutes must be a whole number of minutes >= 1, got {args.rollup_minutes}",
                         hint="the size of the buckets raw windows are rolled up into; the default is 5")  # fmt: skip
    last_port = args.metrics_port + args.workers - 1
    if not args.no_metrics and args.metrics_port and last_port > MAX_PORT:
        raise FleetError(f"--metrics-port {args.metrics_port} with --workers {args.workers} needs ports up to {last_port}, "
                         f"beyond {MAX_PORT}", hint="give a lower --metrics-port (worker i serves /metrics on P+i), or 0")  # fmt: skip
    if args.session_expiry < 0:
        raise FleetError(f"--session-expiry must be >= 0 seconds, got {args.session_expiry}",
                         hint=f"0 is a clean session (messages sent while the collector is down are lost); the "
                              f"default {DEFAULT_SESSION_EXPIRY_S} keeps them a day")  # fmt: skip


def _start_metrics_server(args: argparse.Namespace, metrics: Any) -> tuple[Any, Any]:
    """The /metrics server and the store it reads: a connection of its own, so a scrape never waits for the writer."""
    from edgekit.fleet.metrics import MetricsServer
    from edgekit.fleet.store import open_store

    store = open_store(args.store)
    try:
        return MetricsServer(metrics, args.metrics_port, args.metrics_host, store=store, fleet=args.fleet,
                             per_device=args.metrics_per_device, cache_s=args.metrics_cache_seconds).start(), store  # fmt: skip
    except BaseException:
        store.close()
        raise


def _collect(args: argparse.Namespace, on_started: Callable[[], None] | None = None,
             orphaned: Callable[[], bool] | None = None) -> int:
    """One collector until SIGTERM, Ctrl-C, ``--duration`` or (a worker) ``orphaned()``."""
    from edgekit.fleet.alerts.engine import alert_engine_for
    from edgekit.fleet.collector import Collector, default_client_id
    from edgekit.fleet.metrics import IngestMetrics
    from edgekit.fleet.store import open_store
    from edgekit.fleet.store.urls import redact

    _check_collect_options(args)
    client_id = args.client_id or default_client_id(args.fleet, args.shared_group)
    retention = dt.timedelta(hours=args.retention_hours) if args.retention_hours > 0 else None
    metrics = IngestMetrics()
    with open_store(args.store) as store:
        server, metrics_store = (None, None) if args.no_metrics else _start_metrics_server(args, metrics)
        try:
            collector = Collector(
                args.broker, store, client_id=client_id, fleet=args.fleet, shared_group=args.shared_group,
                max_payload_bytes=args.max_payload_kib * 1024, batch_size=args.batch_size, username=args.username,
                password_file=args.password_file, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
                session_expiry_s=args.session_expiry, retention=retention, rollup_minutes=args.rollup_minutes,
                rollup_retention=dt.timedelta(days=args.rollup_retention_days) if args.rollup_retention_days > 0 else None,
                metrics=metrics, ack_after_store=args.ack_after_store, mqtt_version=args.mqtt_version,
                allow_plaintext_password=getattr(args, "allow_plaintext_password", False),
                alerts=alert_engine_for(store, getattr(args, "alert_rules", None), use_default_rules=getattr(args, "alerts", False),
                                        webhook_url=getattr(args, "alert_webhook", None), fleet=args.fleet),
            ).start()  # fmt: skip
            # SIGTERM (systemd, docker stop): store, then exit; set before "started" is announced.
            terminated = threading.Event()
            previous = signal.signal(signal.SIGTERM, lambda *_: terminated.set())
            try:
                if on_started is not None:
                    on_started()
                console.print(f"collecting from {escape(collector.broker_url)} into {escape(redact(store.url))} as "
                              f"{escape(client_id)} ({', '.join(collector.subscriptions)})"
                              + (f"; metrics on {server.url}" if server else "")
                              + (f"; store layout: {store.layout} ({escape(store.timescale_detection.reason)})"
                                 if hasattr(store, "timescale_detection") else ""))  # fmt: skip
                if args.json:
                    print_json({"event": "started", "broker": collector.broker_url, "store": redact(store.url),
                                "store_layout": getattr(store, "layout", None),
                                "client_id": client_id, "session_expiry_s": args.session_expiry, "pid": os.getpid(),
                                "subscriptions": list(collector.subscriptions),
                                "metrics_url": server.url if server else None})  # fmt: skip
                deadline = None if args.duration is None else time.monotonic() + args.duration
                while not terminated.is_set() and (deadline is None or time.monotonic() < deadline):
                    if orphaned is not None and orphaned():
                        console.print("[yellow]the --workers parent is gone[/]")
                        break
                    terminated.wait(0.2 if deadline is None else max(min(0.2, deadline - time.monotonic()), 0.0))
            except KeyboardInterrupt:
                pass
            finally:
                signal.signal(signal.SIGTERM, previous)
                console.print("stopping: storing what was received")
                collector.stop()
        finally:
            if server is not None:
                server.stop()
                metrics_store.close()
    counts = metrics.snapshot()
    results(args).print(f"received {sum(counts['received'].values())}, stored {sum(counts['stored'].values())}, "
                        f"duplicates {sum(counts['duplicates'].values())}, rejected {sum(counts['rejected'].values())}")
    if args.json:
        print_json({"event": "stopped", **counts})
    return 0


class _Worker:
    """One ``--workers`` process, started again (same client id, same session) whenever it dies."""

    def __init__(self, index: int, options: dict[str, Any], context: Any) -> None:
        self.index, self.options, self._context = index, options, context
        self.process: Any = None
        self.started = context.Event()  # set by the worker once subscribed
        self.ever_started = False
        self.starts = 0
        self.delay_s = WORKER_RESTART_DELAY_S
        self.restart_at: float | None = None
        self._began = 0.0

    def start(self, deadline: float | None) -> None:
        options = dict(self.options)
        if deadline is not None:
            options["duration"] = max(deadline - time.monotonic(), 0.0)
        self.started.clear()
        self.process = self._context.Process(target=_collect_worker, args=(options, self.started, os.getpid()),
                                             name=f"edgekit-collector-{self.index}")  # fmt: skip
        self.process.start()
        self.starts += 1
        self._began, self.restart_at = time.monotonic(), None

    def died(self) -> None:
        """Plan the next start: after the delay, doubled while the worker keeps dying young."""
        if time.monotonic() - self._began >= WORKER_STABLE_S:
            self.delay_s = WORKER_RESTART_DELAY_S
        self.restart_at = time.monotonic() + self.delay_s
        self.delay_s = min(self.delay_s * 2, WORKER_RESTART_MAX_DELAY_S)


def _run_collect_workers(args: argparse.Namespace) -> int:
    """``--workers N``: N collector processes (one per core) splitting the load through one shared group, each
    started again if it dies (a crash, the OOM killer, ``kill -9``) with the same client id, so it resumes its
    persistent session and the messages the broker holds for it."""
    import multiprocessing

    from edgekit.fleet.collector import default_client_id
    from edgekit.fleet.errors import FleetError

    if args.workers < 1:
        raise FleetError(f"--workers must be >= 1, got {args.workers}", hint="use one worker per core, e.g. --workers 2")
    _check_collect_options(args)
    from edgekit.fleet.store import open_store

    with open_store(args.store):  # create or migrate the schema once, before the workers race to
        pass
    group = args.shared_group or DEFAULT_WORKER_GROUP
    base_id = args.client_id or default_client_id(args.fleet, group)
    context = multiprocessing.get_context("spawn")  # no forked paho/sqlite state
    workers = []
    for index in range(args.workers):
        options = dict(vars(args), workers=1, shared_group=group, client_id=f"{base_id}-{index}")
        if index:  # one alert engine: worker 0's (it judges error rates and spools from its own share of windows)
            options.update(alerts=False, alert_rules=None, alert_webhook=None)
        options.pop("func", None)
        if args.metrics_port:
            options["metrics_port"] = args.metrics_port + index
        workers.append(_Worker(index, options, context))
    if args.session_expiry:
        with open_store(args.store) as store:  # the sessions of workers a run with more of them left behind
            for index in range(args.workers, args.workers + MAX_SURPLUS_WORKERS):
                drained = _retire_session(args, store, f"{base_id}-{index}", group)
                if drained is None:
                    break
                console.print(f"retired the session of {escape(base_id)}-{index} (a worker of an earlier run with more "
                              f"workers): stored the {drained} messages it held")  # fmt: skip
                if args.json:
                    print_json({"event": "retired", "client_id": f"{base_id}-{index}", "session_found": True,
                                "drained": drained})  # fmt: skip
    console.print(f"starting {args.workers} collector workers in shared group {escape(group)} as {escape(base_id)}-<i>")
    stopping = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set())  # each worker stores what it holds, then exits
    deadline = None if args.duration is None else time.monotonic() + args.duration
    failure = 0
    try:
        for worker in workers:
            worker.start(deadline)
        while not stopping.is_set():
            running = False
            for worker in workers:
                if worker.started.is_set():
                    worker.ever_started = True
                if worker.process.is_alive():
                    running = True
                    continue
                code = worker.process.exitcode
                if worker.restart_at is None and worker.process.exitcode is not None:
                    worker.process.join()
                    if code == 0:
                        continue  # --duration reached: done
                    if not worker.ever_started:  # it never subscribed: a usage or connection error, not a crash
                        failure = code if code and code > 0 else 1
                        stopping.set()
                        break
                    console.print(f"[yellow]collector worker {worker.index} (pid {worker.process.pid}) died "
                                  f"({_exit_reason(code)}); starting it again in {worker.delay_s:g} s[/]")  # fmt: skip
                    worker.died()
                running = True
                if worker.restart_at is not None and time.monotonic() >= worker.restart_at:
                    worker.start(deadline)
            if not running:
                break
            stopping.wait(0.2)
    except KeyboardInterrupt:  # Ctrl-C reached the workers too (same process group); wait for them to store
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        for worker in workers:
            if worker.process is not None and worker.process.is_alive():
                worker.process.terminate()
        for worker in workers:
            if worker.process is not None:
                _join_ignoring_ctrl_c(worker.process)
    codes = [worker.process.exitcode or 0 for worker in workers if worker.restart_at is None]
    return failure or max((code for code in codes if code > 0), default=0)


def _join_ignoring_ctrl_c(process: Any) -> None:
    try:
        process.join()
    except KeyboardInterrupt:
        process.join()


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _collect_worker(options: dict[str, Any], started: Any, parent_pid: int) -> None:
    """One ``--workers`` process: a plain ``fleet collect`` with its own client id (and metrics port). It stops
    (storing what it holds) when its parent is gone, so that a restarted command's new worker with the same
    client id does not fight an orphan for the session."""
    from edgekit.errors import EdgekitError

    try:
        code = _collect(argparse.Namespace(**options), on_started=started.set, orphaned=lambda: os.getppid() != parent_pid)
    except EdgekitError as exc:
        console.print(f"[bold red]error:[/] {escape(exc.message)}", soft_wrap=True)
        if exc.hint:
            console.print(f"  [yellow]hint:[/] {escape(exc.hint)}", soft_wrap=True)
        code = 2
    except KeyboardInterrupt:
        code = 0
    raise SystemExit(code)
