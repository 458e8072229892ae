//! The run directory (spec section 11): where each VMM started with `--name` or `--run-dir`
//! puts its control socket (`NAME.sock`, unless `--api-sock` says otherwise) and a small
//! descriptor (`NAME.json`: pid, start time, version, vCPUs, socket), so that `ppa-vmm host`
//! finds every VM on the host.
//!
//! Data flow: the VMM checks the directory ([`RunDir::open`]: ours, not a link, and no other
//! user may write in it unless it is sticky), writes its descriptor atomically before it
//! builds the VM ([`RunDir::register`]) and removes it at the end ([`Registration`]'s drop,
//! only while it is still its own). Readers ([`RunDir::scan`]) list the descriptors, opened
//! `O_NONBLOCK | O_NOFOLLOW` and read only when they are regular files (a FIFO planted as a
//! descriptor must not block a VMM or a `host` command); an entry whose process is gone (the
//! pid is dead, or is another process now: its start time in /proc differs) is stale, and its
//! descriptor is removed, and its socket too when `lstat` shows a socket of the descriptor's
//! owner in this directory that nobody accepts on; anything else it names is kept and
//! reported ([`KeptSocket`]). Entries owned by another uid are skipped and counted, never
//! read or removed.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
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
        "the run directory {path} belongs to uid {owner} (mode {mode:o}), not to this user \
         (uid {me}): another user's VMs and sockets are not ours to list or clean"
    )]
    NotOurs {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Its mode.
        mode: u32,
        /// Our effective uid.
        me: u32,
    },
    /// Others may write in it, and it is not sticky.
    #[error(
        "the run directory {path} (owner uid {owner}, mode {mode:o}) is {who} and not sticky: \
         {others} could move a VM's socket aside and bind their own, delete descriptors or \
         plant a FIFO that blocks a VMM; use a directory only its owner may write \
         (chmod go-w), or make it sticky (chmod +t)"
    )]
    Writable {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Its mode.
        mode: u32,
        /// `group-writable`, `world-writable` or `group- and world-writable`.
        who: &'static str,
        /// Who could write: `any member of its group`, `any user`.
        others: &'static str,
    },
    /// Something other than a regular file is where a descriptor goes.
    #[error(
        "{} in the run directory is {what}, not a regular file: a VMM writes its descriptor \
         there itself, so something else put this there; remove it (rm {}) and start again",
        .path.file_name().map_or_else(|| .path.display().to_string(), |n| n.to_string_lossy().into_owned()),
        .path.display()
    )]
    NotAFile {
        /// The descriptor's path.
        path: PathBuf,
        /// What is there, in words (`a FIFO`, `a symbolic link`, ...).
        what: &'static str,
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
    /// Descriptors that could not be read or parsed, or are not regular files, left alone.
    pub unreadable: usize,
    /// Socket paths of removed stale entries that were left alone, and why.
    pub kept: Vec<KeptSocket>,
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
    /// a directory, not a link, ours, and neither group- nor world-writable unless sticky
    /// (in a sticky directory others may add entries, never move or remove ours).
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
        let (owner, mode) = (meta.uid(), meta.permissions().mode() & 0o7777);
        if owner != me {
            return Err(RunDirError::NotOurs {
                path,
                owner,
                mode,
                me,
            });
        }
        if let Some((who, others)) = writable_by_others(mode) {
            return Err(RunDirError::Writable {
                path,
                owner,
                mode,
                who,
                others,
            });
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
    /// name is refused, and so is anything there that is not a regular file (a FIFO, a link);
    /// a stale descriptor is replaced.
    pub fn register(&self, d: &Descriptor) -> Result<Registration, RunDirError> {
        if !valid_name(&d.name) {
            return Err(RunDirError::BadName(d.name.clone()));
        }
        let path = self.descriptor_path(&d.name);
        match read_slot(&path) {
            Slot::NotAFile(what) => return Err(RunDirError::NotAFile { path, what }),
            Slot::File {
                descriptor: Some(old),
                ..
            } if old.pid != d.pid && old.alive() => {
                return Err(RunDirError::Taken {
                    name: d.name.clone(),
                    pid: old.pid,
                    path,
                });
            }
            _ => {}
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
            let (owner, d) = match read_slot(&path) {
                Slot::Empty => continue,
                Slot::File { uid, .. } if uid != me => {
                    scan.foreign += 1;
                    continue;
                }
                Slot::File {
                    uid,
                    descriptor: Some(d),
                } if d.name == name => (uid, d),
                Slot::NotAFile(_) | Slot::File { .. } => {
                    scan.unreadable += 1;
                    continue;
                }
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
                if let Some(kept) = self.remove_stale(&path, &d, owner) {
                    scan.kept.push(kept);
                }
                scan.removed.push(name);
            }
        }
        Ok(scan)
    }

    /// Removes a dead VMM's descriptor (owned by `owner`) and its socket when that is one to
    /// remove ([`RunDir::stale_socket`]); a socket path it leaves alone for a reason worth
    /// saying is returned.
    fn remove_stale(&self, path: &Path, d: &Descriptor, owner: u32) -> Option<KeptSocket> {
        // Read again: a new VMM of the same name may have replaced it since.
        match read_slot(path) {
            Slot::File {
                descriptor: Some(now),
                ..
            } if now == *d => {}
            _ => return None,
        }
        let _ = fs::remove_file(path);
        let sock = d.socket.as_ref()?;
        match self.stale_socket(sock, owner) {
            Ok(true) => {
                let _ = fs::remove_file(sock);
                None
            }
            Ok(false) => None,
            Err(why) => Some(KeptSocket {
                name: d.name.clone(),
                socket: sock.clone(),
                why,
            }),
        }
    }

    /// Whether `sock`, named by a dead VMM's descriptor of uid `owner`, is to be unlinked:
    /// `Ok(true)` when `lstat` shows a socket of `owner`, directly in this directory, that
    /// nobody accepts on; `Ok(false)` when nothing is there or something accepts on it (a new
    /// VMM's); else why it is left alone. A connect to a regular file is refused just as one
    /// to a dead socket, so what the path is must be seen first.
    fn stale_socket(&self, sock: &Path, owner: u32) -> Result<bool, String> {
        let inside = sock.parent() == Some(self.path.as_path())
            && sock
                .file_name()
                .is_some_and(|n| n != "." && n != ".." && !n.is_empty());
        if !inside {
            return Err("it is outside the run directory".into());
        }
        let meta = match fs::symlink_metadata(sock) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(format!("it cannot be looked at: {e}")),
        };
        if !meta.file_type().is_socket() {
            return Err(format!("it is {}, not a socket", kind_of(meta.file_type())));
        }
        if meta.uid() != owner {
            return Err(format!(
                "the socket belongs to uid {}, not to the descriptor's owner (uid {owner})",
                meta.uid()
            ));
        }
        Ok(matches!(
            UnixStream::connect(sock),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused
        ))
    }
}

