"""Parts of the fleet simulator (:mod:`edgekit.fleet.simulate`): synthetic per-target profiles, the
virtual agent's behaviour, and the single-threaded loop that drives many MQTT connections."""
