//! bench's reference monitor: the least work a monitor can do per call, as a floor for fhmon.
//!
//!   refmon --socket PATH --share DIR [--threads N]
//!
//! It accepts `fhmon launch` registrations (fhmon's native intake protocol: one HELLO frame
//! with the listener fd, answered ACCEPT, connection kept), then answers each listener's
//! calls on N threads blocked in RECV (SYNC_WAKE_UP on): name_to_handle_at = read the
//! handle header (and the path), the kernel's call on the target's own fd, HMAC, write the
//! handle and mount id, SEND; open_by_handle_at = read the handle, verify the HMAC, the
//! kernel's open on the share, ADDFD|SEND. No confinement, no credentials switch, no
//! audit, no metrics: what fhmon adds on top of this is what bench measures.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;

use fhmon_native::abi::{self, Notification};
use fhmon_native::handle::{self, MAX_HANDLE_SZ};
use fhmon_native::libc;
use fhmon_native::mac::{KeyRing, ShareId};
use fhmon_native::sys;

struct Shared {
    ring: KeyRing,
    share_id: ShareId,
    share_dir: OwnedFd,
}

/// One serving thread's reusable state: a pidfd per target thread seen (no allocation once
/// every thread of the target is known).
struct Worker {
    shared: Arc<Shared>,
    listener: Arc<OwnedFd>,
    pidfds: Vec<(u32, OwnedFd)>,
}

impl Worker {
    fn pidfd(&mut self, tid: u32) -> Result<&OwnedFd, sys::Errno> {
        if let Some(i) = self.pidfds.iter().position(|(t, _)| *t == tid) {
            return Ok(&self.pidfds[i].1);
        }
        let fd = sys::pidfd_open(tid as i32, sys::PIDFD_THREAD)?;
        if self.pidfds.len() >= 256 {
            self.pidfds.remove(0);
        }
        self.pidfds.push((tid, fd));
        Ok(&self.pidfds.last().expect("just pushed").1)
    }

    fn serve(mut self) {
        let mut raw = [0u8; abi::SECCOMP_NOTIF_SIZE];
        loop {
            match sys::notif_recv(self.listener.as_fd(), &mut raw) {
                Ok(()) => {}
                Err(libc::EINTR) => continue,
                // ENOENT: the caller went away between wake-up and RECV, or (seen on 6.18,
                // RECV returning it at once, forever) no task uses the filter any more:
                // then stop, or 2 threads per finished target spin and take the CPU from
                // whatever is measured next
                Err(libc::ENOENT) if hung_up(self.listener.as_fd()) => return,
                Err(libc::ENOENT) => continue,
                Err(_) => return,
            }
            let n = Notification::parse(&raw);
            let answer = match n.nr {
                abi::SYS_NAME_TO_HANDLE_AT => self.name_to_handle_at(&n),
                abi::SYS_OPEN_BY_HANDLE_AT => match self.open_by_handle_at(&n) {
                    Ok(()) => continue, // ADDFD|SEND answered it
                    Err(e) => Err(e),
                },
                _ => Err(libc::ENOSYS),
            };
            let resp = match answer {
                Ok(()) => abi::encode_response(n.id, 0, 0),
                Err(e) => abi::encode_response(n.id, 0, e),
            };
            let _ = sys::notif_send(self.listener.as_fd(), &resp);
        }
    }

    fn name_to_handle_at(&mut self, n: &Notification) -> Result<(), sys::Errno> {
        let tid = n.pid as i32;
        let dirfd = abi::arg_int(n.args[0]);
        let path_ptr = abi::arg_ptr(n.args[1]);
        let handle_ptr = abi::arg_ptr(n.args[2]);
        let mount_ptr = abi::arg_ptr(n.args[3]);
        let flags = abi::arg_int(n.args[4]);
        let mut path = [0u8; 4096];
        let page_left = 4096 - (path_ptr % 4096) as usize;
        let got = sys::read_target(tid, path_ptr, &mut path[..page_left.min(4095)])?;
        let nul = path[..got]
            .iter()
            .position(|&b| b == 0)
            .ok_or(libc::EFAULT)?;
        let path = CStr::from_bytes_with_nul(&path[..=nul]).map_err(|_| libc::EFAULT)?;
        let mut header = [0u8; 8];
        if sys::read_target(tid, handle_ptr, &mut header)? != 8 {
            return Err(libc::EFAULT);
        }
        let capacity = handle::Header::parse(&header)
            .ok_or(libc::EFAULT)?
            .handle_bytes;
        let base = if dirfd == abi::AT_FDCWD {
            std::fs::File::open(format!("/proc/{tid}/cwd"))
                .map(OwnedFd::from)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?
        } else {
            let pidfd = self.pidfd(n.pid)?;
            sys::pidfd_getfd(pidfd.as_fd(), dirfd)?
        };
        let mut kernel_bytes = [0u8; MAX_HANDLE_SZ];
        let (handle_type, len, mnt) =
            sys::name_to_handle_at(base.as_fd(), path, flags, &mut kernel_bytes)?;
        let mut signed = [0u8; MAX_HANDLE_SZ];
        let sh = &self.shared;
        let signed_len = sh
            .ring
            .sign(&sh.share_id, handle_type, &kernel_bytes[..len], &mut signed)
            .ok_or(libc::EOPNOTSUPP)?;
        let mut out = [0u8; 8 + MAX_HANDLE_SZ];
        let mount_bytes = (mnt as u32).to_le_bytes();
        if signed_len as u32 > capacity {
            out[..8].copy_from_slice(
                &handle::Header {
                    handle_bytes: signed_len as u32,
                    handle_type: handle::FILEID_INVALID,
                }
                .encode(),
            );
            sys::write_target(tid, &[(handle_ptr, &out[..8])])?;
            return Err(libc::EOVERFLOW);
        }
        out[..8].copy_from_slice(
            &handle::Header {
                handle_bytes: signed_len as u32,
                handle_type,
            }
            .encode(),
        );
        out[8..8 + signed_len].copy_from_slice(&signed[..signed_len]);
        let total = 4 + 8 + signed_len;
        let written = sys::write_target(
            tid,
            &[
                (mount_ptr, &mount_bytes),
                (handle_ptr, &out[..8 + signed_len]),
            ],
        )?;
        if written != total {
            return Err(libc::EFAULT);
        }
        Ok(())
    }

