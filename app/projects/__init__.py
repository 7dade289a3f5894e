"""Operational state: projects, tokens, cycles, jobs, leases. Wipeable without losing knowledge."""
