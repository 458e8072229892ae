//! The control socket's Unix side: binding the listener with mode 0600 (replacing a stale
//! socket file, refusing a live one), removing the socket file at the end only while it is
//! still the one this process made, and reading a peer's uid (SO_PEERCRED).
//!
//! Data flow: [`bind_unix`] records the device and inode of each socket file it creates with
//! `owned_files`; [`remove_socket_file`] (the server's end) and `owned_files::remove_all` (a
//! forced exit) unlink a path only while it still has that device and inode. A file at the
//! same path that another VMM created after ours was removed is left alone.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use crate::owned_files;

/// Removes the socket file at `path` if it is still the one [`bind_unix`] created there:
/// true when it was removed.
pub fn remove_socket_file(path: &Path) -> bool {
    owned_files::remove(path)
}

use super::SocketError;

/// Makes a Unix listener at `path` whose file has mode 0600 from the start: the mode of the
/// socket inode is set before bind, which creates the file with it.
pub fn bind_unix(path: &Path) -> Result<UnixListener, SocketError> {
    let bytes = path.as_os_str().as_encoded_bytes();
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(SocketError::PathTooLong(path.to_path_buf()));
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(SocketError::NotASocket(path.to_path_buf()));
        }
        match UnixStream::connect(path) {
            Ok(_) => return Err(SocketError::InUse(path.to_path_buf())),
            // Left behind by a VMM that is gone.
            Err(_) => {
                let _ = std::fs::remove_file(path);
            }
        }
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(SocketError::NoDirectory {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
        });
    }
    let bind_err = |source| SocketError::Bind {
        path: path.to_path_buf(),
        source,
    };
    // SAFETY: socket() takes no pointers; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(bind_err(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a new socket this function owns; OwnedFd closes it on every path.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: fchmod on a socket fd we own changes only its inode's mode.
    let rc = unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) };
    if rc != 0 {
        return Err(bind_err(io::Error::last_os_error()));
    }
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes (NUL-terminated path that fits).
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(bind_err(io::Error::last_os_error()));
    }
    // Belt and braces: whatever the umask did, the file ends up 0600.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(bind_err)?;
    if !owned_files::record(path) {
        return Err(bind_err(io::Error::new(
            io::ErrorKind::NotFound,
            "the socket file vanished right after bind",
        )));
    }
    // SAFETY: listen() on a bound socket we own.
    if unsafe { libc::listen(fd.as_raw_fd(), 256) } != 0 {
        return Err(bind_err(io::Error::last_os_error()));
    }
    Ok(UnixListener::from(fd))
}

/// The uid of the process at the other end of `stream`.
pub fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given; the kernel writes at
    // most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_paths_that_are_not_sockets_or_too_long() {
        let tmp = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let dir = tmp.as_path();
        let file = dir.join("plain");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(bind_unix(&file), Err(SocketError::NotASocket(_))));
        let long = dir.join("x".repeat(120));
        assert!(matches!(bind_unix(&long), Err(SocketError::PathTooLong(_))));
        // A stale socket file is replaced; a live one is refused.
        let sock = dir.join("s");
        let l = bind_unix(&sock).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(bind_unix(&sock), Err(SocketError::InUse(_))));
        drop(l);
        assert!(bind_unix(&sock).is_ok(), "a stale socket is replaced");
        assert!(remove_socket_file(&sock));
    }

    #[test]
    fn a_socket_file_is_removed_only_while_it_is_ours() {
        let tmp = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let sock = tmp.as_path().join("s");
        // Ours until the end: removed.
        let _a = bind_unix(&sock).unwrap();
        assert!(remove_socket_file(&sock));
        assert!(!sock.exists());
        // Ours, then removed by someone else and bound again by another server (another VMM):
        // that one's file stays.
        let _c = bind_unix(&sock).unwrap();
        std::fs::remove_file(&sock).unwrap();
        let _d = UnixListener::bind(&sock).unwrap();
        assert!(!remove_socket_file(&sock));
        assert!(sock.exists(), "the other server's socket is left alone");
        // Never ours: left alone.
        assert!(!remove_socket_file(&tmp.as_path().join("other")));
        // owned_files::remove_all (a forced exit) is tested end to end in tests/signals.rs:
        // here it would remove the sockets of unit tests running beside this one.
    }
}
