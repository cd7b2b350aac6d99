"""The physics of a GPU node serving an LLM: the roofline cost model shared by specs, estimates and the simulator."""
