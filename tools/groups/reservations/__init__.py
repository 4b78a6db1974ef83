"""Path-reservation tools (``mesh_reserve_paths``, ``mesh_release_paths``,
``mesh_reservations``): a package of its own so that ``tools/groups`` stays within 20 modules.
``reservations`` holds the tools (named like its descriptions file); ``register`` and
``TOOLS`` are the group's face."""

from tools.groups.reservations.reservations import TOOLS, register

__all__ = ["TOOLS", "register"]
