"""Research lines: a campaign's cycles start at its line's tip, and the line keeps only the
confirmed wins (docs/design.md, "Research lines"). The keep rule is `app/cycles/judge/keep.py`;
the campaign's records are `models.py`, its moves `driver.py`, its git `line.py`."""
