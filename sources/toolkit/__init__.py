"""Helpers the sources share; no source imports another source."""
