"""End-to-end tests: an unmodified virtiofsd serving a real Linux guest."""
