"""Fleet alerts: rules as validated YAML (:mod:`.rules`), what each rule kind checks (:mod:`.conditions`), the
engine the collector runs (:mod:`.engine`), its notices over MQTT, webhook and store events (:mod:`.notify`),
the alerts firing now for the dashboard and ``fleet status`` (:func:`active_alerts`), and the same rules as a
Prometheus rule file (:mod:`.prometheus`).
"""

from __future__ import annotations

from edgekit.fleet.alerts.active import ActiveAlert, active_alerts
from edgekit.fleet.alerts.engine import AlertEngine
from edgekit.fleet.alerts.rules import DEFAULT_RULES_PATH, AlertRules, AlertRulesError, load_alert_rules

__all__ = ["ActiveAlert", "AlertEngine", "AlertRules", "AlertRulesError", "DEFAULT_RULES_PATH", "active_alerts",
           "load_alert_rules"]
