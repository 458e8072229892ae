//! Runs of this build's ppa-vmm inside the nested test host (`scripts/nested-run.sh`: QEMU TCG
//! emulating an AMD CPU with SVM, Debian's kernel with kvm-amd), and reading what comes back:
//! the report on stdout, the guest's console lines on stderr, the nested host's own lines.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Mutex;

use serde_json::Value;

/// One nested host at a time from this binary (the script also takes a lock of its own).
pub static NESTED: Mutex<()> = Mutex::new(());

/// The hard limit of one try in seconds. Three cases of three tries each stay under 10 minutes.
pub const TRY_TIMEOUT_S: &str = "60";

pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

pub fn require_qemu() {
    let qemu = Command::new("sh")
        .args(["-c", "command -v qemu-system-x86_64"])
        .output()
        .expect("sh runs");
    assert!(
        qemu.status.success(),
        "qemu-system-x86_64 is missing: the nested SVM checks need it. Run scripts/setup.sh \
         (it installs qemu-system-x86, busybox-static and cpio; CI runs it)."
    );
}

/// Whether the slow nested checks run: only with `PPA_NESTED_SLOW=1`, since each boots a Linux
/// guest in the nested host under QEMU TCG (minutes) and CI has no room for them. Otherwise
/// prints why `test` is skipped and returns false (the test then passes without checking).
pub fn slow_nested(test: &str) -> bool {
    if std::env::var_os("PPA_NESTED_SLOW").is_some_and(|v| v == "1") {
        return true;
    }
    eprintln!(
        "{test}: skipped: it boots a Linux guest in the nested host under QEMU TCG (minutes); \
         PPA_NESTED_SLOW=1 runs it"
    );
    false
}

/// Runs `ppa-vmm ARGS` (this build) in the nested host; panics when the host itself failed.
pub fn nested(args: &[&str]) -> Output {
    nested_with(args, None)
}

/// [`nested`] with `kvm_amd` parameters for the nested host's kvm-amd (`NESTED_KVM_AMD`).
pub fn nested_with(args: &[&str], kvm_amd: Option<&str>) -> Output {
    nested_tap(args, kvm_amd, None, TRY_TIMEOUT_S)
}

/// [`nested_with`], the nested host making the tap `tap` (`NAME=IP/PREFIX`, with that many
/// queues) first; each try may take `timeout_s` seconds.
pub fn nested_tap(
    args: &[&str],
    kvm_amd: Option<&str>,
    tap: Option<(&str, u16)>,
    timeout_s: &str,
) -> Output {
    nested_full(args, kvm_amd, tap, None, timeout_s)
}

/// [`nested_with`], the nested host running the shell script `side` beside ppa-vmm
/// (`nested-run.sh --side`: its output comes back on stderr, each line starting
/// `nested-side: `).
pub fn nested_side(args: &[&str], kvm_amd: Option<&str>, side: &str, timeout_s: &str) -> Output {
    nested_full(args, kvm_amd, None, Some(side), timeout_s)
}

/// The lines the side script printed (without their prefix).
pub fn side_lines(o: &Output) -> Vec<String> {
    stderr(o)
        .lines()
        .filter_map(|l| l.strip_prefix("nested-side: "))
        .map(str::to_string)
        .collect()
}

fn nested_full(
    args: &[&str],
    kvm_amd: Option<&str>,
    tap: Option<(&str, u16)>,
    side: Option<&str>,
    timeout_s: &str,
) -> Output {
    let _g = NESTED.lock().unwrap_or_else(|e| e.into_inner());
    require_qemu();
    let mut cmd = Command::new(repo_path("scripts/nested-run.sh"));
    cmd.args(["--timeout", timeout_s]);
    let side_file = side.map(|text| {
        let f = std::env::temp_dir().join(format!("ppa-nested-side-{}.sh", std::process::id()));
        std::fs::write(&f, text).expect("the side script is written");
        f
    });
    if let Some(f) = &side_file {
        cmd.arg("--side").arg(f);
    }
    match tap {
        Some((t, queues)) => {
            cmd.args(["--tap", t])
                .env("NESTED_TAP_QUEUES", queues.to_string());
        }
        None => {
            cmd.env_remove("NESTED_TAP_QUEUES");
        }
    }
    cmd.arg("--")
        .args(args)
        .env("PPA_VMM", env!("CARGO_BIN_EXE_ppa-vmm"));
    match kvm_amd {
        Some(p) => cmd.env("NESTED_KVM_AMD", p),
        None => cmd.env_remove("NESTED_KVM_AMD"),
    };
    let out = cmd.output().expect("scripts/nested-run.sh runs");
    if let Some(f) = side_file {
        let _ = std::fs::remove_file(f);
    }
    let code = out.status.code();
    assert!(
        !matches!(code, Some(124) | Some(125) | None),
        "the nested host failed (exit {code:?}), not ppa-vmm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn report(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "ppa-vmm's stdout in the nested host is not one JSON report ({e}); stderr: {}",
            stderr(o)
        )
    })
}

/// `KEY=VALUE` fields of the first console line starting with `tag`.
pub fn fields(console: &str, tag: &str) -> Vec<(String, String)> {
    console
        .lines()
        .find_map(|l| l.strip_prefix(tag))
        .unwrap_or_else(|| panic!("no {tag} line in the console:\n{console}"))
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn field(f: &[(String, String)], key: &str) -> u64 {
    f.iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric {key} in {f:?}"))
}

/// The Linux guest's console (its `[ttyS0] ` lines on stderr, without the prefix).
pub fn console(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter_map(|l| l.strip_prefix("[ttyS0] "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `KEY=VALUE` fields of the nested host's own line on stderr starting with `prefix` (after
/// `nested: `).
pub fn host_line(o: &Output, prefix: &str) -> Vec<(String, String)> {
    let err = stderr(o);
    let line = err
        .lines()
        .find_map(|l| {
            l.strip_prefix("nested: ")
                .and_then(|l| l.strip_prefix(prefix))
        })
        .unwrap_or_else(|| panic!("no `nested: {prefix}` line in stderr: {err}"));
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
