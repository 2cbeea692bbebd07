//! Registration with fhmon, one attempt at a time: connect, check that root listens, send
//! HELLO with the listener and the child's pidfd, read the answer without blocking. The
//! first registration (supervise::start) and every re-registration (supervise::stay_parent)
//! share these steps; when to try again, and what a failure means, is theirs.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use fhmon_native::intake::{self, FrameDecoder, Message};
use fhmon_native::sys::{self, launch as os};

pub(crate) enum RegError {
    Os(i32),
    Launch(String),
}

/// The launcher's side of a registration: the listener copy stays here for the target's
/// whole life; the connection is renewed when it drops.
pub(crate) struct Registration<'a> {
    pub(crate) socket: &'a [u8],
    pub(crate) share: &'a str,
    pub(crate) pid: i32,
    pub(crate) listener: OwnedFd,
    /// the first ACCEPT's share id: every re-registration must land on that share
    pub(crate) share_id: Option<[u8; 32]>,
}

impl Registration<'_> {
    pub(crate) fn place(&self) -> String {
        String::from_utf8_lossy(self.socket).into_owned()
    }

    /// Connect and send HELLO with the listener and the child's pidfd.
    pub(crate) fn send_hello(&self) -> Result<OwnedFd, RegError> {
        let sock = os::connect_unix(self.socket).map_err(RegError::Os)?;
        // Refuse to hand the listener to anything but root: SO_PEERCRED names the process
        // that bound and listens on the socket; whoever holds the listener answers the
        // target's calls.
        let (pid, uid, _) = os::peer_cred(sock.as_fd()).map_err(RegError::Os)?;
        if uid != 0 {
            return Err(RegError::Launch(format!(
                "the server at {} runs as uid {uid} (pid {pid}), not root: refusing to hand \
                 it the listener (is that fhmon's socket?)",
                self.place()
            )));
        }
        // The child's pidfd proves to fhmon which process the target is, in whatever pid
        // namespace this launcher runs (self.pid is only this namespace's pid).
        let hello = intake::encode(&Message::Hello {
            target_pid: self.pid as u32,
            share: self.share.to_string(),
            client: format!("fhmon-launch/{}", std::process::id()),
            flags: intake::HELLO_TARGET_PIDFD,
            version: intake::PROTOCOL_VERSION,
            share_id: self.share_id,
        })
        .map_err(|e| RegError::Launch(e.0))?;
        let pidfd = sys::pidfd_open(self.pid, 0).map_err(RegError::Os)?;
        let sent = os::send_with_fds(
            sock.as_fd(),
            &hello,
            &[self.listener.as_raw_fd(), pidfd.as_raw_fd()],
        )
        .map_err(RegError::Os)?;
        if sent != hello.len() {
            return Err(RegError::Os(libc::EAGAIN));
        }
        Ok(sock)
    }
}

/// Read what is there from a registration's socket: Some(answer) once whole.
pub(crate) fn read_answer(
    sock: BorrowedFd<'_>,
    decoder: &mut FrameDecoder,
) -> Result<Option<Message>, RegError> {
    let mut buf = [0u8; 4096];
    match os::recv_nowait(sock, &mut buf) {
        Ok(0) => Err(RegError::Launch(
            "fhmon closed the connection without answering".into(),
        )),
        Ok(n) => {
            decoder
                .feed(&buf[..n])
                .map_err(|e| RegError::Launch(format!("fhmon's answer is not valid: {e}")))?;
            decoder
                .next_message()
                .map_err(|e| RegError::Launch(format!("fhmon's answer is not valid: {e}")))
        }
        Err(libc::EAGAIN) | Err(libc::EINTR) => Ok(None),
        Err(e) => Err(RegError::Os(e)),
    }
}
