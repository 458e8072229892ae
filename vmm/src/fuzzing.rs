//! The check functions of the fuzz targets (fuzz/, docs/fuzzing.md): one per parser of
//! untrusted input. Not part of the VMM's API: compiled for the unit tests, and for the fuzz
//! crate with the `fuzzing` feature.
//!
//! Data flow: each function takes the raw bytes that libFuzzer (or a seed or regression file)
//! gives, runs one parser the way the VMM runs it, and asserts properties of what comes out,
//! panicking with a sentence when one fails: a round trip through the display form where one
//! exists, bounds on the output, agreement with the input. `fuzz/fuzz_targets/NAME.rs` calls
//! the function that [`TARGETS`] names NAME; the unit test at the bottom replays every file of
//! `fuzz/seeds/NAME/` and `fuzz/regressions/NAME/` through the same function, so an input
//! that once failed is checked by every `cargo test`, on stable Rust, with no fuzzing engine.

use std::cell::RefCell;
use std::sync::Arc;

use ppa_vmm_api::{parse_request, Command, ErrorKind, Response, MAX_REQUEST_BYTES};
use serde_json::Value;

use crate::api::board::Board;
use crate::api::conn::LineBuffer;
use crate::api::handler::{Handler, Outcome};
use crate::api::http::{self, http_reply, Head, MAX_HTTP_HEAD};
use crate::config::{RunOptions, MAX_VCPUS};
use crate::limits::overload::{Action, OverloadConfig};
use crate::limits::{check_groups, check_name, GroupSpec, Limit, MAX_PERIOD_NS, MIN_PERIOD_NS};
use crate::payload::tiny::workload::{resolve, Assignment, Spec, VcpuWorkload, WorkloadError};
use crate::payload::Payload;

mod blk;
pub mod blkmodel;
pub mod driver;
pub mod netmodel;
mod ppa_page;
mod virtqueue;

pub use blk::blk;
pub use ppa_page::{ppa_page, ppa_page_words};
pub use virtqueue::virtqueue;

/// A check function: the input, as libFuzzer or a file gives it.
pub type Check = fn(&[u8]);

/// Every fuzz target: its name (the file `fuzz/fuzz_targets/NAME.rs` and the folders of its
/// seeds and regressions) and its check function.
pub const TARGETS: [(&str, Check); 8] = [
    ("request", request),
    ("config", config),
    ("workload", workload),
    ("limit", limit),
    ("http_head", http_head),
    ("ppa_page", ppa_page),
    ("virtqueue", virtqueue),
    ("blk", blk),
];

/// A handler over a synthetic VM of two vCPUs that never ran (no KVM), with no `stats` reuse.
fn synthetic_handler() -> Handler {
    Handler::with_board(
        crate::api::tests_support::handle(2),
        0,
        Arc::new(Board::default()),
    )
}

