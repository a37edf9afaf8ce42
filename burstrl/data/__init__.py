"""The files that pass between stages: the Parquet contract (schemas, invariants, readers and writers), policy
checkpoints and their metadata, and the task's prompts and answers. Imports only errors, config and atomic."""
