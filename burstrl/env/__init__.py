"""Multi-turn episodes, token in and token out: TRL's tool and environment contract by dotted name, the sandboxed
tool worker, the chat template's conventions, the episode loop and the built-in calculator task. Imports data,
pipeline and the base modules; the sampler it drives (an engine or a server pool) is passed in."""
