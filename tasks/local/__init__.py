"""Real vLLM engines on this host as a target: vLLM's own environment, the tiny CPU model, the processes."""
