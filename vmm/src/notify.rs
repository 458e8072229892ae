//! systemd's readiness protocol (`sd_notify`), for `Type=notify` units: when `$NOTIFY_SOCKET`
//! names a datagram socket (a path, or `@name` in the abstract namespace), the VMM sends
//! `READY=1` once every vCPU runs and the control socket answers, `STATUS=` lines as the
//! run goes, and `STOPPING=1` when the run ends.
//!
//! Data flow: `main` makes a [`Notifier`] before the VM is built (the socket is opened and
//! connected then, with every privilege, before any seccomp filter); `Vm::run` sends through
//! it with plain `write`s, which every thread's filter allows. A failure to send is ignored:
//! readiness is a courtesy to the service manager, never a reason to stop a VM.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// A connected datagram socket to the service manager.
#[derive(Debug)]
pub struct Notifier {
    fd: OwnedFd,
}

impl Notifier {
    /// The notifier `$NOTIFY_SOCKET` names (`None` when it is unset or empty).
    pub fn from_env() -> io::Result<Option<Notifier>> {
        match std::env::var_os("NOTIFY_SOCKET") {
            Some(p) if !p.is_empty() => Notifier::connect(&p.to_string_lossy()).map(Some),
            _ => Ok(None),
        }
    }

    /// A notifier sending to `path` (`@name`: the abstract namespace).
    pub fn connect(path: &str) -> io::Result<Notifier> {
        let addr = match path.strip_prefix('@') {
            Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
            None => SocketAddr::from_pathname(path)?,
        };
        let sock = UnixDatagram::unbound()?;
        sock.connect_addr(&addr)?;
        Ok(Notifier { fd: sock.into() })
    }

    /// Sends one message (lines `KEY=VALUE`); errors are returned for tests, ignored by the
    /// VMM.
    pub fn send(&self, message: &str) -> io::Result<()> {
        // SAFETY: the descriptor is open for as long as `self`; the buffer is valid for its
        // length. A plain write: every thread's seccomp list allows it.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), message.as_ptr().cast(), message.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_reach_a_path_and_an_abstract_socket() {
        let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let path = dir.as_path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::connect(path.to_str().unwrap()).unwrap();
        n.send("READY=1\nSTATUS=running").unwrap();
        let mut buf = [0u8; 64];
        let got = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..got], b"READY=1\nSTATUS=running");

        let name = format!("ppa-vmm-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let server = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier::connect(&format!("@{name}")).unwrap();
        n.send("STOPPING=1").unwrap();
        let got = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..got], b"STOPPING=1");

        assert!(Notifier::connect("/nonexistent/notify").is_err());
    }
}
