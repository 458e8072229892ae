//! The run directory on real files: checks, registration, scans that clean only what is stale.

use super::*;
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
        matches!(e, RunDirError::WorldWritable { mode: 0o777, .. }),
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
