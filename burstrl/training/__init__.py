"""The backward pass: TRL's GRPOTrainer fed with scored rollouts, its checkpoints and save cadence, multi-GPU
launch, the supervised warm-up and the embedded tiny model. Imports rl and everything below."""
