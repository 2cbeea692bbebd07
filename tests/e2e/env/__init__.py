"""Preparation of the e2e environment (run prepare.sh / prepare.py as a script)."""
