//! Tests of [`Client`] against a fake server thread, and the helpers the `ctl` and `top` tests
//! share: the fake server and hand-built [`Stats`].

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ppa_vmm_api::{
    parse_request, Command, ErrorBody, ErrorKind, Level, Request, Response, SplitKind, SplitSource,
    Stats, Thresholds, VcpuMicroState, VcpuTimes, VmState, VmStats,
};
use serde_json::{json, Value};

use crate::{Client, ClientError};

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// A control socket in a fresh temporary directory, served by a thread that answers each
/// request line with what the handler returns for it (the request and its number, from 0).
/// An empty answer closes the connection, as does an answer whose last line is [`CLOSE`].
pub(crate) struct FakeServer {
    dir: PathBuf,
    sock: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

type Handler = dyn Fn(Request, usize) -> Vec<String> + Send + 'static;

/// The last line of an answer after which the fake server closes the connection.
pub(crate) const CLOSE: &str = "";

impl FakeServer {
    pub(crate) fn start(handler: impl Fn(Request, usize) -> Vec<String> + Send + 'static) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "ppa-vmm-client-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("api.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handler: Box<Handler> = Box::new(handler);
        let thread = std::thread::spawn(move || {
            let mut n = 0;
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                if let Ok(conn) = conn {
                    serve(conn, &*handler, &mut n);
                }
            }
        });
        FakeServer {
            dir,
            sock,
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.sock
    }
}

fn serve(conn: UnixStream, handler: &Handler, n: &mut usize) {
    let mut writer = conn.try_clone().unwrap();
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        let req = parse_request(line.as_bytes()).expect("the client sent a valid request");
        let answer = handler(req, *n);
        *n += 1;
        if answer.is_empty() {
            return;
        }
        for l in &answer {
            if writer.write_all(l.as_bytes()).is_err() {
                return;
            }
        }
        if answer.last().is_some_and(|l| l == CLOSE) {
            return;
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so that it sees the flag.
        let _ = UnixStream::connect(&self.sock);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A vCPU that ran `wall_ns`, `used_ns` of it on a CPU (all guest), with these exit counts.
pub(crate) fn vcpu(id: usize, wall_ns: u64, used_ns: u64, exits: &[(&str, u64)]) -> VcpuTimes {
    VcpuTimes {
        id,
        host_tid: 1000 + id as i32,
        wall_ns,
        used_ns,
        guest_ns: used_ns,
        kvm_ns: None,
        interrupted_ns: None,
        kvm_ns_estimate: None,
        guest_code_ns_estimate: None,
        parks: 0,
        vmm_ns: 0,
        steal_ns: 0,
        halted_ns: 0,
        idle_ns: wall_ns - used_ns,
        limited_ns: 0,
        paused_ns: 0,
        blocked_ns: 0,
        split: SplitKind::Exact,
        split_source: SplitSource::Records,
        records_lost: 0,
        records_preempted_ns: 0,
        records_on_cpu_ns: None,
        identity_error_ns: 0,
        state: VcpuMicroState::Guest,
        exits: exits.iter().map(|(r, c)| (r.to_string(), *c)).collect(),
        exit_ns: BTreeMap::new(),
        kvm_ns_reason: None,
        interrupted_reason: None,
        kvm_exits: BTreeMap::new(),
        kvm_exit_ns: BTreeMap::new(),
        kvm_exits_to_user: 0,
        interrupts: BTreeMap::new(),
        kvm_stats: BTreeMap::new(),
        host_cpus: Vec::new(),
        migrations: 0,
        thresholds: BTreeMap::new(),
        kvm_run_cpu_ns: None,
        kvm_run_wall_ns: 0,
        park_cpu_ns: 0,
        proc_ticks: None,
        overloads: 0,
        cpus: None,
        last_cpu: None,
        steal_before_start_ns: 0,
        stamp_clock: None,
        stamp_clock_drifts: 0,
    }
}

/// `stats` of a running VM named `test` with these vCPUs, `uptime_s` seconds old.
pub(crate) fn stats(vcpus: &[VcpuTimes], uptime_s: u64) -> Stats {
    Stats {
        vm: VmStats {
            name: "test".into(),
            pid: 4242,
            state: VmState::Running,
            vcpus: vcpus.len(),
            uptime_ns: uptime_s * 1_000_000_000,
            level: Level::Full,
            thresholds: Thresholds::default(),
            host_threads_ns: 0,
            host_cpu_ns: Default::default(),
            pressure: Default::default(),
        },
        vcpus: vcpus.iter().cloned().map(Into::into).collect(),
        groups: Vec::new(),
        devices: Vec::new(),
    }
}

#[test]
fn call_matches_ids_and_skips_events() {
    let server = FakeServer::start(|req, n| {
        assert_eq!(req.id, json!(n as u64 + 1), "ids increase from 1");
        let event =
            "{\"event\":\"threshold\",\"uptime_ns\":1,\"vcpu\":0,\"name\":\"guest_run_ns\",\
                     \"threshold_ns\":5,\"count\":1,\"total\":1}\n";
        let stale = Response::ok(json!(999), json!("stale")).to_line();
        let right = Response::ok(req.id.clone(), json!({"n": n})).to_line();
        vec![event.to_string(), "\n".to_string(), stale, right]
    });
    let mut client = Client::connect(server.path()).unwrap();
    for n in 0..3 {
        let r = client.call(Command::Version {}).unwrap();
        assert!(r.ok);
        assert_eq!(r.id, json!(n + 1));
        assert_eq!(r.result, Some(json!({"n": n})));
    }
}

#[test]
fn call_returns_a_refusal_without_id() {
    let server = FakeServer::start(|_, _| {
        let body = ErrorBody::new(ErrorKind::TooManyClients, "the VMM has 16 clients");
        vec![Response::err(Value::Null, body).to_line()]
    });
    let mut client = Client::connect(server.path()).unwrap();
    let r = client.call(Command::Stats {}).unwrap();
    assert!(!r.ok);
    assert_eq!(r.error.unwrap().kind, ErrorKind::TooManyClients);
}

#[test]
fn next_line_streams_events_then_ends() {
    let server = FakeServer::start(|req, _| {
        vec![
            Response::ok(req.id, json!({})).to_line(),
            "{\"event\":\"dropped\",\"count\":3}\n".into(),
            "{\"event\":\"vm-exit\",\"uptime_ns\":9,\"end\":\"completed\"}".into(),
            CLOSE.into(),
        ]
    });
    let mut client = Client::connect(server.path()).unwrap();
    assert!(
        client
            .call(Command::Subscribe {
                events: vec![],
                pressure: None,
            })
            .unwrap()
            .ok
    );
    assert_eq!(
        client.next_line().unwrap().as_deref(),
        Some("{\"event\":\"dropped\",\"count\":3}")
    );
    // The last line has no newline: the close ends it.
    assert_eq!(
        client.next_line().unwrap().as_deref(),
        Some("{\"event\":\"vm-exit\",\"uptime_ns\":9,\"end\":\"completed\"}")
    );
    assert_eq!(client.next_line().unwrap(), None);
    assert_eq!(client.vm_end(), Some(ppa_vmm_api::VmEnd::Completed));
}

#[test]
fn the_vm_end_is_seen_on_lines_call_skips() {
    let server = FakeServer::start(|req, n| match n {
        0 => vec![
            "{\"event\":\"vm-exit\",\"uptime_ns\":9,\"end\":\"shutdown\"}\n".into(),
            Response::ok(req.id, json!({})).to_line(),
        ],
        _ => Vec::new(),
    });
    let mut client = Client::connect(server.path()).unwrap();
    assert_eq!(client.vm_end(), None);
    assert!(client.call(Command::Stats {}).unwrap().ok);
    assert_eq!(client.vm_end(), Some(ppa_vmm_api::VmEnd::Shutdown));
}

#[test]
fn call_matches_ids_the_server_echoes_exactly() {
    // A server that echoes the id's text: the client matches by text, so a float-looking echo
    // of its integer id (what a JSON library that parses numbers as floats sends) is no match.
    let server = FakeServer::start(|req, _| {
        let wrong = format!("{{\"id\":{}.0,\"ok\":true,\"result\":1}}\n", req.id);
        let right = Response::ok(req.id, json!(2)).to_line();
        vec![wrong, right]
    });
    let mut client = Client::connect(server.path()).unwrap();
    let r = client.call(Command::Version {}).unwrap();
    assert_eq!(r.result, Some(json!(2)));
}

#[test]
fn closed_and_garbled_answers_are_errors() {
    let server = FakeServer::start(|_, n| match n {
        0 => Vec::new(),
        _ => vec!["not json\n".into()],
    });
    let mut client = Client::connect(server.path()).unwrap();
    let e = client.call(Command::Stats {}).unwrap_err();
    assert!(e.is_closed(), "{e:?}");
    assert!(e.to_string().contains("closed the connection"));
    let mut client = Client::connect(server.path()).unwrap();
    let e = client.call(Command::Stats {}).unwrap_err();
    assert!(matches!(e, ClientError::BadResponse { .. }), "{e:?}");
    assert!(e.to_string().ends_with("not a response: not json"), "{e}");
}

#[test]
fn a_silent_server_times_out() {
    let server = FakeServer::start(|req, _| {
        std::thread::sleep(Duration::from_millis(300));
        vec![Response::ok(req.id, json!(null)).to_line()]
    });
    let mut client = Client::connect(server.path()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let e = client.call(Command::Stats {}).unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e:?}");
    assert!(e.to_string().contains("did not answer within 50 ms"), "{e}");
}

#[test]
fn connect_errors_name_the_path() {
    let server = FakeServer::start(|_, _| Vec::new());
    let missing = server.path().with_file_name("missing.sock");
    let e = Client::connect(&missing).unwrap_err();
    assert!(matches!(e, ClientError::NoSocket(_)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains(&*missing.to_string_lossy()) && msg.contains("--api-sock"));

    let file = server.path().with_file_name("plain");
    std::fs::write(&file, b"").unwrap();
    let e = Client::connect(&file).unwrap_err();
    assert!(matches!(e, ClientError::Refused(_)), "{e:?}");
    assert!(e.to_string().contains("nothing accepts connections"));
}

/// The names in the `[dependencies]` table of a Cargo.toml.
fn dependencies(manifest: &str) -> Vec<&str> {
    manifest
        .lines()
        .skip_while(|l| l.trim() != "[dependencies]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.split_once('=').map(|(name, _)| name.trim()))
        .collect()
}

#[test]
fn links_no_kvm_code() {
    // The crate and the one workspace crate it depends on take only these; none of them links
    // KVM code (`cargo tree -p ppa-vmm-client` lists the whole tree). kvm-ioctls,
    // kvm-bindings, vm-memory or the ppa-vmm library would fail here.
    let allowed = [
        "ppa-vmm-api",
        "serde",
        "serde_json",
        "thiserror",
        "clap",
        "libc",
        // The protocol types' JSON Schemas (pure Rust, no KVM).
        "schemars",
    ];
    let own = dependencies(include_str!("../Cargo.toml"));
    let api = dependencies(include_str!("../../ppa-vmm-api/Cargo.toml"));
    assert!(own.contains(&"ppa-vmm-api"), "{own:?}");
    for dep in own.iter().chain(&api) {
        assert!(allowed.contains(dep), "`{dep}` is not among {allowed:?}");
    }
}
