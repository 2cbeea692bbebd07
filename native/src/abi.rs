//! Kernel ABI (x86_64), the one home of the crates' kernel numbers: the same as protocol/kernel.py
//! (tests/unit/test_abi_home.py compares them; no other Rust file declares one),
//! decoded and encoded in safe code from fixed-size byte arrays (no pointer casts).

pub const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
/// x32 system calls run under AUDIT_ARCH_X86_64 with this bit set in the number
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;
pub const SYS_NAME_TO_HANDLE_AT: i32 = 303;
pub const SYS_OPEN_BY_HANDLE_AT: i32 = 304;

pub const SECCOMP_IOCTL_NOTIF_RECV: u64 = 0xC050_2100;
pub const SECCOMP_IOCTL_NOTIF_SEND: u64 = 0xC018_2101;
pub const SECCOMP_IOCTL_NOTIF_ID_VALID: u64 = 0x4008_2102;
pub const SECCOMP_IOCTL_NOTIF_ADDFD: u64 = 0x4018_2103;
pub const SECCOMP_IOCTL_NOTIF_SET_FLAGS: u64 = 0x4008_2104;
pub const SECCOMP_ADDFD_FLAG_SEND: u32 = 2;
pub const SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP: u64 = 1;

pub const SECCOMP_NOTIF_SIZE: usize = 80;
pub const SECCOMP_NOTIF_RESP_SIZE: usize = 24;
pub const SECCOMP_NOTIF_ADDFD_SIZE: usize = 24;

pub const AT_FDCWD: i32 = -100;
pub const AT_SYMLINK_FOLLOW: i32 = 0x400;
pub const AT_EMPTY_PATH: i32 = 0x1000;
pub const AT_HANDLE_FID: i32 = 0x200;
pub const AT_HANDLE_MNT_ID_UNIQUE: i32 = 0x001;
pub const AT_HANDLE_CONNECTABLE: i32 = 0x002;

/// kcmp(2) type: are two fds the same open file (struct file)
pub const KCMP_FILE: i32 = 0;

pub const O_CLOEXEC: i32 = 0o2_000_000;
pub const O_PATH: i32 = 0o10_000_000;

/// pidfd_open(2): a thread, not a process (O_EXCL's bit)
pub const PIDFD_THREAD: u32 = 0o200;
/// ioctl(pidfd, PIDFD_GET_INFO) (6.13+): _IOWR(0xFF, 11, struct pidfd_info), its first
/// version (64 bytes), asking for the credentials (ruid..fsgid at bytes 28..60)
pub const PIDFD_GET_INFO: u64 = 0xC040_FF0B;
pub const PIDFD_INFO_CREDS: u64 = 0x2;
pub const PIDFD_INFO_SIZE_VER0: usize = 64;
/// openat2(2) resolve flags
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
pub const RESOLVE_IN_ROOT: u64 = 0x10;

pub const PATH_MAX: usize = 4096;
pub const PAGE_SIZE: u64 = 4096;

/// struct file_handle (fs/fhandle.c): the bound on f_handle, the header before it, and the
/// type bits of handle_type the kernel reserves for flags
pub const MAX_HANDLE_SZ: usize = 128;
pub const FILE_HANDLE_HEADER_SIZE: usize = 8;
pub const FILEID_INVALID: i32 = 255;
pub const FILEID_IS_CONNECTABLE: u32 = 0x1_0000;
pub const FILEID_IS_DIR: u32 = 0x2_0000;
pub const FILEID_USER_FLAGS_MASK: u32 = 0xFFFF_0000;
pub const FILEID_VALID_USER_FLAGS: u32 = FILEID_IS_CONNECTABLE | FILEID_IS_DIR;
/// the generic exportfs layouts (include/linux/exportfs.h) whose parent fhmon can find
pub const FILEID_INO32_GEN: i32 = 1;
pub const FILEID_INO32_GEN_PARENT: i32 = 2;
pub const FILEID_INO64_GEN: i32 = 0x81; // xfs's 64-bit
pub const FILEID_INO64_GEN_PARENT: i32 = 0x82;

/// capabilities (linux/capability.h): capget/capset's version and the bits fhmon keeps
pub const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
pub const CAP_KILL: u32 = 5;
pub const CAP_SETGID: u32 = 6;
pub const CAP_SETUID: u32 = 7;
pub const CAP_SYS_PTRACE: u32 = 19;

/// inode flags (FS_IOC_GETFLAGS) and statfs f_flags
pub const FS_IOC_GETFLAGS: u64 = 0x8008_6601;
pub const FS_IMMUTABLE_FL: i32 = 0x10;
pub const FS_APPEND_FL: i32 = 0x20;
pub const ST_RDONLY: i64 = 1;

/// statfs f_type of the local filesystems whose chmod by the owner always takes
pub const EXT4_SUPER_MAGIC: i64 = 0xEF53; // ext2, ext3, ext4
pub const XFS_SUPER_MAGIC: i64 = 0x5846_5342;
pub const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
pub const TMPFS_MAGIC: i64 = 0x0102_1994;
pub const F2FS_SUPER_MAGIC: i64 = 0xF2F5_2010;

