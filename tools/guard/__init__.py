"""The commit guard of path reservations (docs/reservations.md): the git facts it needs
(``project``: root, origin, project id, staged paths, hooks folder), the ``pre-commit`` hook it
installs and removes byte for byte (``hook``), the check the hook runs (``check``), and the
``macula-mcp guard`` command (``command``)."""
