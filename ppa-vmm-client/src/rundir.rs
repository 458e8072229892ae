//! The run directory (spec section 11): where each VMM started with `--name` or `--run-dir`
//! puts its control socket (`NAME.sock`, unless `--api-sock` says otherwise) and a small
//! descriptor (`NAME.json`: pid, start time, version, vCPUs, socket), so that `ppa-vmm host`
//! finds every VM on the host.
//!
//! Data flow: the VMM checks the directory ([`RunDir::open`]: ours, not world-writable, not a
//! link), writes its descriptor atomically before it builds the VM ([`RunDir::register`]) and
//! removes it at the end ([`Registration`]'s drop, only while it is still its own). Readers
//! ([`RunDir::scan`]) list the descriptors; an entry whose process is gone (the pid is dead,
//! or is another process now: its start time in /proc differs) is stale, and its descriptor
//! and its socket, if nobody accepts on it, are removed. Entries owned by another uid are
//! skipped and counted, never read or removed.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The default run directory of root.
pub const ROOT_RUN_DIR: &str = "/run/ppa-vmm";
/// The VMMs' calibration cache in the run directory (not a descriptor; cli/src/main.rs
/// names it).
pub const CALIBRATION_FILE: &str = "calibration.json";
/// Longest descriptor read (a descriptor is ~300 bytes).
const MAX_DESCRIPTOR: u64 = 64 * 1024;
/// Most entries a scan looks at.
const MAX_ENTRIES: usize = 65_536;
/// Longest socket path a Unix socket takes (sun_path less its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Why the run directory cannot be used.
#[derive(Debug, Error)]
pub enum RunDirError {
    /// No default for a non-root user without `$XDG_RUNTIME_DIR`.
    #[error(
        "no run directory: as a user other than root the default is $XDG_RUNTIME_DIR/ppa-vmm, \
         and XDG_RUNTIME_DIR is not set; give one with --run-dir"
    )]
    NoDefault,
    /// The directory could not be made or read.
    #[error("cannot use the run directory {path}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Not a directory, or a symbolic link.
    #[error("the run directory {0} is not a directory (a symbolic link is not followed)")]
    NotDirectory(PathBuf),
    /// Owned by another user.
    #[error(
        "the run directory {path} belongs to uid {owner}, not to this user (uid {me}): \
         another user's VMs and sockets are not ours to list or clean"
    )]
    NotOurs {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Our effective uid.
        me: u32,
    },
    /// Anyone may write in it.
    #[error(
        "the run directory {path} is world-writable (mode {mode:o}): anyone could plant \
         sockets and descriptors there; use a directory only its owner writes (chmod o-w)"
    )]
    WorldWritable {
        /// The directory.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// A name that cannot be a file name in it.
    #[error(
        "the VM name {q:?} cannot name files in the run directory: use 1 to 64 letters, \
         digits and . _ - + @ : only, not starting with a dot, and not `calibration` (the \
         calibration cache's name there)",
        q = ppa_vmm_api::clip(.0)
    )]
    BadName(String),
    /// The socket path would be too long for a Unix socket.
    #[error(
        "the socket path {0} is longer than the 107 bytes a Unix socket takes: use a shorter \
         --run-dir or --name"
    )]
    TooLong(PathBuf),
    /// A live VMM has the name.
    #[error("a VM named {name} is already running (pid {pid}, descriptor {path})")]
    Taken {
        /// The name.
        name: String,
        /// Its VMM's pid.
        pid: u32,
        /// Its descriptor.
        path: PathBuf,
    },
}

/// What a VMM writes about itself (`NAME.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    /// The VM's name.
    pub name: String,
    /// The VMM's pid.
    pub pid: u32,
    /// The process's start time in clock ticks since boot (/proc/PID/stat field 22): tells
    /// the VMM from a later process that got its pid.
    pub proc_start: u64,
    /// When the VMM started, CLOCK_REALTIME ns.
    pub started_realtime_ns: u64,
    /// The VMM's version.
    pub version: String,
    /// vCPUs.
    pub vcpus: usize,
    /// The control socket (absent: the VM has none).
    pub socket: Option<PathBuf>,
}

