"""Metrics and plots."""
