"""The door to the A2A world (issue 42): the daemon serves A2A 1.0 for the agents it hosts, and a
mesh agent hands tasks to allowlisted A2A agents. Built on the official ``a2a-sdk``."""
