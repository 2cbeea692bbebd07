"""One handler per trapped syscall, in a registry; cross-cutting concerns are middleware."""
