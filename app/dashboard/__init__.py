"""The review dashboard: server-rendered pages for PRs, cycles, the GPU queue and memory."""
