"""Git plumbing: git run safely, mirrors, refs, objects, protected paths; no forge in it."""
