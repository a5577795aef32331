"""``fleet simulate --bundle-behaviour ID:KEY=V,...``: how a bundle misbehaves on simulated devices, read and checked
(the live simulator and ``--history`` both take it)."""

from __future__ import annotations

import argparse

from edgekit.cli.fleet_options import finite_number, share

_HINT = ("write ID:key=value,... with keys error_rate (a share from 0 to 1), latency_factor and power_factor (finite, "
         "above 0), self_check (pass|fail)")  # fmt: skip


def _factor(text: str) -> float:
    """A finite multiplier above 0 (3: three times slower)."""
    what = "a factor above 0, e.g. 3 (three times the profile's figure)"
    value = finite_number(text, what)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0: give {what}")
    return value


_NUMBERS = {"error_rate": share, "latency_factor": _factor, "power_factor": _factor}


def parse_behaviour(text: str) -> tuple[str, object]:
    """``ID:error_rate=0.3,latency_factor=2,self_check=fail`` -> (ID, BundleBehaviour); a value that is not a number,
    not finite or out of range raises :class:`~edgekit.fleet.simulate.SimulationError` naming the option and key."""
    from edgekit.fleet.simulate import BundleBehaviour, SimulationError

    bundle_id, _, spec = text.partition(":")
    if not bundle_id or not spec:
        raise SimulationError(f"--bundle-behaviour {text!r} has no ID:settings", hint=_HINT)
    values: dict[str, object] = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        if key in _NUMBERS:
            try:
                values[key] = _NUMBERS[key](value)
            except argparse.ArgumentTypeError as exc:
                raise SimulationError(f"--bundle-behaviour {text!r}: {key} {exc}", hint=_HINT) from None
        elif key == "self_check" and value in ("pass", "fail"):
            values["self_check_passes"] = value == "pass"
        else:
            raise SimulationError(f"--bundle-behaviour {text!r}: cannot read {item!r}", hint=_HINT)
    return bundle_id, BundleBehaviour(**values)  # type: ignore[arg-type]