    fn open_by_handle_at(&mut self, n: &Notification) -> Result<(), sys::Errno> {
        let tid = n.pid as i32;
        let handle_ptr = abi::arg_ptr(n.args[1]);
        let flags = abi::arg_int(n.args[2]);
        let mut raw = [0u8; 8 + MAX_HANDLE_SZ];
        let got = sys::read_target(tid, handle_ptr, &mut raw)?;
        let (header, f_handle) = handle::parse_presented(&raw[..got]).map_err(|e| e.errno())?;
        let sh = &self.shared;
        let kernel_bytes = sh
            .ring
            .verify(&sh.share_id, header.handle_type, f_handle)
            .ok_or(libc::ESTALE)?;
        let open_flags = if flags & abi::O_PATH != 0 {
            libc::O_RDONLY
        } else {
            flags & !(abi::O_CLOEXEC | libc::O_NOFOLLOW)
        } | abi::O_CLOEXEC;
        let fd = sys::open_by_handle_at(
            sh.share_dir.as_fd(),
            header.handle_type,
            kernel_bytes,
            open_flags,
        )?;
        let newfd_flags = if flags & abi::O_CLOEXEC != 0 {
            abi::O_CLOEXEC as u32
        } else {
            0
        };
        let addfd = abi::encode_addfd(
            n.id,
            fd.as_raw_fd(),
            newfd_flags,
            abi::SECCOMP_ADDFD_FLAG_SEND,
        );
        sys::notif_addfd(self.listener.as_fd(), &addfd)?;
        Ok(())
    }
}

/// One registration: HELLO (with the listener fd) in, ACCEPT out; the connection stays open
/// (`fhmon launch` registers again when it closes).
fn register(conn: &UnixStream, shared: &Arc<Shared>, threads: usize, target_id: u64) {
    let mut buf = [0u8; 16 * 1024 + 12];
    let Ok((n, Some(listener))) = sys::recv_with_fd(conn.as_fd(), &mut buf) else {
        return;
    };
    if n < 12 || &buf[..4] != b"FHMN" || buf[6..8] != [0, 1] {
        return; // not a HELLO frame
    }
    let _ = sys::notif_set_sync_wakeup(listener.as_fd());
    let message = b"refmon";
    let mut payload = Vec::with_capacity(64);
    payload.extend_from_slice(&target_id.to_be_bytes());
    payload.extend_from_slice(&shared.share_id);
    payload.extend_from_slice(&(message.len() as u16).to_be_bytes());
    payload.extend_from_slice(message);
    let mut frame = Vec::with_capacity(12 + payload.len());
    frame.extend_from_slice(b"FHMN");
    frame.extend_from_slice(&1u16.to_be_bytes());
    frame.extend_from_slice(&2u16.to_be_bytes()); // ACCEPT
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&payload);
    let listener = Arc::new(listener);
    for _ in 0..threads {
        let worker = Worker {
            shared: Arc::clone(shared),
            listener: Arc::clone(&listener),
            pidfds: Vec::with_capacity(256),
        };
        std::thread::spawn(move || worker.serve());
    }
    let _ = std::io::Write::write_all(&mut &*conn, &frame);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut socket, mut share, mut threads) = (None, None, 2usize);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = args.next(),
            "--share" => share = args.next(),
            "--threads" => threads = args.next().and_then(|t| t.parse().ok()).unwrap_or(2),
            _ => {
                eprintln!("usage: refmon --socket PATH --share DIR [--threads N]");
                std::process::exit(2);
            }
        }
    }
    let (Some(socket), Some(share)) = (socket, share) else {
        eprintln!("usage: refmon --socket PATH --share DIR [--threads N]");
        std::process::exit(2);
    };
    let share_dir: OwnedFd = std::fs::File::open(&share)
        .unwrap_or_else(|e| panic!("refmon: cannot open share {share}: {e}"))
        .into();
    let mut key = [0u8; 32];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").expect("/dev/urandom"),
        &mut key,
    )
    .expect("random key");
    let ring = KeyRing::new([(1u32, &key[..])], 1).expect("key ring");
    let shared = Arc::new(Shared {
        ring,
        share_id: [0x42; 32],
        share_dir,
    });
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).expect("bind");
    let mut next_id = 1u64;
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        register(&conn, &shared, threads.max(1), next_id);
        next_id += 1;
        std::mem::forget(conn); // keep the registration's connection open for good
    }
}

/// No task uses the listener's filter any more (poll reports POLLHUP).
fn hung_up(listener: std::os::fd::BorrowedFd<'_>) -> bool {
    let mut fds = [libc::pollfd {
        fd: listener.as_raw_fd(),
        events: 0,
        revents: 0,
    }];
    matches!(sys::poll_many(&mut fds, 0), Ok(n) if n > 0)
        && fds[0].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}
