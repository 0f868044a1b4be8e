"""scaling: sweep-driven throughput-scaling experiments for LLM training."""
