//! A `ppa-vmm run` child process with a control socket, and a JSON Lines client for it: how the
//! end-to-end tests drive the VMM as an operator's tool would.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use ppa_vmm_api::Stats;
use serde_json::{json, Value};
use vmm_sys_util::tempdir::TempDir;

/// The `ppa-vmm` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ppa-vmm")
}

/// Runs `ppa-vmm ctl --api-sock SOCK ARGS...` to its end.
pub fn ctl(sock: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(bin())
        .arg("ctl")
        .arg("--api-sock")
        .arg(sock)
        .args(args)
        .output()
        .unwrap()
}

/// A `ppa-vmm run` child with a control socket; killed on drop if still running.
pub struct Vmm {
    child: Option<Child>,
    /// The control socket.
    pub sock: PathBuf,
    /// A private directory, removed with the VMM.
    pub dir: TempDir,
}

/// Connects to the control socket of a VMM that is starting: polls every 5 ms, and gives up
/// with a message after 6000 attempts (the VMM failed to start).
pub fn connect_when_up(sock: &Path) -> UnixStream {
    for _ in 0..6000 {
        if let Ok(s) = UnixStream::connect(sock) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the control socket {} did not appear", sock.display());
}

/// A new empty private directory under the system's temporary directory, named after `tag`;
/// removed when dropped.
pub fn temp_dir(tag: &str) -> TempDir {
    TempDir::new_with_prefix(std::env::temp_dir().join(format!("ppa-test-{tag}-")))
        .expect("a temporary directory")
}

impl Vmm {
    /// Starts `ppa-vmm run --api-sock DIR/api.sock --report json ARGS` and waits for the socket.
    pub fn start(tag: &str, args: &[&str]) -> Vmm {
        Self::spawn(tag, args, false, "json")
    }

    /// As [`Vmm::start`], with the report in `format` (read it with [`Vmm::shutdown_output`]).
    pub fn with_report(tag: &str, format: &str, args: &[&str]) -> Vmm {
        Self::spawn(tag, args, false, format)
    }

    /// As [`Vmm::start`], inside the network namespace `netns` (`ip netns exec`, which execs
    /// the VMM: the child is the VMM itself).
    pub fn start_in(netns: &str, tag: &str, args: &[&str]) -> Vmm {
        Self::spawn_with(Some(netns), tag, args, false, "json")
    }

    /// As [`Vmm::start`], with the PPA page exposed as the file [`Vmm::page`].
    pub fn with_page(tag: &str, args: &[&str]) -> Vmm {
        Self::spawn(tag, args, true, "json")
    }

    /// The `--ppa-page-file` of a VMM made by [`Vmm::with_page`].
    pub fn page(&self) -> PathBuf {
        self.dir.as_path().join("page")
    }

    fn spawn(tag: &str, args: &[&str], page: bool, report: &str) -> Vmm {
        Self::spawn_with(None, tag, args, page, report)
    }

    fn spawn_with(netns: Option<&str>, tag: &str, args: &[&str], page: bool, report: &str) -> Vmm {
        super::require_kvm();
        let dir = temp_dir(tag);
        let sock = dir.as_path().join("api.sock");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin()]);
                c
            }
            None => Command::new(bin()),
        };
        cmd.arg("run").arg("--api-sock").arg(&sock).args([
            "--report",
            report,
            "--max-runtime",
            "120",
        ]);
        if page {
            cmd.arg("--ppa-page-file").arg(dir.as_path().join("page"));
        }
        // A named VM registers in a run directory: this test's own, never the host's
        // (/run/ppa-vmm), so that a test killed half-way leaves nothing there.
        if args.contains(&"--name") && !args.contains(&"--run-dir") {
            cmd.arg("--run-dir").arg(dir.as_path());
        }
        let child = cmd
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ppa-vmm starts");
        let vmm = Vmm {
            child: Some(child),
            sock,
            dir,
        };
        drop(connect_when_up(&vmm.sock));
        vmm
    }

    /// The VMM's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the VMM is running").id()
    }

    /// A new connection to the control socket.
    pub fn connect(&self) -> Conn {
        Conn::new(UnixStream::connect(&self.sock).expect("connect"))
    }

    /// Waits until the guest's driver has started the device `name` (DRIVER_OK seen by the
    /// VMM).
    pub fn wait_driver(&self, name: &str) {
        let mut c = self.connect();
        for _ in 0..4000 {
            let d = c.ok(json!({"cmd": "device", "name": name}));
            if d["driver"]["activations"].as_u64().unwrap_or(0) >= 1 {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("the guest never started its device {name}");
    }

    /// Shuts the VM down through the socket and returns the exit status and the report.
    pub fn shutdown(mut self) -> (i32, Value) {
        let r = self.connect().call(json!({"id": "bye", "cmd": "shutdown"}));
        assert_eq!(r["ok"], json!(true), "{r}");
        self.wait()
    }

    /// Shuts the VM down through the socket and returns what the VMM printed.
    pub fn shutdown_output(mut self) -> Output {
        let r = self.connect().call(json!({"id": "bye", "cmd": "shutdown"}));
        assert_eq!(r["ok"], json!(true), "{r}");
        self.child.take().unwrap().wait_with_output().unwrap()
    }

    /// Waits for the child to end by itself; returns its exit status and report.
    pub fn wait(&mut self) -> (i32, Value) {
        let out: Output = self.child.take().unwrap().wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("report: {e}; stderr: {stderr}"));
        (out.status.code().unwrap_or(-1), report)
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A control-socket client speaking JSON Lines.
pub struct Conn {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Conn {
    /// Wraps a connected stream (reads time out after 20 s).
    pub fn new(s: UnixStream) -> Conn {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Conn {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
        }
    }

    /// Writes bytes as they are.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).unwrap();
    }

    /// Reads one response line.
    pub fn line(&mut self) -> Value {
        let mut l = String::new();
        self.reader.read_line(&mut l).expect("a line");
        assert!(l.ends_with('\n'), "a whole line: {l:?}");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l}: {e}"))
    }

    /// Sends a request, returns the whole response.
    pub fn call(&mut self, req: Value) -> Value {
        self.send_raw(format!("{req}\n").as_bytes());
        self.line()
    }

    /// Sends a request that must succeed; returns its result.
    pub fn ok(&mut self, req: Value) -> Value {
        let r = self.call(req.clone());
        assert_eq!(r["ok"], json!(true), "{req} -> {r}");
        assert_eq!(r["id"], req.get("id").cloned().unwrap_or(Value::Null));
        r["result"].clone()
    }

    /// Sends a raw line that must fail; returns the error kind.
    pub fn error_kind(&mut self, req: &[u8]) -> String {
        self.send_raw(req);
        self.send_raw(b"\n");
        let r = self.line();
        assert_eq!(r["ok"], json!(false), "{r}");
        r["error"]["kind"].as_str().unwrap().to_string()
    }

    /// The `stats` result.
    pub fn stats(&mut self) -> Stats {
        serde_json::from_value(self.ok(json!({"cmd": "stats"}))).unwrap()
    }

    /// The share of wall time vCPU `vcpu` used over the next `ms`, and its limited time in
    /// them, from two `stats` snapshots.
    pub fn share_over(&mut self, vcpu: usize, ms: u64) -> (f64, u64) {
        let a = self.stats().vcpus[vcpu].clone();
        std::thread::sleep(Duration::from_millis(ms));
        let b = self.stats().vcpus[vcpu].clone();
        (
            (b.used_ns - a.used_ns) as f64 / (b.wall_ns - a.wall_ns) as f64,
            b.limited_ns - a.limited_ns,
        )
    }
}
