"""The agents that propose what a cycle runs: the sweep planner and the command agent."""
