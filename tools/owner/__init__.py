"""What the owner (a person, never the model) controls: the capability switches of the tools, the
approval queue, and the audit trail of what the agent did (issue 39)."""