impl Descriptor {
    /// The descriptor of this process for VM `name`.
    pub fn of_self(name: &str, vcpus: usize, socket: Option<PathBuf>) -> Descriptor {
        let pid = std::process::id();
        let started_realtime_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Descriptor {
            name: name.to_string(),
            pid,
            proc_start: proc_start(pid).unwrap_or(0),
            started_realtime_ns,
            version: env!("CARGO_PKG_VERSION").to_string(),
            vcpus,
            socket,
        }
    }

    /// Whether the process it describes is alive: the pid exists and started when it says.
    pub fn alive(&self) -> bool {
        proc_start(self.pid).is_some_and(|s| s == self.proc_start)
    }
}

/// The start time of process `pid` in clock ticks since boot (`None`: no such process).
pub fn proc_start(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow; the start time is field 22, the 20th after the command.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Our effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether `name` can name files in a run directory (`NAME.json` must not be the calibration
/// cache).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && CALIBRATION_FILE.strip_suffix(".json") != Some(name)
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-+@:".contains(c))
}

/// A VM found by a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its descriptor.
    pub descriptor: Descriptor,
    /// Where the descriptor is.
    pub path: PathBuf,
}

/// What a scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Live VMs, by name.
    pub vms: Vec<Entry>,
    /// Descriptors and sockets of another uid, skipped.
    pub foreign: usize,
    /// Stale entries removed (names).
    pub removed: Vec<String>,
    /// Descriptors that could not be read or parsed, left alone.
    pub unreadable: usize,
}

