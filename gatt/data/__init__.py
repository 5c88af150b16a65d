"""The data wing: dialogues read and validated, the programmatic checks and constraint sets, instructions at any
turn (events), and the GAtt collator that turns dialogues into training batches."""
