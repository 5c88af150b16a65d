"""The plumbing wing, below every other: configs that are the command line, one-line errors for bad input, files
written whole, the machine a timing came from, and the processes of a job (the work split across them, process trees
ended whole)."""