/// A checked run directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// The default: /run/ppa-vmm for root, else $XDG_RUNTIME_DIR/ppa-vmm.
    pub fn default_path() -> Result<PathBuf, RunDirError> {
        if euid() == 0 {
            return Ok(PathBuf::from(ROOT_RUN_DIR));
        }
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(d) if !d.is_empty() => Ok(PathBuf::from(d).join("ppa-vmm")),
            _ => Err(RunDirError::NoDefault),
        }
    }

    /// `path` (or the default), made (mode 0700) when `create` and missing, and checked:
    /// a directory, not a link, ours, not world-writable.
    pub fn open(path: Option<&Path>, create: bool) -> Result<RunDir, RunDirError> {
        let path = match path {
            Some(p) => p.to_path_buf(),
            None => Self::default_path()?,
        };
        let io_err = |source| RunDirError::Io {
            path: path.clone(),
            source,
        };
        let meta = match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                fs::DirBuilder::new()
                    .mode(0o700)
                    .recursive(true)
                    .create(&path)
                    .map_err(io_err)?;
                fs::symlink_metadata(&path).map_err(io_err)?
            }
            r => r.map_err(io_err)?,
        };
        if !meta.file_type().is_dir() {
            return Err(RunDirError::NotDirectory(path));
        }
        let me = euid();
        if meta.uid() != me {
            return Err(RunDirError::NotOurs {
                path,
                owner: meta.uid(),
                me,
            });
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o002 != 0 {
            return Err(RunDirError::WorldWritable { path, mode });
        }
        Ok(RunDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where VM `name`'s socket goes by default.
    pub fn socket_path(&self, name: &str) -> Result<PathBuf, RunDirError> {
        if !valid_name(name) {
            return Err(RunDirError::BadName(name.to_string()));
        }
        let p = self.path.join(format!("{name}.sock"));
        if p.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(RunDirError::TooLong(p));
        }
        Ok(p)
    }

    fn descriptor_path(&self, name: &str) -> PathBuf {
        self.path.join(format!("{name}.json"))
    }

    /// Writes `d` as `NAME.json` (atomically, mode 0600). A live VMM's descriptor of the same
    /// name is refused; a stale one is replaced.
    pub fn register(&self, d: &Descriptor) -> Result<Registration, RunDirError> {
        if !valid_name(&d.name) {
            return Err(RunDirError::BadName(d.name.clone()));
        }
        let path = self.descriptor_path(&d.name);
        if let Some(old) = read_descriptor(&path) {
            if old.pid != d.pid && old.alive() {
                return Err(RunDirError::Taken {
                    name: d.name.clone(),
                    pid: old.pid,
                    path,
                });
            }
        }
        let io_err = |source| RunDirError::Io {
            path: self.path.clone(),
            source,
        };
        let tmp = self.path.join(format!(".{}.{}.tmp", d.name, d.pid));
        let _ = fs::remove_file(&tmp);
        let text = serde_json::to_string(d).map_err(|e| io_err(io::Error::other(e)))?;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err)?;
        f.write_all(text.as_bytes()).map_err(io_err)?;
        drop(f);
        fs::rename(&tmp, &path).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            io_err(e)
        })?;
        Ok(Registration { path, pid: d.pid })
    }

    /// Every live VM; stale entries are removed, another uid's skipped.
    pub fn scan(&self) -> Result<Scan, RunDirError> {
        let io_err = |source| RunDirError::Io {
            path: self.path.clone(),
            source,
        };
        let me = euid();
        let mut scan = Scan::default();
        let mut names: Vec<(String, PathBuf)> = Vec::new();
        for e in fs::read_dir(&self.path).map_err(io_err)?.take(MAX_ENTRIES) {
            let Ok(e) = e else { continue };
            let file = e.file_name();
            if file.as_os_str() == CALIBRATION_FILE {
                continue;
            }
            let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".json")) else {
                continue;
            };
            if !valid_name(name) {
                continue;
            }
            names.push((name.to_string(), e.path()));
        }
        names.sort();
        for (name, path) in names {
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.file_type().is_file() || meta.uid() != me {
                scan.foreign += 1;
                continue;
            }
            let Some(d) = read_descriptor(&path).filter(|d| d.name == name) else {
                scan.unreadable += 1;
                continue;
            };
            if let Some(sock) = &d.socket {
                if fs::symlink_metadata(sock).is_ok_and(|m| m.uid() != me) {
                    scan.foreign += 1;
                    continue;
                }
            }
            if d.alive() {
                scan.vms.push(Entry {
                    descriptor: d,
                    path,
                });
            } else {
                self.remove_stale(&path, &d);
                scan.removed.push(name);
            }
        }
        Ok(scan)
    }

    /// Removes a dead VMM's descriptor and, when nobody accepts on it and it lies in this
    /// directory, its socket.
    fn remove_stale(&self, path: &Path, d: &Descriptor) {
        // Read again: a new VMM of the same name may have replaced it since.
        if read_descriptor(path).as_ref() != Some(d) {
            return;
        }
        let _ = fs::remove_file(path);
        if let Some(sock) = &d.socket {
            let inside = sock.parent() == Some(self.path.as_path());
            let refused = matches!(
                UnixStream::connect(sock),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused
            );
            if inside && refused {
                let _ = fs::remove_file(sock);
            }
        }
    }
}

/// A descriptor file's contents, when it is a readable descriptor.
fn read_descriptor(path: &Path) -> Option<Descriptor> {
    use std::io::Read;
    let f = fs::File::open(path).ok()?;
    let mut text = String::new();
    f.take(MAX_DESCRIPTOR).read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

/// A VMM's descriptor in the run directory: removed when dropped, while it is still ours.
#[derive(Debug)]
pub struct Registration {
    path: PathBuf,
    pid: u32,
}

impl Registration {
    /// The descriptor's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if read_descriptor(&self.path).is_some_and(|d| d.pid == self.pid) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests;
