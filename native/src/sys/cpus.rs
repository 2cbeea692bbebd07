//! The CPUs the calling thread may run on.

/// How many CPUs the calling thread may run on (sched_getaffinity(0)); 1 on an error.
pub fn cpus_allowed() -> usize {
    // SAFETY: cpu_set_t is plain data (all-zero is a valid, empty set).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most size_of::<cpu_set_t>() bytes into set, the size passed.
    let ret =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if ret != 0 {
        return 1;
    }
    // SAFETY: set is initialised (zeroed, then filled by the kernel).
    (unsafe { libc::CPU_COUNT(&set) }).max(1) as usize
}
