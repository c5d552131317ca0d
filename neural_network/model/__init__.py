"""The MLP, its losses, the Model (normalisation, clamp, mean pose), the trainer and checkpoints."""
