"""burstrl: GRPO post-training as a file-based DVC pipeline split across cheap inference boxes and a rented GPU.

The package is in layers, lowest first; a module imports only from its own layer or lower ones (a test checks):
errors, config and atomic; data; pipeline; inference; rl; training; remote; reporting. The scripts in stages/,
one per DVC stage, sit on top and are kept short. `python -m burstrl` lists the commands a user runs by hand.
"""
