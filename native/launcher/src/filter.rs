//! The target-side filter as a classic BPF program: USER_NOTIF for name_to_handle_at and
//! open_by_handle_at, ALLOW for the rest, ENOSYS for any other ABI (i386, x32): what
//! monitor/seccomp_filter.py has libseccomp compile, written out by hand.

use libc::sock_filter;

const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

// offsets in struct seccomp_data
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = fhmon_native::abi::AUDIT_ARCH_X86_64;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64
/// x32 system calls run under AUDIT_ARCH_X86_64 with this bit set in the number.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = fhmon_native::abi::X32_SYSCALL_BIT;
#[cfg(not(target_arch = "x86_64"))]
const X32_SYSCALL_BIT: u32 = u32::MAX; // nothing to refuse: no number reaches it

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The program (10 instructions).
pub fn program() -> Vec<sock_filter> {
    let enosys = libc::SECCOMP_RET_ERRNO | (libc::ENOSYS as u32 & libc::SECCOMP_RET_DATA);
    vec![
        stmt(BPF_LD_W_ABS, ARCH_OFFSET),
        jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, enosys),
        stmt(BPF_LD_W_ABS, NR_OFFSET),
        jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET_K, enosys),
        jump(BPF_JEQ_K, libc::SYS_name_to_handle_at as u32, 2, 0),
        jump(BPF_JEQ_K, libc::SYS_open_by_handle_at as u32, 1, 0),
        stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW),
        stmt(BPF_RET_K, libc::SECCOMP_RET_USER_NOTIF),
    ]
}
