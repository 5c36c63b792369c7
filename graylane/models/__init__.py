"""Models Graylane generates itself (no downloads): the seeded demo GPT."""
