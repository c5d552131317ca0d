"""The 50 inputs, datasets and their files, augmentation and the demo rig's procedural motion."""
