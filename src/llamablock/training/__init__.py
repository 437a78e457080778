"""Training the Shakespeare models: data, the loop, checkpoints, torch.distributed."""
