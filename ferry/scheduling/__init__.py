"""Per-model queues, the batching policy, and the workers that drain them."""
