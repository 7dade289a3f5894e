"""Research cycles: triggers, the step machine, review and merge, schedules."""