/// One `struct seccomp_notif`: u64 id; u32 pid; u32 flags; then seccomp_data
/// {i32 nr; u32 arch; u64 instruction_pointer; u64 args[6]}.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Notification {
    pub id: u64,
    pub pid: u32,
    pub flags: u32,
    pub nr: i32,
    pub arch: u32,
    pub instruction_pointer: u64,
    pub args: [u64; 6],
}

fn u64_at(raw: &[u8; SECCOMP_NOTIF_SIZE], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&raw[at..at + 8]);
    u64::from_le_bytes(b)
}

fn u32_at(raw: &[u8; SECCOMP_NOTIF_SIZE], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&raw[at..at + 4]);
    u32::from_le_bytes(b)
}

impl Notification {
    /// Every 80-byte buffer is some notification: decoding cannot fail.
    pub fn parse(raw: &[u8; SECCOMP_NOTIF_SIZE]) -> Self {
        let mut args = [0u64; 6];
        for (i, arg) in args.iter_mut().enumerate() {
            *arg = u64_at(raw, 32 + 8 * i);
        }
        Notification {
            id: u64_at(raw, 0),
            pid: u32_at(raw, 8),
            flags: u32_at(raw, 12),
            nr: u32_at(raw, 16) as i32,
            arch: u32_at(raw, 20),
            instruction_pointer: u64_at(raw, 24),
            args,
        }
    }

    /// A notification from a byte slice of any length (fuzzing, Python): exactly 80 or None.
    pub fn parse_slice(raw: &[u8]) -> Option<Self> {
        let fixed: &[u8; SECCOMP_NOTIF_SIZE] = raw.try_into().ok()?;
        Some(Self::parse(fixed))
    }

    pub fn encode(&self) -> [u8; SECCOMP_NOTIF_SIZE] {
        let mut out = [0u8; SECCOMP_NOTIF_SIZE];
        out[0..8].copy_from_slice(&self.id.to_le_bytes());
        out[8..12].copy_from_slice(&self.pid.to_le_bytes());
        out[12..16].copy_from_slice(&self.flags.to_le_bytes());
        out[16..20].copy_from_slice(&self.nr.to_le_bytes());
        out[20..24].copy_from_slice(&self.arch.to_le_bytes());
        out[24..32].copy_from_slice(&self.instruction_pointer.to_le_bytes());
        for (i, arg) in self.args.iter().enumerate() {
            out[32 + 8 * i..40 + 8 * i].copy_from_slice(&arg.to_le_bytes());
        }
        out
    }
}

/// `struct seccomp_notif_resp` {u64 id; s64 val; s32 error; u32 flags}; `errno` is positive
/// here, negated for the kernel.
pub fn encode_response(id: u64, val: i64, errno: i32) -> [u8; SECCOMP_NOTIF_RESP_SIZE] {
    let mut out = [0u8; SECCOMP_NOTIF_RESP_SIZE];
    out[0..8].copy_from_slice(&id.to_le_bytes());
    out[8..16].copy_from_slice(&val.to_le_bytes());
    out[16..20].copy_from_slice(&errno.wrapping_neg().to_le_bytes());
    out
}

/// `struct seccomp_notif_addfd` {u64 id; u32 flags; u32 srcfd; u32 newfd; u32 newfd_flags}.
pub fn encode_addfd(id: u64, srcfd: i32, newfd_flags: u32, flags: u32) -> [u8; 24] {
    let mut out = [0u8; SECCOMP_NOTIF_ADDFD_SIZE];
    out[0..8].copy_from_slice(&id.to_le_bytes());
    out[8..12].copy_from_slice(&flags.to_le_bytes());
    out[12..16].copy_from_slice(&(srcfd as u32).to_le_bytes());
    out[20..24].copy_from_slice(&newfd_flags.to_le_bytes());
    out
}

/// A syscall's `int` argument: the low 32 bits of the register, sign-extended.
pub fn arg_int(value: u64) -> i32 {
    value as u32 as i32
}

/// A pointer argument: the whole register.
pub fn arg_ptr(value: u64) -> u64 {
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notification_round_trips() {
        let n = Notification {
            id: 0x0102_0304_0506_0708,
            pid: 77,
            flags: 0,
            nr: SYS_OPEN_BY_HANDLE_AT,
            arch: AUDIT_ARCH_X86_64,
            instruction_pointer: 0xdead_beef,
            args: [1, 2, 3, u64::MAX, 5, 6],
        };
        assert_eq!(Notification::parse(&n.encode()), n);
        assert_eq!(Notification::parse_slice(&[0u8; 79]), None);
    }

    #[test]
    fn response_negates_errno() {
        let r = encode_response(5, 0, 22);
        assert_eq!(i32::from_le_bytes(r[16..20].try_into().unwrap()), -22);
    }

    #[test]
    fn int_args_sign_extend_low_half() {
        assert_eq!(arg_int(0xffff_ffff_ffff_ff9c), AT_FDCWD);
        assert_eq!(arg_int(0x1234_5678_0000_0003), 3);
    }
}
