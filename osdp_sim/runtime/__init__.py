"""Real execution of plans with torch.distributed (needs the `runtime` extra: torch)."""
