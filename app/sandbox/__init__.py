"""Confinement for untrusted code (the agent, pip builds, experiments): bubblewrap namespaces
around each process tree (`bwrap.py`), and one cgroup v2 per run that is killed as a whole
(`cgroups.py`); `confined.py` runs a program to completion under both, and says whether this
host can.
"""
