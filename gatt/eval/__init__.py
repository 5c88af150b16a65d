"""Adherence evaluation: roll out dialogues, score each turn against the instruction, write the report."""
