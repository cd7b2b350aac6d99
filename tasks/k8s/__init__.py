"""Kubernetes as a target: the API calls, provisioning, access from outside, in-cluster load and flows."""
