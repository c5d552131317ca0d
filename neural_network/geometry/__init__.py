"""Rotations, quaternions and forward kinematics (with its vector-Jacobian product)."""
