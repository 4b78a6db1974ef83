"""Realms with a self-hosted authority (issue 13).

- ``records``: the realm directory record (0x03), endorsements and revocations (0x05), and
  the checks every holder runs on them (the station's enforcement imports these too).
- ``codes``: join codes people type, and the limit on wrong guesses.
- ``join``: the join request and its proof of possession, shared by both ends.
- ``authority``: a realm's own files under ``$MACULA_HOME/realms/<name>/`` (key, state).
- ``service``: the join service an authority runs on the mesh (``macula-realm serve``).
- ``membership``: a node's confirmed memberships on disk, and presenting them to a station.
- ``joiner``: the client half of the join flow (``mesh_join_realm``).
- ``cli``: ``macula-realm``.
"""
