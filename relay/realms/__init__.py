"""Protected realms (issue 13, issue 26): who may act in a realm, who may connect, which links
carry it. Pure, used by the router core."""
