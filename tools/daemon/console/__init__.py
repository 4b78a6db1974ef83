"""The person's console: a page the daemon serves on loopback (``tools.daemon.http.listener``)
showing
what its agents see and letting the person answer, write and decide (issue 24)."""
