"""What an operator can do about a device's deploy failure: the hint ``edgekit fleet deploy`` prints beside it."""

from __future__ import annotations

#: What to do about a device's failure: (``details.step`` of its ``deploy_result``, or ``details.reason``
#: of its ``command_rejected``; text its message contains, or ""; the hint). The first match wins.
FAILURE_HINTS: tuple[tuple[str, str, str], ...] = (
    ("download", "deploy source refused",
     "the agent takes deploys only from its bundles.inbox or bundles.allowed_sources: deploy with --inbox DIR "
     "(a directory it accepts) or --url-base URL (under an allowed https:// prefix), or add the tar's directory "
     "to bundles.allowed_sources"),
    ("download", "", "check that the device can reach the URL and that the tar there is the one deployed"),
    ("version", "", "the device already runs a newer version of this bundle: pass --allow-downgrade to go back on purpose"),
    ("io_signature", "", "the bundle changes the inputs or outputs clients use: update the clients, then pass "
     "--allow-signature-change"),
    ("signature", "", "the device's bundles.public_key is not the key that signed the bundle: sign it with the fleet key"),
    ("self_check", "", "the bundle does not reproduce its golden outputs on this device: check the target and rebuild"),
    ("watching", "", "the device's own health watch found the new bundle unhealthy; see its events"),
    ("unsigned", "", "the agent requires signed commands (commands.require_signed): pass --sign-commands fleet.key.pem"),
    ("bad_signature", "", "the command was signed with another key than the device's bundles.public_key"),
    ("expired", "", "the device clock and this host's disagree: check NTP on both"),
    ("future", "", "the device clock and this host's disagree: check NTP on both"),
    ("queued", "", "another deploy or rollback was running on the device: deploy again when it has finished"),
)  # fmt: skip


def failure_hint(step: str | None, message: str) -> str | None:
    """The first :data:`FAILURE_HINTS` entry for ``step`` whose text is in ``message``."""
    for hint_step, contains, hint in FAILURE_HINTS:
        if step == hint_step and contains in message:
            return hint
    return None
