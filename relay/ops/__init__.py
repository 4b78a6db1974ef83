"""How an operator runs a station: ``macula-relay``'s options, config file, service mode,
reload, systemd notify and lifetime."""
