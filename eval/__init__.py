"""Offline evaluation on BEIR-format collections."""