/// A stale entry's socket path that the cleaning left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptSocket {
    /// The dead VM's name.
    pub name: String,
    /// What its descriptor named as its socket.
    pub socket: PathBuf,
    /// Why it was not removed (`it is a regular file, not a socket`, ...).
    pub why: String,
}

impl std::fmt::Display for KeptSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stale entry {}: its socket path {} was skipped, not removed: {}",
            self.name,
            self.socket.display(),
            self.why
        )
    }
}

/// Whether a directory of `mode` lets others than its owner move or remove its entries:
/// group- or world-writable without the sticky bit. `Some((what it is, who could))`.
fn writable_by_others(mode: u32) -> Option<(&'static str, &'static str)> {
    if mode & libc::S_ISVTX != 0 {
        return None;
    }
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => Some(("group- and world-writable", "any user")),
        (true, false) => Some(("group-writable", "any member of its group")),
        (false, true) => Some(("world-writable", "any user")),
        (false, false) => None,
    }
}

/// What a file type is, in words, for a sentence.
fn kind_of(t: fs::FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "neither a file nor a directory"
    }
}

/// What is at a descriptor's path.
#[derive(Debug)]
enum Slot {
    /// Nothing.
    Empty,
    /// Something other than a regular file (what, in words): never opened.
    NotAFile(&'static str),
    /// A regular file: its owner, and the descriptor it holds (`None`: unreadable, or not a
    /// descriptor).
    File {
        uid: u32,
        descriptor: Option<Descriptor>,
    },
}

/// Looks at a descriptor's path without following a link, opening anything that is not a
/// regular file, or blocking: `lstat` first, then `O_NONBLOCK | O_NOFOLLOW` and `fstat`
/// again (something swapped in between is caught by the second look).
fn read_slot(path: &Path) -> Slot {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Slot::Empty,
        Ok(m) if !m.file_type().is_file() => return Slot::NotAFile(kind_of(m.file_type())),
        _ => {}
    }
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path);
    let f = match f {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Slot::Empty,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Slot::NotAFile("a symbolic link")
        }
        Err(_) => {
            return match fs::symlink_metadata(path) {
                Ok(m) => Slot::File {
                    uid: m.uid(),
                    descriptor: None,
                },
                Err(_) => Slot::Empty,
            }
        }
    };
    let Ok(meta) = f.metadata() else {
        return Slot::Empty;
    };
    if !meta.file_type().is_file() {
        return Slot::NotAFile(kind_of(meta.file_type()));
    }
    let mut text = String::new();
    let descriptor = f
        .take(MAX_DESCRIPTOR)
        .read_to_string(&mut text)
        .ok()
        .and_then(|_| serde_json::from_str(&text).ok());
    Slot::File {
        uid: meta.uid(),
        descriptor,
    }
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
        if let Slot::File {
            descriptor: Some(d),
            ..
        } = read_slot(&self.path)
        {
            if d.pid == self.pid {
                let _ = fs::remove_file(&self.path);
            }
        }
    }
}

#[cfg(test)]
mod tests;
