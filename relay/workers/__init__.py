"""``macula-relay --workers N``: one station as N processes on one UDP port."""
