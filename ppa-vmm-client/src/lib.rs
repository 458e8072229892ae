//! The clients of PPA-VMM's control socket, in a crate of their own: a [`Client`] that talks
//! the JSON Lines protocol of `ppa-vmm-api`, the two commands built on it, [`ctl`] (one request,
//! its result printed) and [`top`] (an esxtop-like view refreshed from `stats`). The text forms
//! they print that the VMM's final report prints too (the guest view, devices, `describe`) are
//! in `ppa-vmm-api`, re-exported here.
//!
//! This crate links no KVM code: it depends on `ppa-vmm-api`, serde_json, thiserror and clap,
//! not on kvm-ioctls, kvm-bindings, vm-memory or the `ppa-vmm` library (`cargo tree -p
//! ppa-vmm-client` shows it), so a monitoring tool can use it on a host without the VMM's
//! machine layer. The `ppa-vmm` binary's `ctl` and `top` subcommands call into it.
//!
//! Data flow: [`Client::connect`] opens the Unix stream the VMM serves with `--api-sock`;
//! [`Client::call`] numbers a [`Command`] into a [`Request`], writes it as one line and reads
//! lines until the [`Response`] with the same id, skipping event lines on the way. After a
//! `subscribe`, [`Client::next_line`] hands out the event lines as they arrive. Every line read
//! is checked for the `vm-exit` event ([`Client::vm_end`]): a connection that closes after it
//! is the VM's normal end, one that closes without it is a VMM that was killed or crashed.
//! Reads and writes time out ([`DEFAULT_TIMEOUT`]) so a hung VMM gives an error instead of a
//! hang.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ppa_vmm_api::{Command, Event, Request, RequestId, Response, VmEnd};
use serde_json::Value;
use thiserror::Error;

/// The text renderers the report and these clients share, now in `ppa-vmm-api`.
pub use ppa_vmm_api::{describe, devices_text as devices, guest_view};

pub mod commands;
pub mod ctl;
pub mod host;
pub mod rundir;
pub mod top;

/// Exit code of `ctl subscribe` and `top` when the VMM closed the connection without ending
/// the VM (no `vm-exit` event came first): it was killed or crashed.
pub const EXIT_VMM_LOST: i32 = 3;

/// What `ctl` and `top` say when the VMM went away without ending the VM.
pub const VMM_LOST: &str =
    "the VMM closed the connection before the VM ended (no vm-exit event): it was killed or crashed";

/// How long a read or a write on the socket may block before it fails.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest part of an unreadable line quoted in an error message.
const QUOTE_CHARS: usize = 200;

