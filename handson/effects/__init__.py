"""Side effects outside the queue: the claims table, mailers, one SQL type."""
