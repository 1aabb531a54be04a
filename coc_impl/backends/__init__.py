"""Device backends of the fused CoC ops; each module owns one foreign runtime."""
