"""What every stage runs inside: argument parsing, logs and exits (stage), resumable progress (resume), kill
points for tests (faults), the reaper of a dead stage's processes (orphans), the iteration list, the stage and
chart catalog, each stage's code from its imports (deps), the run's status, scratch workspaces, and the two
lanes that run stages at the same time and record them in dvc.lock (lanes).
Imports data and the base modules only."""
