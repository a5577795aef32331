"""The fleet subcommands this package adds (simulate, deploy, dashboard, up), registered on a parser the
way ``edgekit/cli/fleet.py`` does, and run through their handlers."""

from __future__ import annotations

import argparse
import json

import pytest

from tests.runtime.agent.mosquitto import mosquitto, mosquitto_factory  # noqa: F401 (fixtures)

MODULES = ("edgekit.cli.fleet_dashboard", "edgekit.cli.fleet_up", "edgekit.cli.fleet_simulate", "edgekit.cli.fleet_deploy")


def _parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="edgekit fleet")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    subparsers = parser.add_subparsers(dest="fleet_command", required=True)
    for name in MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def test_every_subcommand_registers_with_a_handler_and_json() -> None:
    parser = _parser()
    for argv in (["dashboard", "--store", "sqlite:///x.db"], ["up", "--simulate", "3"],
                 ["simulate", "--broker", "mqtt://h:1883", "--devices", "2"],
                 ["deploy", "b.tar", "--broker", "mqtt://h", "--store", "sqlite:///x.db", "--target", "t"]):  # fmt: skip
        args = parser.parse_args(argv + ["--json"])
        assert callable(args.func) and args.json is True


def test_deploy_needs_exactly_one_selection() -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["deploy", "b.tar", "--broker", "mqtt://h", "--store", "sqlite:///x.db"])


def test_simulate_runs_and_reports_json(mosquitto, tmp_path, capsys) -> None:  # noqa: F811
    store_url = f"sqlite:///{tmp_path}/fleet.db"
    args = _parser().parse_args(["simulate", "--broker", mosquitto.url, "--devices", "2", "--rate", "10", "--duration", "0.5",
                                 "--targets", "raspberry-pi-5", "--store", store_url, "--json"])  # fmt: skip
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["devices"] == 2 and report["windows"] >= 4 and report["acked"] == report["published"] and report["synthetic"]
    from edgekit.fleet.store import open_store

    with open_store(store_url) as store:  # the simulator recorded its devices' targets
        targets = {s.target for s in store.device_summaries()}
    assert targets == {"raspberry-pi-5"}


def test_deploy_of_an_unsigned_bundle_fails_before_connecting(tmp_path) -> None:
    from edgekit.fleet.rollout_bundle import BundleNotSignedError
    from tests.runtime.agent_service.bundles import make_bundle

    bundle = make_bundle(tmp_path / "plain", name="plain")
    args = _parser().parse_args(["deploy", str(bundle), "--broker", "mqtt://127.0.0.1:1", "--store", "sqlite:///x.db",
                                 "--devices", "a"])  # fmt: skip
    with pytest.raises(BundleNotSignedError, match="is not signed"):
        args.func(args)
