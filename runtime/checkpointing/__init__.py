"""Weights out and back in: the safetensors export format, periodic checkpoints in that format, and
when to write them (Young/Daly, torch-free: the control plane and the simulator import it).

Nothing is imported here, so `durability` loads without torch."""
