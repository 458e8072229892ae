//! Files this process creates at a path someone else chose and removes when it ends: the
//! control socket and the PPA page file (docs/security.md, "Paths the VMM writes").
//!
//! Data flow: [`create_exclusive`] makes a new regular file (`O_CREAT | O_EXCL | O_NOFOLLOW`:
//! an existing file or a symbolic link at the path is refused, never followed or truncated),
//! sets its mode whatever the umask, and records the path with the device and inode it got;
//! `api::unix::bind_unix` records the socket file it binds with [`record`]. [`remove`] (the
//! owner's end) and [`remove_all`] (a forced exit) unlink a path only while it still names
//! that device and inode, so a file another process put there after ours went is left alone.
//! In a sticky directory such as `/tmp` or `/dev/shm` no other user can swap our file for
//! another between the check and the unlink.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Files this process created and has not removed: path, device and inode.
static OWNED: Mutex<Vec<(PathBuf, u64, u64)>> = Mutex::new(Vec::new());

/// Device and inode of the file at `path` (not following a symbolic link).
pub fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// What is at `path` now, in words, for an error message: "a symbolic link", "a directory",
/// "a file", or `None` when nothing is.
pub fn what_is_at(path: &Path) -> Option<&'static str> {
    let t = std::fs::symlink_metadata(path).ok()?.file_type();
    Some(if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else {
        "a file"
    })
}

/// Creates a new regular file at `path`, open for reading and writing, with exactly `mode`
/// (the umask is undone by `fchmod`), and records it as this process's. Fails with
/// `AlreadyExists` when anything (a file, a directory, a symbolic link, dangling or not) is at
/// `path`: nothing there is opened, truncated or followed.
pub fn create_exclusive(path: &Path, mode: u32) -> io::Result<File> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path contains a NUL"))?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let meta = file.metadata();
    // SAFETY: fchmod on a descriptor we own changes only its inode's mode.
    let chmod = unsafe { libc::fchmod(file.as_raw_fd(), mode as libc::mode_t) };
    let done = match (meta, chmod) {
        (Ok(m), 0) => Ok(m),
        (Err(e), _) => Err(e),
        (Ok(_), _) => Err(io::Error::last_os_error()),
    };
    match done {
        Ok(m) => {
            remember(path, m.dev(), m.ino());
            Ok(file)
        }
        Err(e) => {
            // The name is ours (O_EXCL made it): take it back.
            let _ = std::fs::remove_file(path);
            Err(e)
        }
    }
}

/// Records the file now at `path` (one this process just made, such as a bound socket) as
/// this process's: false when nothing is there.
pub fn record(path: &Path) -> bool {
    match identity(path) {
        Some((dev, ino)) => {
            remember(path, dev, ino);
            true
        }
        None => false,
    }
}

fn remember(path: &Path, dev: u64, ino: u64) {
    let mut owned = OWNED.lock().unwrap_or_else(|e| e.into_inner());
    // A file of ours that was at this path before was replaced.
    owned.retain(|(p, _, _)| p != path);
    owned.push((path.to_path_buf(), dev, ino));
}

/// Removes the file at `path` if it is still the one this process created there: true when
/// it was removed. A path that was never ours, or now names another file, is left alone.
/// Call it while the file is still open (the page's mapping, the socket's listener): a file
/// in use keeps its inode number, which a file system may give to a new file once ours is
/// gone.
pub fn remove(path: &Path) -> bool {
    let mut owned = OWNED.lock().unwrap_or_else(|e| e.into_inner());
    let Some(i) = owned.iter().position(|(p, _, _)| p == path) else {
        return false;
    };
    let (_, dev, ino) = owned.swap_remove(i);
    if identity(path) != Some((dev, ino)) {
        log::info!(
            "{} is no longer the file this VMM made (removed or replaced): left alone",
            path.display()
        );
        return false;
    }
    std::fs::remove_file(path).is_ok()
}

/// Removes every file this process created that is still its own (the forced exit of a
/// second stop signal, which runs no destructor).
pub fn remove_all() {
    let paths: Vec<PathBuf> = OWNED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(p, _, _)| p.clone())
        .collect();
    for p in paths {
        remove(&p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_new_file_is_created_with_the_mode_asked_whatever_the_umask() {
        let tmp = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let path = tmp.as_path().join("f");
        // On a thread with its own filesystem attributes (unshare CLONE_FS), so that the
        // narrow umask does not reach the unit tests running beside this one.
        let p = path.clone();
        std::thread::spawn(move || {
            // SAFETY: unshare and umask take plain integers and change only this thread.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_FS) }, 0);
            // SAFETY: as above.
            unsafe { libc::umask(0o277) };
            drop(create_exclusive(&p, 0o600).unwrap());
        })
        .join()
        .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        assert!(remove(&path));
        assert!(!path.exists());
    }

    #[test]
    fn an_existing_file_or_link_is_refused_and_left_as_it_was() {
        let tmp = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let dir = tmp.as_path();
        let victim = dir.join("victim.txt");
        std::fs::write(&victim, b"precious").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = dir.join("page.ppa");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let dangling = dir.join("dangling");
        std::os::unix::fs::symlink(dir.join("nothing-here"), &dangling).unwrap();
        for p in [&victim, &link, &dangling] {
            let e = create_exclusive(p, 0o600).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{}", p.display());
            // Refused paths are not ours: never removed.
            assert!(!remove(p));
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert!(
            !dir.join("nothing-here").exists(),
            "a dangling link is not followed"
        );
        assert_eq!(what_is_at(&link), Some("a symbolic link"));
        assert_eq!(what_is_at(&victim), Some("a file"));
        assert_eq!(what_is_at(dir), Some("a directory"));
        assert_eq!(what_is_at(&dir.join("none")), None);
    }

    #[test]
    fn a_file_replaced_by_another_is_left_alone() {
        let tmp = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let path = tmp.as_path().join("f");
        // Held open, as the page's mapping and the socket's listener hold theirs: an inode
        // in use keeps its number, so no new file can come to have our identity.
        let _ours = create_exclusive(&path, 0o600).unwrap();
        // Someone removes ours and puts a file of their own (or a link) there.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        assert!(!remove(&path));
        assert!(std::fs::symlink_metadata(&path).unwrap().is_symlink());
        // Never ours: left alone.
        assert!(!remove(&tmp.as_path().join("other")));
    }
}
