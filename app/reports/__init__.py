"""What a cycle writes for people: REPORT.md, result.json and the plots of a cycle and a project."""
