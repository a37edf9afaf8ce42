"""burstrl: GRPO post-training as a file-based DVC pipeline split across cheap inference boxes and a rented GPU."""