/// A control-socket request line, as the server hands it over (`Handler::handle_line`).
///
/// Properties: a line [`parse_request`] accepts is a JSON object within the length limit,
/// whose id is the object's `id` member, and [`ppa_vmm_api::Request::to_line`] of the result
/// parses back to the same request; a refused line gets the error class its fault calls for,
/// with a message bounded by the input. Through the handler, on a synthetic VM: exactly one
/// response line, a [`Response`] whose `ok` agrees with `result` and `error`, the request's
/// id echoed, and a refused request answered with the parser's error.
pub fn request(data: &[u8]) {
    let parsed = parse_request(data);
    match &parsed {
        Ok(req) => {
            assert!(data.len() <= MAX_REQUEST_BYTES, "an over-long line parsed");
            let v: Value = serde_json::from_slice(data).expect("a parsed request is JSON");
            let id = v.get("id").cloned().unwrap_or(Value::Null);
            assert_eq!(req.id, id, "the id is not the object's `id` member");
            let line = req.to_line();
            match parse_request(line.as_bytes()) {
                Ok(again) => assert_eq!(&again, req, "{line} parses to another request"),
                Err((_, e)) => panic!("{line}, the display form of a request, is refused: {e:?}"),
            }
        }
        Err((id, e)) => {
            let too_long = data.len() > MAX_REQUEST_BYTES;
            assert_eq!(e.kind == ErrorKind::TooLong, too_long, "{e:?}");
            assert!(
                matches!(
                    e.kind,
                    ErrorKind::TooLong
                        | ErrorKind::BadJson
                        | ErrorKind::UnknownCommand
                        | ErrorKind::BadRequest
                ),
                "the parser answers {:?}",
                e.kind
            );
            if matches!(e.kind, ErrorKind::TooLong | ErrorKind::BadJson) {
                assert_eq!(*id, Value::Null, "an id read from an unreadable request");
            }
            assert!(
                e.message.len() <= 2 * data.len().min(MAX_REQUEST_BYTES) + 1024,
                "a {}-byte message for a {}-byte request",
                e.message.len(),
                data.len()
            );
        }
    }
    // Bounded: a request over the limit is refused before any parsing, so the handler's run
    // is not repeated for those (the server never hands it more).
    if data.len() > MAX_REQUEST_BYTES {
        return;
    }
    // A refused request never reaches the VM: one handler serves them all (making a VM
    // costs more than the rest of the check). One that runs gets a VM of its own, so that a
    // failure never depends on the inputs before it.
    let outcome = if parsed.is_ok() {
        synthetic_handler().handle_line(data)
    } else {
        thread_local! {
            static REFUSER: RefCell<Handler> = RefCell::new(synthetic_handler());
        }
        REFUSER.with(|h| h.borrow_mut().handle_line(data))
    };
    let (line, mask) = match &outcome {
        Outcome::Subscribe(_, m, _) => (outcome.line(), Some(*m)),
        _ => (outcome.line(), None),
    };
    assert!(
        line.ends_with('\n') && line.matches('\n').count() == 1,
        "not one line: {line:?}"
    );
    let resp: Response = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("the response {line:?} is not a Response: {e}"));
    assert_eq!(resp.ok, resp.result.is_some(), "{line}");
    assert_eq!(resp.ok, resp.error.is_none(), "{line}");
    match parsed {
        Ok(req) => {
            assert_eq!(resp.id, req.id, "the id is not echoed: {line}");
            match (&req.command, mask) {
                (Command::Subscribe { .. }, Some(m)) => assert_ne!(m, 0, "subscribed to nothing"),
                (Command::Subscribe { .. }, None) => panic!("subscribe answered without a stream"),
                (_, Some(_)) => panic!("{:?} started a stream", req.command),
                (_, None) => {}
            }
        }
        Err((id, e)) => {
            assert!(
                !resp.ok && mask.is_none(),
                "a refused request succeeded: {line}"
            );
            assert_eq!(resp.id, id, "{line}");
            assert_eq!(resp.error, Some(e), "{line}");
        }
    }
}

/// A config file (`--config`, [`RunOptions::from_json`]), then the checks of `ppa-vmm run`
/// ([`RunOptions::into_config`]).
///
/// Properties: options merge with empty options to themselves, either way round; a config
/// that passes the checks is in range (vCPUs, memory, name, run time, histogram bits), its
/// limits and groups fit the VM, its detection rules are in range and its workloads resolve
/// to one per vCPU, each of which round-trips through its display form; every error, and
/// the chain of its sources, displays.
pub fn config(data: &[u8]) {
    // `from_file` reads the file into a String: bytes that are not UTF-8 stop there.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let opts = match RunOptions::from_json(text) {
        Ok(o) => o,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    assert!(opts.config.is_none(), "a config file named another");
    assert_eq!(opts.clone().merge(RunOptions::default()), opts);
    assert_eq!(RunOptions::default().merge(opts.clone()), opts);
    let (vm, _report) = match opts.into_config() {
        Ok(c) => c,
        Err(e) => {
            let mut source: Option<&dyn std::error::Error> = Some(&e);
            while let Some(s) = source {
                assert!(!s.to_string().is_empty(), "an empty error message");
                source = s.source();
            }
            return;
        }
    };
    vm.validate().expect("a checked config validates");
    assert!((1..=MAX_VCPUS).contains(&vm.vcpus));
    if let Some(n) = &vm.name {
        assert!(!n.is_empty() && n.chars().count() <= 128 && !n.chars().any(char::is_control));
    }
    if let Some(d) = vm.max_runtime {
        assert!(!d.is_zero(), "a zero run time");
    }
    check_groups(&vm.limits.groups, vm.vcpus).expect("checked groups");
    for g in &vm.limits.groups {
        assert_limit(&g.limit, g.vcpus.len());
    }
    if let Some((l, _)) = &vm.limits.vm {
        assert_limit(l, vm.vcpus);
    }
    if let Some(ns) = vm.overload.runaway_ns {
        assert!(
            (1_000_000..=3_600_000_000_000).contains(&ns),
            "runaway {ns} ns"
        );
    }
    if let Some((per_mille, windows)) = vm.overload.overload {
        assert!((1..=1000).contains(&per_mille) && (1..=10_000).contains(&windows));
    }
    if let Payload::Tiny { workloads, .. } = &vm.payload {
        match resolve(workloads, vm.vcpus) {
            Ok(w) => {
                assert_eq!(w.len(), vm.vcpus, "one workload per vCPU");
                w.iter().for_each(round_trip_workload);
            }
            Err(e @ WorkloadError::NoSuchVcpu { index, vcpus }) => {
                assert!(index >= vcpus, "{e}");
            }
            Err(e) => panic!("resolving checked workloads failed: {e}"),
        }
    }
}

