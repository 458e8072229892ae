//! The run directory on real files: checks, registration, scans that clean only what is stale.

use super::*;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ppa-rundir-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    d
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_directory_is_made_private_and_a_bad_one_refused_with_a_sentence() {
    let base = tmp("open");
    let d = base.join("run");
    let r = RunDir::open(Some(&d), true).unwrap();
    assert_eq!(r.path(), d);
    assert_eq!(mode(&d), 0o700);
    // Missing and not to be made: an error naming it.
    let e = RunDir::open(Some(&base.join("nope")), false).unwrap_err();
    assert!(
        e.to_string().contains("cannot use the run directory"),
        "{e}"
    );
    // World-writable.
    fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
    let e = RunDir::open(Some(&d), false).unwrap_err();
    assert!(
        matches!(e, RunDirError::Writable { mode: 0o777, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("world-writable"));
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    assert!(
        RunDir::open(Some(&d), false).is_ok(),
        "group/other may read"
    );
    // A link to it, and a file.
    let link = base.join("link");
    std::os::unix::fs::symlink(&d, &link).unwrap();
    assert!(matches!(
        RunDir::open(Some(&link), false),
        Err(RunDirError::NotDirectory(_))
    ));
    let file = base.join("file");
    fs::write(&file, b"").unwrap();
    assert!(matches!(
        RunDir::open(Some(&file), false),
        Err(RunDirError::NotDirectory(_))
    ));
    // Another user's (only root can give a directory away to test this).
    if euid() == 0 {
        std::os::unix::fs::chown(&d, Some(54_321), None).unwrap();
        let e = RunDir::open(Some(&d), false).unwrap_err();
        assert!(
            matches!(e, RunDirError::NotOurs { owner: 54_321, .. }),
            "{e}"
        );
        std::os::unix::fs::chown(&d, Some(0), None).unwrap();
    }
    fs::remove_dir_all(&base).unwrap();
}

#[test]
fn names_and_socket_paths_are_checked() {
    let base = tmp("names");
    let r = RunDir::open(Some(&base), true).unwrap();
    assert!(r.socket_path("web-1").unwrap().ends_with("web-1.sock"));
    for bad in ["", ".hidden", "a/b", "..", "a b", "x\n", "calibration"] {
        assert!(
            matches!(r.socket_path(bad), Err(RunDirError::BadName(_))),
            "{bad:?}"
        );
    }
    let deep = RunDir {
        path: PathBuf::from(format!("/tmp/{}", "d".repeat(100))),
    };
    assert!(matches!(
        deep.socket_path("vm"),
        Err(RunDirError::TooLong(_))
    ));
    fs::remove_dir_all(&base).unwrap();
}

#[test]
fn scans_list_the_live_and_clean_the_dead_without_touching_a_live_socket() {
    let base = tmp("scan");
    let r = RunDir::open(Some(&base), true).unwrap();
    // A live VM (this process) with a socket someone accepts on.
    let live_sock = r.socket_path("live").unwrap();
    let _listener = UnixListener::bind(&live_sock).unwrap();
    let reg = r
        .register(&Descriptor::of_self("live", 2, Some(live_sock.clone())))
        .unwrap();
    assert_eq!(mode(reg.path()), 0o600);
    // A dead one (a pid that exists with another start time: this process, earlier) whose
    // socket nobody accepts on any more.
    let dead_sock = r.socket_path("dead").unwrap();
    drop(UnixListener::bind(&dead_sock).unwrap());
    let mut dead = Descriptor::of_self("dead", 1, Some(dead_sock.clone()));
    dead.proc_start += 1;
    let _dead = r.register(&dead).unwrap();
    // A dead one whose socket a new VMM already answers on: the socket stays.
    let reused_sock = r.socket_path("reused").unwrap();
    let _new = UnixListener::bind(&reused_sock).unwrap();
    let mut reused = Descriptor::of_self("reused", 1, Some(reused_sock.clone()));
    reused.pid = u32::MAX - 1;
    let _reused = r.register(&reused).unwrap();
    // Garbage, and the calibration cache (neither a VM nor unreadable).
    fs::write(base.join("junk.json"), b"{not json").unwrap();
    fs::write(base.join(CALIBRATION_FILE), b"{\"cache\": 1}").unwrap();
    let s = r.scan().unwrap();
    let names: Vec<&str> = s.vms.iter().map(|e| e.descriptor.name.as_str()).collect();
    assert_eq!(names, ["live"]);
    assert_eq!(s.vms[0].descriptor.vcpus, 2);
    assert_eq!(s.removed, ["dead", "reused"]);
    assert_eq!(s.unreadable, 1, "junk.json only");
    assert!(!base.join("dead.json").exists() && !dead_sock.exists());
    assert!(!base.join("reused.json").exists());
    assert!(
        reused_sock.exists(),
        "a socket someone answers on is not removed"
    );
    assert!(live_sock.exists() && reg.path().exists());
    // Another user's descriptor: skipped and counted, left alone.
    if euid() == 0 {
        let other = base.join("other.json");
        fs::write(
            &other,
            serde_json::to_string(&Descriptor::of_self("other", 1, None)).unwrap(),
        )
        .unwrap();
        std::os::unix::fs::chown(&other, Some(54_321), None).unwrap();
        let s = r.scan().unwrap();
        assert_eq!((s.vms.len(), s.foreign), (1, 1));
        assert!(other.exists());
    }
    // The registration goes with its drop.
    let path = reg.path().to_path_buf();
    drop(reg);
    assert!(!path.exists());
    fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_live_vms_name_is_not_taken_over() {
    let base = tmp("taken");
    let r = RunDir::open(Some(&base), true).unwrap();
    // Process 1 is alive: a descriptor naming it (with its real start time) is a live VM.
    let mut init = Descriptor::of_self("busy", 1, None);
    init.pid = 1;
    init.proc_start = proc_start(1).unwrap();
    let _init = r.register(&init).unwrap();
    let e = r
        .register(&Descriptor::of_self("busy", 1, None))
        .unwrap_err();
    assert!(matches!(e, RunDirError::Taken { pid: 1, .. }), "{e}");
    assert!(e.to_string().contains("already running"));
    // A stale one of the name is replaced.
    let mut old = init.clone();
    old.proc_start += 1;
    let _old = r.register(&old).unwrap();
    assert!(r.register(&Descriptor::of_self("busy", 1, None)).is_ok());
    fs::remove_dir_all(&base).unwrap();
}

#[test]
fn proc_start_reads_field_22_past_a_command_with_spaces() {
    let me = proc_start(std::process::id()).unwrap();
    assert!(me > 0);
    assert_eq!(proc_start(u32::MAX - 1), None);
}

/// Runs `f` on a thread and gives up after 5 s: a reader that blocks (a FIFO opened without
/// O_NONBLOCK waits for a writer forever) fails the test instead of hanging it.
fn within_5s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(5))
        .unwrap_or_else(|_| panic!("{what} blocked for 5 s"))
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Issue 39, item 5: a group-writable run directory was accepted, and a member of the group
/// moved a VM's socket aside and bound their own. Only its owner may write in it, unless it
/// is sticky (then others cannot move or remove what is not theirs).
#[test]
fn a_directory_others_may_write_in_is_refused_unless_it_is_sticky() {
    let base = tmp("modes");
    let d = base.join("run");
    RunDir::open(Some(&d), true).unwrap();
    let me = euid();
    for (m, who) in [
        (0o770, "group-writable"),
        (0o730, "group-writable"),
        (0o707, "world-writable"),
        (0o777, "group- and world-writable"),
    ] {
        fs::set_permissions(&d, fs::Permissions::from_mode(m)).unwrap();
        let e = RunDir::open(Some(&d), false).unwrap_err();
        assert!(
            matches!(e, RunDirError::Writable { mode, owner, .. } if mode == m && owner == me),
            "{m:o}: {e}"
        );
        let text = e.to_string();
        for part in [
            d.display().to_string(),
            format!("owner uid {me}"),
            format!("mode {m:o}"),
            who.to_string(),
        ] {
            assert!(text.contains(&part), "{m:o}: {part:?} in {text}");
        }
    }
    // Sticky and ours: others may add entries but not move or remove ours.
    for m in [0o1777, 0o1770] {
        fs::set_permissions(&d, fs::Permissions::from_mode(m)).unwrap();
        assert!(RunDir::open(Some(&d), false).is_ok(), "{m:o}");
    }
    // Another user's, sticky and world-writable (as /tmp is): refused, naming owner and mode.
    if me == 0 {
        fs::set_permissions(&d, fs::Permissions::from_mode(0o1777)).unwrap();
        std::os::unix::fs::chown(&d, Some(54_321), None).unwrap();
        let e = RunDir::open(Some(&d), false).unwrap_err();
        assert!(
            matches!(
                e,
                RunDirError::NotOurs {
                    owner: 54_321,
                    mode: 0o1777,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("mode 1777"), "{e}");
        std::os::unix::fs::chown(&d, Some(0), None).unwrap();
    }
    fs::remove_dir_all(&base).unwrap();
}

/// Issue 39, item 5: `mkfifo victim2.json` hung a root VMM at start (it blocked opening the
/// FIFO). Descriptors are opened O_NONBLOCK | O_NOFOLLOW and must be regular files: a FIFO or
/// a link at NAME.json is refused with a sentence, and a scan skips it, without blocking.
#[test]
fn a_fifo_or_a_link_planted_as_a_descriptor_is_refused_without_blocking() {
    let base = tmp("fifo");
    let r = RunDir::open(Some(&base), true).unwrap();
    mkfifo(&base.join("victim2.json"));
    let target = base.join("elsewhere.json");
    fs::write(&target, b"{}").unwrap();
    std::os::unix::fs::symlink(&target, base.join("linked.json")).unwrap();
    for (name, what) in [("victim2", "a FIFO"), ("linked", "a symbolic link")] {
        let r2 = r.clone();
        let e = within_5s("registering over a planted descriptor", move || {
            r2.register(&Descriptor::of_self(name, 1, None))
        })
        .unwrap_err();
        assert!(matches!(e, RunDirError::NotAFile { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("{name}.json")) && text.contains(what),
            "{text}"
        );
    }
    // Neither was replaced, and the link's target is untouched.
    assert!(fs::symlink_metadata(base.join("victim2.json"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(fs::read(&target).unwrap(), b"{}");
    let r2 = r.clone();
    let s = within_5s("a scan over a FIFO", move || r2.scan()).unwrap();
    assert!(s.vms.is_empty() && s.removed.is_empty(), "{s:?}");
    assert_eq!(
        s.unreadable, 3,
        "the FIFO, the link and elsewhere.json: {s:?}"
    );
    fs::remove_dir_all(&base).unwrap();
}

/// Issue 39, item 6: a dead VMM's descriptor whose `socket` named a regular file of the run
/// directory made `host list` delete that file (a connect to a regular file is refused, which
/// the cleaning took for a dead socket). Only what `lstat` shows to be a socket owned by the
/// descriptor's owner, inside the directory, is unlinked; the rest is kept and reported.
#[test]
fn stale_cleaning_unlinks_only_a_dead_socket_of_the_descriptors_owner_inside() {
    let base = tmp("clean");
    let outside = tmp("clean-out");
    fs::create_dir_all(&outside).unwrap();
    let r = RunDir::open(Some(&base), true).unwrap();
    let precious = base.join("precious.txt");
    fs::write(&precious, b"keep me").unwrap();
    let fake_sock = base.join("st2.sock");
    fs::write(&fake_sock, b"a regular file").unwrap();
    let far_sock = outside.join("far.sock");
    drop(UnixListener::bind(&far_sock).unwrap());
    let link = base.join("link.sock");
    std::os::unix::fs::symlink(&far_sock, &link).unwrap();
    let dead_sock = base.join("dead.sock");
    drop(UnixListener::bind(&dead_sock).unwrap());
    let mut regs = Vec::new();
    for (name, sock) in [
        ("precious", &precious),
        ("st2", &fake_sock),
        ("far", &far_sock),
        ("link", &link),
        ("dead", &dead_sock),
    ] {
        let mut d = Descriptor::of_self(name, 1, Some(sock.clone()));
        d.proc_start += 1;
        regs.push(r.register(&d).unwrap());
    }
    let s = r.scan().unwrap();
    assert_eq!(s.removed, ["dead", "far", "link", "precious", "st2"]);
    assert!(
        !dead_sock.exists(),
        "a dead socket of ours inside is removed"
    );
    assert_eq!(fs::read(&precious).unwrap(), b"keep me");
    assert_eq!(fs::read(&fake_sock).unwrap(), b"a regular file");
    assert!(far_sock.exists(), "a socket outside the directory stays");
    assert!(fs::symlink_metadata(&link).is_ok(), "a link stays");
    let kept: Vec<(&str, &str)> = s
        .kept
        .iter()
        .map(|k| (k.name.as_str(), k.why.as_str()))
        .collect();
    assert_eq!(
        kept,
        [
            ("far", "it is outside the run directory"),
            ("link", "it is a symbolic link, not a socket"),
            ("precious", "it is a regular file, not a socket"),
            ("st2", "it is a regular file, not a socket"),
        ],
        "{s:?}"
    );
    // What `host list` prints about one.
    let note = s.kept[2].to_string();
    assert!(
        note.contains("precious") && note.contains(&precious.display().to_string()),
        "{note}"
    );
    // A dead socket of another uid: the entry is theirs (skipped, counted), nothing removed.
    if euid() == 0 {
        let theirs = base.join("theirs.sock");
        drop(UnixListener::bind(&theirs).unwrap());
        std::os::unix::fs::chown(&theirs, Some(54_321), None).unwrap();
        let mut d = Descriptor::of_self("theirs", 1, Some(theirs.clone()));
        d.proc_start += 1;
        regs.push(r.register(&d).unwrap());
        let s = r.scan().unwrap();
        assert_eq!((s.foreign, s.removed.len()), (1, 0), "{s:?}");
        assert!(theirs.exists() && base.join("theirs.json").exists());
        // And the check itself, as a race would meet it (the socket changed hands after the
        // scan looked): not removed, said why.
        let why = r.stale_socket(&theirs, 0).unwrap_err();
        assert!(why.contains("uid 54321") && why.contains("uid 0"), "{why}");
    }
    drop(regs);
    fs::remove_dir_all(&base).unwrap();
    fs::remove_dir_all(&outside).unwrap();
}
