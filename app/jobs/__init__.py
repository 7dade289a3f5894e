"""The GPU queue: jobs, leases, workers, budgets, the reaper's rules, the queue's figures."""
