"""Multi-turn episodes: tools and environments in TRL's contract, run in a sandbox, token in and token out."""
