"""Happens-before hazard detection over the device layer's streams."""
