"""The store's smaller tables, one module per family: gates and quarantine, metrics, tasks,
reviews, checkpoints. Each is reached through the store (`store.gates`, `store.metrics`, ...)."""