/// A limit a VM accepted: a quota above zero, a period in range, no more than `members` can
/// use, and a canonical `QUOTA ns/PERIOD ns` form that parses to itself.
fn assert_limit(l: &Limit, members: usize) {
    assert!(l.quota_ns > 0, "{l:?} gives no time");
    assert!(
        (MIN_PERIOD_NS..=MAX_PERIOD_NS).contains(&l.period_ns),
        "{l:?}: period out of range"
    );
    assert!(l.check_members("", members).is_ok(), "{l:?} over {members}");
    assert!(l.percent().is_finite() && l.percent() > 0.0);
    let canonical = format!("{}ns/{}ns", l.quota_ns, l.period_ns);
    assert_eq!(
        Limit::parse(&canonical).as_ref(),
        Ok(l),
        "{canonical} parses to another limit"
    );
}

/// One vCPU's workload displays as a spec that parses to it, for all vCPUs and for its own.
fn round_trip_workload(w: &VcpuWorkload) {
    let text = w.to_string();
    let a = Assignment::parse(&text)
        .unwrap_or_else(|e| panic!("`{text}`, the display form of {w:?}, is refused: {e}"));
    assert_eq!(
        (a.target, a.spec, a.publish),
        (None, Spec::One(w.workload), w.publish),
        "`{text}` parses to another workload"
    );
    let targeted = format!("3={text}");
    let a = Assignment::parse(&targeted).unwrap_or_else(|e| panic!("`{targeted}`: {e}"));
    assert_eq!((a.target, a.spec), (Some(3), Spec::One(w.workload)));
    let desc = w.to_desc();
    let no_publish = desc.flags & ppa_guest_abi::workload::FLAG_NO_PUBLISH != 0;
    assert_eq!(no_publish, !w.publish, "the publish flag of {w:?}");
}

