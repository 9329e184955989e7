"""What people and their tools see of a controller: its admin endpoint and clients, the snapshot, metrics, per-proc stats and stacks."""
