"""The owner's tool groups (issue 39): what the model may read of what the owner controls,
never change. A package of its own so that ``tools/groups`` stays within 20 modules."""
