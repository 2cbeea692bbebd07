"""Sans-IO wire formats and kernel ABI for fhmon: bytes in, objects out, no sockets."""
