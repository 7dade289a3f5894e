"""Research cycles: the project config, the state machine, and the agents that propose."""
