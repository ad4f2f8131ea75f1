"""Training: model zoo, samplers, the training loop and checkpoints (used by the CLI and examples)."""
