//! errno names and texts as Python prints them (errno.errorcode, os.strerror).

/// The symbolic name of an errno (EACCES), or its number when this table lacks it.
pub fn name(code: i32) -> String {
    let known = match code {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::ENOEXEC => "ENOEXEC",
        libc::EBADF => "EBADF",
        libc::ECHILD => "ECHILD",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ETXTBSY => "ETXTBSY",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::EPIPE => "EPIPE",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ELOOP => "ELOOP",
        libc::ESTALE => "ESTALE",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOTCONN => "ENOTCONN",
        libc::ENOTSOCK => "ENOTSOCK",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::ENOTUNIQ => "ENOTUNIQ",
        libc::EBADFD => "EBADFD",
        libc::EDQUOT => "EDQUOT",
        libc::ENODATA => "ENODATA",
        libc::EPROTO => "EPROTO",
        _ => return code.to_string(),
    };
    known.to_string()
}

/// The C library's text for an errno ("No such file or directory").
pub fn text(code: i32) -> String {
    let full = std::io::Error::from_raw_os_error(code).to_string();
    match full.rfind(" (os error ") {
        Some(at) => full[..at].to_string(),
        None => full,
    }
}