/// A workload spec (`--workload`, the config file's `workload`).
///
/// Properties: an accepted spec gives every vCPU a workload that round-trips through its
/// display form (the form the report prints), with or without a target; resolving it over a
/// VM either gives one workload per vCPU or names a vCPU the VM does not have.
pub fn workload(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let a = match Assignment::parse(text) {
        Ok(a) => a,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    for i in 0..4 {
        round_trip_workload(&VcpuWorkload {
            workload: a.spec.for_vcpu(i),
            publish: a.publish,
        });
    }
    for vcpus in [1, 4, MAX_VCPUS] {
        match resolve(&[a], vcpus) {
            Ok(w) => {
                assert_eq!(w.len(), vcpus);
                if let Some(t) = a.target {
                    assert_eq!(w[t].workload, a.spec.for_vcpu(t));
                    assert_eq!(w[t].publish, a.publish);
                }
            }
            Err(e) => {
                assert!(matches!(e, WorkloadError::NoSuchVcpu { index, .. }
                        if Some(index) == a.target && index >= vcpus));
                assert!(!e.to_string().is_empty());
            }
        }
    }
}

/// The limit syntaxes: a CPU limit (`--cpu-limit`, `set-limit`), a vCPU group
/// (`--vcpu-group`), an overload action, an overload rule and a runaway threshold, each given
/// the same text.
///
/// Properties: a limit that some VM could accept (at most [`MAX_VCPUS`] CPUs) has a canonical
/// form that parses to itself; a group has a valid name, members in ascending order, and a
/// canonical form that parses to the same group; an action and a rule display as text that
/// parses back to them; every value is in its documented range.
pub fn limit(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Limit::parse(text) {
        Ok(l) => {
            assert!(l.quota_ns > 0, "{text}: no time");
            assert!((MIN_PERIOD_NS..=MAX_PERIOD_NS).contains(&l.period_ns));
            if l.check_members(text, MAX_VCPUS).is_ok() {
                assert_limit(&l, MAX_VCPUS);
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    match GroupSpec::parse(text) {
        Ok(g) => {
            check_name(&g.name).expect("an accepted group name");
            assert!(!g.vcpus.is_empty(), "a group without members");
            assert!(g.vcpus.windows(2).all(|w| w[0] < w[1]), "{:?}", g.vcpus);
            assert_limit(&g.limit, g.vcpus.len());
            let members: Vec<String> = g.vcpus.iter().map(usize::to_string).collect();
            let canonical = format!(
                "{}:{}:{}ns/{}ns",
                g.name,
                members.join(","),
                g.limit.quota_ns,
                g.limit.period_ns
            );
            let again = GroupSpec::parse(&canonical)
                .unwrap_or_else(|e| panic!("{canonical}, the form of {g:?}, is refused: {e}"));
            assert_eq!(
                (&again.name, &again.vcpus, again.limit),
                (&g.name, &g.vcpus, g.limit)
            );
            if g.vcpus.last().is_some_and(|&v| v < MAX_VCPUS) {
                check_groups(std::slice::from_ref(&g), MAX_VCPUS).expect("one group fits");
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    match Action::parse(text) {
        Ok(a) => {
            if let Action::Throttle(l, _) = &a {
                assert_limit(l, 1);
            }
            let name = a.name();
            assert_eq!(Action::parse(&name).as_ref(), Ok(&a), "{name}");
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    match OverloadConfig::parse(None, Some(text), None) {
        Ok(c) => {
            let (per_mille, windows) = c.overload.expect("a rule was given");
            assert!((1..=1000).contains(&per_mille) && (1..=10_000).contains(&windows));
            let shown = format!("{}:{windows}", per_mille as f64 / 10.0);
            let again = OverloadConfig::parse(None, Some(&shown), None)
                .unwrap_or_else(|e| panic!("{shown}: {e}"));
            assert_eq!(again.overload, c.overload, "{shown}");
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    if let Ok(ms) = text.trim().parse::<f64>() {
        match OverloadConfig::parse(Some(ms), None, None) {
            Ok(c) => {
                let ns = c.runaway_ns.expect("a threshold was given");
                assert!(
                    (1_000_000..=3_600_000_000_000).contains(&ns),
                    "{ms} ms: {ns} ns"
                );
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}

/// Whether `bytes` hold an empty line after a line (the end of an HTTP head), with `\n` or
/// `\r\n` line ends.
fn has_blank_line(bytes: &[u8]) -> bool {
    bytes.windows(2).any(|w| w == b"\n\n") || bytes.windows(3).any(|w| w == b"\n\r\n")
}

/// An HTTP request head on the metrics port, arriving in pieces: the first byte chooses the
/// size of the reads (1 byte to 16 KiB, and at least a 256th of the input, so that a long
/// input costs no more than 256 reads), the rest is what the client sends. The loop is the
/// server's (`Serve::answer` on an HTTP connection): after each read, a complete head is
/// answered, and a head longer than [`MAX_HTTP_HEAD`], or a buffer past it without one, is
/// refused.
///
/// Properties: a head is taken exactly when the bytes read hold its end (unless it is too
/// long, and only then is it refused); the request target
/// is the first line, `\r` removed; the reply is a whole HTTP/1.1 response whose
/// `Content-Length` is its body's and whose head has only the server's own lines (nothing of
/// the request is echoed); `200` only for `GET` or `HEAD` of `/metrics` in HTTP/1.x (a `HEAD`
/// answer without its body).
pub fn http_head(data: &[u8]) {
    let Some((&first, sent)) = data.split_first() else {
        return;
    };
    let step = (1usize << (first % 15)).max(sent.len().div_ceil(256));
    let mut input = LineBuffer::default();
    let mut read = 0usize;
    let mut ended = false;
    for chunk in sent.chunks(step) {
        input.push(chunk);
        // Whether the bytes read so far hold the head's end, looking at the new ones only.
        ended = ended || has_blank_line(&sent[read.saturating_sub(2)..read + chunk.len()]);
        read += chunk.len();
        let held = input.len();
        match http::http_head(&mut input) {
            Head::Complete(target) => {
                let so_far = &sent[..read];
                assert!(ended, "a head taken before its end");
                let line = so_far.split(|&b| b == b'\n').next().unwrap_or_default();
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                assert_eq!(target, String::from_utf8_lossy(line), "not the first line");
                // The reply only reads the VM: one handler serves every input.
                thread_local! {
                    static SERVER: RefCell<Handler> = RefCell::new(synthetic_handler());
                }
                let reply = SERVER.with(|h| http_reply(&target, &mut h.borrow_mut()));
                check_http_reply(&target, &reply);
                return;
            }
            Head::TooLarge => {
                assert!(held > MAX_HTTP_HEAD, "a head of {held} bytes refused");
                return;
            }
            Head::Pending => assert!(
                !ended,
                "a complete head was not taken: {:?}",
                String::from_utf8_lossy(&sent[..read])
            ),
        }
    }
}

fn check_http_reply(target: &str, reply: &str) {
    let (head, body) = reply.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines: Vec<&str> = head.split("\r\n").collect();
    let status = lines[0].strip_prefix("HTTP/1.1 ").expect("a status line");
    assert!(
        ["200 ", "400 ", "404 ", "405 ", "505 "]
            .iter()
            .any(|s| status.starts_with(s)),
        "{status}"
    );
    if status.starts_with("405 ") {
        assert_eq!(lines.remove(1), "Allow: GET, HEAD", "{head:?}");
    }
    assert_eq!(
        lines.len(),
        4,
        "the response head has other lines: {head:?}"
    );
    let method = target.split(' ').next().unwrap_or_default();
    assert!(lines[1].starts_with("Content-Type: "));
    let length: usize = lines[2]
        .strip_prefix("Content-Length: ")
        .and_then(|l| l.parse().ok())
        .expect("a Content-Length");
    if method == "HEAD" && status.starts_with("200 ") {
        assert!(body.is_empty(), "a body after HEAD");
    } else {
        assert_eq!(length, body.len());
    }
    assert_eq!(lines[3], "Connection: close");
    if status.starts_with("200 ") {
        let words: Vec<&str> = target.split(' ').collect();
        assert_eq!(words.len(), 3, "{target}");
        assert!(["GET", "HEAD"].contains(&words[0]), "{target}");
        assert!(words[2].starts_with("HTTP/1."), "{target}");
        let path = words[1].split(['?', '#']).next().unwrap_or_default();
        assert!(path.ends_with("/metrics"), "{target}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn files(dir: &Path) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut v: Vec<PathBuf> = entries
            .map(|e| e.expect("a directory entry").path())
            .filter(|p| p.is_file())
            .collect();
        v.sort();
        v
    }

    /// Every seed and every saved crash of every target through its check function: what the
    /// fuzzers once found stays fixed.
    #[test]
    fn seeds_and_regressions_replay() {
        let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
        let mut declared: Vec<String> = files(&fuzz.join("fuzz_targets"))
            .iter()
            .filter_map(|p| Some(p.file_stem()?.to_str()?.to_string()))
            .collect();
        declared.sort();
        let mut names: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
        names.sort();
        assert_eq!(declared, names, "fuzz/fuzz_targets/ and TARGETS disagree");
        for (name, check) in TARGETS {
            let seeds = files(&fuzz.join("seeds").join(name));
            assert!(!seeds.is_empty(), "target {name} has no seed");
            for path in seeds
                .iter()
                .chain(&files(&fuzz.join("regressions").join(name)))
            {
                eprintln!("replaying {}", path.display());
                check(&std::fs::read(path).expect("a readable input"));
            }
        }
    }

    /// The properties can fail: inputs that break them are caught.
    #[test]
    fn the_checks_catch_what_they_claim() {
        assert!(has_blank_line(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(has_blank_line(b"GET / HTTP/1.1\n\r\n"));
        assert!(!has_blank_line(b"GET / HTTP/1.1\r\nHost: x\r\n"));
        let caught = |f: fn()| std::panic::catch_unwind(f).is_err();
        assert!(caught(|| check_http_reply(
            "GET /x HTTP/1.1",
            "HTTP/1.1 200 OK\r\n\r\n"
        )));
        assert!(caught(|| check_http_reply(
            "GET /x HTTP/1.1",
            &crate::api::http::http_response("200 OK", "text/plain", "body")
        )));
        check_http_reply(
            "GET /metrics?x HTTP/1.1",
            &crate::api::http::http_response("200 OK", "text/plain", "body"),
        );
        assert!(caught(|| assert_limit(
            &Limit {
                quota_ns: 5,
                period_ns: 10
            },
            1
        )));
    }
}
