"""The Python reference of the per-call data plane: readable code that receives a trapped
call, reads the calling thread and answers it (`data_plane = "python"`, and the native
plane's fallback). The native plane (native/src/plane.rs) is tested against it: both
answer the same kernel, adversarial and end-to-end tests.

What the control plane also uses (the listener, /proc status, the registered Target)
stays in monitor/; the handlers are monitor/handlers/.
"""
