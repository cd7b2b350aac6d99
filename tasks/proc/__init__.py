"""Processes on this host, shared by the simulator and local targets: start, registration, death with the run."""