/// Why talking to the VMM failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// Nothing exists at the socket path.
    #[error(
        "there is no control socket at {}: the VMM must be running, started with --api-sock {}",
        .0.display(),
        .0.display()
    )]
    NoSocket(PathBuf),
    /// The socket exists but this user may not connect to it.
    #[error(
        "no permission to connect to {}: run as the user that started the VMM, or as root",
        .0.display()
    )]
    PermissionDenied(PathBuf),
    /// The path exists but nothing accepts connections on it.
    #[error(
        "nothing accepts connections on {}: the VMM that created it has ended, or the path is \
         not a socket (the VMM must be running with --api-sock {})",
        .0.display(),
        .0.display()
    )]
    Refused(PathBuf),
    /// Another failure to connect.
    #[error("cannot connect to {}", .path.display())]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The socket options could not be set.
    #[error("cannot set the timeouts of the connection to {}", .path.display())]
    Setup {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Writing the request failed.
    #[error("cannot send the request to the VMM at {}", .path.display())]
    Send {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Reading a line failed.
    #[error("cannot read from the VMM at {}", .path.display())]
    Receive {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// No line arrived within the read timeout.
    #[error("the VMM at {} did not answer within {} ms", .path.display(), .timeout.as_millis())]
    Timeout {
        /// Socket path.
        path: PathBuf,
        /// The read timeout in force.
        timeout: Duration,
    },
    /// The VMM closed the connection before answering.
    #[error("the VMM at {} closed the connection before answering", .0.display())]
    Closed(PathBuf),
    /// A line that is neither a response nor an event.
    #[error("the VMM at {} sent a line that is not a response: {line}", .path.display())]
    BadResponse {
        /// Socket path.
        path: PathBuf,
        /// The line (its first characters).
        line: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
}

impl ClientError {
    /// Whether the error means the VMM went away (closed or reset the connection): the normal
    /// end of a VM for a client that outlives it.
    pub fn is_closed(&self) -> bool {
        match self {
            ClientError::Closed(_) => true,
            ClientError::Send { source, .. } | ClientError::Receive { source, .. } => matches!(
                source.kind(),
                io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::UnexpectedEof
            ),
            _ => false,
        }
    }
}

/// One connection to a VMM's control socket.
#[derive(Debug)]
pub struct Client {
    /// The socket path, for error messages.
    path: PathBuf,
    /// The stream, buffered for line reads; writes go to the same stream.
    reader: BufReader<UnixStream>,
    /// Bytes of a line not yet complete (kept across a timed-out read).
    pending: Vec<u8>,
    /// Id of the next request.
    next_id: u64,
    /// Read timeout in force (`None`: block).
    read_timeout: Option<Duration>,
    /// How the VM ended, once a `vm-exit` event was read.
    vm_end: Option<VmEnd>,
}

impl Client {
    /// Connects to the control socket at `path`, with [`DEFAULT_TIMEOUT`] for reads and writes.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ClientError::NoSocket(path.to_path_buf()),
            io::ErrorKind::PermissionDenied => ClientError::PermissionDenied(path.to_path_buf()),
            io::ErrorKind::ConnectionRefused => ClientError::Refused(path.to_path_buf()),
            _ => ClientError::Connect {
                path: path.to_path_buf(),
                source: e,
            },
        })?;
        let setup = |source| ClientError::Setup {
            path: path.to_path_buf(),
            source,
        };
        stream
            .set_read_timeout(Some(DEFAULT_TIMEOUT))
            .map_err(setup)?;
        stream
            .set_write_timeout(Some(DEFAULT_TIMEOUT))
            .map_err(setup)?;
        Ok(Client {
            path: path.to_path_buf(),
            reader: BufReader::new(stream),
            pending: Vec::new(),
            next_id: 1,
            read_timeout: Some(DEFAULT_TIMEOUT),
            vm_end: None,
        })
    }

    /// The socket path this client is connected to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How the VM ended, when a `vm-exit` event has arrived on this connection (it is sent to
    /// subscribers of `vm-exit` just before the VMM closes their connections): `None` after a
    /// close means the VMM went away without ending the VM, killed or crashed.
    pub fn vm_end(&self) -> Option<VmEnd> {
        self.vm_end
    }

    /// Changes the read timeout; `None` blocks until a line arrives (for event streams, where
    /// minutes may pass between lines).
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> Result<(), ClientError> {
        self.reader
            .get_ref()
            .set_read_timeout(timeout)
            .map_err(|source| ClientError::Setup {
                path: self.path.clone(),
                source,
            })?;
        self.read_timeout = timeout;
        Ok(())
    }

    /// Sends `command` and returns its response. Ids increase from 1; lines with another id
    /// (answers to an earlier request that timed out) and event lines are skipped. A failed
    /// response with a null id is returned too: it is the VMM refusing the connection or a
    /// line it could not read (`too-many-clients`, `permission-denied`, ...).
    pub fn call(&mut self, command: Command) -> Result<Response, ClientError> {
        let id = RequestId::from(self.next_id);
        self.next_id += 1;
        let mut line = Request {
            id: id.clone(),
            command,
        }
        .to_line();
        line.push('\n');
        let mut stream = self.reader.get_ref();
        let sent = stream
            .write_all(line.as_bytes())
            .and_then(|()| stream.flush());
        // A server that refuses a client (another uid, too many clients) writes one error
        // line and closes: the write may fail while that line is still there to read.
        let mut send_error = sent.err().map(|source| ClientError::Send {
            path: self.path.clone(),
            source,
        });
        loop {
            let next = match self.next_line() {
                Err(e) => return Err(send_error.take().unwrap_or(e)),
                Ok(n) => n,
            };
            let Some(line) = next else {
                return Err(send_error
                    .take()
                    .unwrap_or_else(|| ClientError::Closed(self.path.clone())));
            };
            match matching_response(line.as_bytes(), &id) {
                Ok(Some(response)) => return Ok(response),
                Ok(None) => {}
                Err(source) => return Err(self.bad_response(&line, source)),
            }
        }
    }

    /// The next non-empty line from the VMM, without its newline; `None` once the VMM has
    /// closed the connection.
    pub fn next_line(&mut self) -> Result<Option<String>, ClientError> {
        loop {
            match self.reader.read_until(b'\n', &mut self.pending) {
                Ok(0) => {
                    if self.pending.is_empty() {
                        return Ok(None);
                    }
                }
                Ok(_) if !self.pending.ends_with(b"\n") => {
                    // End of stream inside a line: the next read returns 0.
                    continue;
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ClientError::Timeout {
                        path: self.path.clone(),
                        timeout: self.read_timeout.unwrap_or_default(),
                    });
                }
                Err(source) => {
                    return Err(ClientError::Receive {
                        path: self.path.clone(),
                        source,
                    })
                }
            }
            let bytes = std::mem::take(&mut self.pending);
            let line = String::from_utf8_lossy(&bytes);
            let line = line.trim_end_matches(['\n', '\r']);
            if !line.trim().is_empty() {
                self.note_vm_exit(line);
                return Ok(Some(line.to_string()));
            }
        }
    }

    /// Remembers the VM's end when `line` is the `vm-exit` event.
    fn note_vm_exit(&mut self, line: &str) {
        if !line.contains("\"vm-exit\"") {
            return;
        }
        if let Ok(Event::VmExit { end, .. }) = serde_json::from_str(line) {
            self.vm_end = Some(end);
        }
    }

    fn bad_response(&self, line: &str, source: serde_json::Error) -> ClientError {
        ClientError::BadResponse {
            path: self.path.clone(),
            line: line.chars().take(QUOTE_CHARS).collect(),
            source,
        }
    }
}

/// The response `line` carries when it answers request `id` (or is the VMM refusing the
/// connection: a failure with a null id); `None` for an event line or another request's
/// answer.
pub(crate) fn matching_response(
    line: &[u8],
    id: &RequestId,
) -> Result<Option<Response>, serde_json::Error> {
    // From the text, not a value: the id is compared as the server wrote it.
    let response: Response = match serde_json::from_slice(line) {
        Ok(r) => r,
        Err(e) => {
            return match serde_json::from_slice::<Value>(line) {
                Ok(v) if v.get("event").is_some() => Ok(None),
                _ => Err(e),
            }
        }
    };
    Ok((response.id == *id || (response.id.is_null() && !response.ok)).then_some(response))
}

/// The kebab-case name of an error kind, as the protocol spells it.
pub(crate) fn kind_name(kind: ppa_vmm_api::ErrorKind) -> String {
    match serde_json::to_value(kind) {
        Ok(Value::String(s)) => s,
        _ => format!("{kind:?}"),
    }
}

#[cfg(test)]
pub(crate) mod tests;
