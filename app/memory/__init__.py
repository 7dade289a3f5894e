"""Research memory: the lab's lasting knowledge, in its own database."""
