"""Exact IK refinement after the network: closed-form limbs, reach assist, least squares."""
