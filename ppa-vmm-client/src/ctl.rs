//! `ppa-vmm ctl`: one request to the control socket, its result printed.
//!
//! Data flow: [`CtlOptions`] is the subcommand's arguments as clap parses them (its help lists
//! [`crate::commands::COMMANDS`]). [`parse_command`] refuses a command not in that table, turns
//! `COMMAND KEY=VALUE...` into a JSON object and validates it with
//! [`ppa_vmm_api::parse_request`], so a bad request is refused here with the message the server
//! would give; [`run`] sends it with a [`Client`] and prints the result as pretty JSON or, with
//! `text`, readably (raw strings, a table for `stats`, `key: value` lines for the rest). After
//! `subscribe` it copies every event line to stdout until the VMM closes the connection.

use std::io::{self, Write};
use std::path::PathBuf;

use ppa_vmm_api::{parse_request, Command, ErrorBody, GuestView, Stats};
use serde_json::{Map, Value};
use thiserror::Error;

use crate::commands;
use crate::guest_view::{guest_view_text, page_host_columns, HostColumns};
use crate::{describe, kind_name, Client};

/// Prefix of every message on stderr.
const PREFIX: &str = "ppa-vmm ctl";

/// Nanoseconds per millisecond.
const NS_PER_MS: f64 = 1e6;

/// Why the command line does not make a request.
#[derive(Debug, Error)]
pub enum CtlError {
    /// A command name the VMM does not know.
    #[error(
        "unknown command `{0}` (the commands are {names}; `{PREFIX} --help` describes them)",
        names = commands::names()
    )]
    UnknownCommand(String),
    /// An argument without `=`.
    #[error("the argument `{0}` is not of the form KEY=VALUE")]
    NotKeyValue(String),
    /// An argument with an empty key.
    #[error("the argument `{0}` has no key before `=`")]
    EmptyKey(String),
    /// A key the protocol reserves (`cmd`, `id`).
    #[error("`{0}` cannot be given as an argument: it is part of every request")]
    ReservedKey(String),
    /// The same key twice.
    #[error("the argument `{0}` is given more than once")]
    DuplicateKey(String),
    /// The request the server would refuse, with its message.
    #[error("{}", .0.message)]
    Refused(ErrorBody),
}

/// Options of `ppa-vmm ctl`, as clap parses them.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = commands::help())]
pub struct CtlOptions {
    /// The VMM's control socket (`run --api-sock`).
    #[arg(long, value_name = "PATH")]
    pub api_sock: PathBuf,
    /// Print a readable form instead of JSON.
    #[arg(long)]
    pub text: bool,
    /// The command (the list follows).
    pub command: String,
    /// Arguments as KEY=VALUE (e.g. `vcpu=0`, `level=full`, `events=vcpu-exit,threshold`).
    pub args: Vec<String>,
}

/// Builds the command `cmd` from `KEY=VALUE` arguments. A VALUE that parses as JSON (numbers,
/// `true`, `null`, arrays, quoted strings) is taken as that JSON, anything else as a string;
/// for `subscribe`, `events=a,b` is the array `["a", "b"]`. The result is checked as the
/// server checks a request line, after the name is looked up in [`commands::COMMANDS`].
pub fn parse_command(cmd: &str, args: &[String]) -> Result<Command, CtlError> {
    if commands::find(cmd).is_none() {
        return Err(CtlError::UnknownCommand(cmd.to_string()));
    }
    let mut map = Map::new();
    map.insert("cmd".into(), Value::String(cmd.to_string()));
    for arg in args {
        let Some((key, raw)) = arg.split_once('=') else {
            return Err(CtlError::NotKeyValue(arg.clone()));
        };
        if key.is_empty() {
            return Err(CtlError::EmptyKey(arg.clone()));
        }
        if key == "cmd" || key == "id" {
            return Err(CtlError::ReservedKey(key.to_string()));
        }
        if map.contains_key(key) {
            return Err(CtlError::DuplicateKey(key.to_string()));
        }
        map.insert(key.to_string(), parse_value(cmd, key, raw));
    }
    let line = Value::Object(map).to_string();
    parse_request(line.as_bytes())
        .map(|r| r.command)
        .map_err(|(_, body)| CtlError::Refused(body))
}

/// One argument value: JSON when it parses, else a string (a comma list for `events`).
fn parse_value(cmd: &str, key: &str, raw: &str) -> Value {
    if let Ok(v) = serde_json::from_str::<Value>(raw) {
        return v;
    }
    if cmd == "subscribe" && key == "events" {
        return Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_string()))
                .collect(),
        );
    }
    Value::String(raw.to_string())
}

/// Runs `ppa-vmm ctl`: 0 on success, 1 when the VMM refused the request, 2 on a usage or
/// connection error. Messages go to stderr, results to stdout.
pub fn run(opts: CtlOptions) -> i32 {
    run_to(opts, &mut io::stdout().lock(), &mut io::stderr().lock())
}

/// [`run`] with its streams given (for tests).
pub(crate) fn run_to(opts: CtlOptions, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let command = match parse_command(&opts.command, &opts.args) {
        Ok(c) => c,
        Err(e) => return fail(err, 2, &describe(&e)),
    };
    let subscribe = matches!(command, Command::Subscribe { .. });
    let mut client = match Client::connect(&opts.api_sock) {
        Ok(c) => c,
        Err(e) => return fail(err, 2, &describe(&e)),
    };
    let response = match client.call(command) {
        Ok(r) => r,
        Err(e) => return fail(err, 2, &describe(&e)),
    };
    if !response.ok {
        let message = match &response.error {
            Some(e) => format!("{}: {}", kind_name(e.kind), e.message),
            None => "the VMM refused the request without saying why".to_string(),
        };
        return fail(err, 1, &message);
    }
    let result = response.result.unwrap_or(Value::Null);
    let text = if subscribe && !opts.text {
        // One line, so that stdout stays JSON Lines with the events that follow.
        format!("{result}\n")
    } else if opts.text {
        to_text(&opts.command, &result)
    } else {
        let pretty = serde_json::to_string_pretty(&result).unwrap_or_else(|_| result.to_string());
        format!("{pretty}\n")
    };
    if let Err(e) = write_flush(out, &text) {
        return write_failed(err, &e);
    }
    if subscribe {
        return stream_events(&mut client, out, err);
    }
    0
}

/// Copies event lines to `out` until the VMM closes the connection.
fn stream_events(client: &mut Client, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    if let Err(e) = client.set_read_timeout(None) {
        return fail(err, 2, &describe(&e));
    }
    loop {
        match client.next_line() {
            Ok(Some(line)) => {
                if let Err(e) = write_flush(out, &format!("{line}\n")) {
                    return write_failed(err, &e);
                }
            }
            Ok(None) => return 0,
            Err(e) if e.is_closed() => return 0,
            Err(e) => return fail(err, 2, &describe(&e)),
        }
    }
}

fn write_flush(out: &mut dyn Write, s: &str) -> io::Result<()> {
    out.write_all(s.as_bytes())?;
    out.flush()
}

/// A failed write to stdout: quiet when the reader went away (`ctl ... | head`).
fn write_failed(err: &mut dyn Write, e: &io::Error) -> i32 {
    if e.kind() == io::ErrorKind::BrokenPipe {
        return 0;
    }
    fail(err, 2, &format!("cannot write to stdout: {e}"))
}

/// Prints `ppa-vmm ctl: MESSAGE` to `err` and returns `code`.
fn fail(err: &mut dyn Write, code: i32, message: &str) -> i32 {
    // Nothing more can be done when stderr itself fails.
    let _ = writeln!(err, "{PREFIX}: {message}");
    code
}

/// The readable form of a result: a string raw, `stats` and `guest` as tables, anything else as
/// flattened `key: value` lines.
pub(crate) fn to_text(command: &str, result: &Value) -> String {
    if let Value::String(s) = result {
        let mut s = s.clone();
        if !s.ends_with('\n') {
            s.push('\n');
        }
        return s;
    }
    if command == "stats" {
        if let Ok(stats) = serde_json::from_value::<Stats>(result.clone()) {
            return stats_table(&stats);
        }
    }
    if command == "guest" {
        if let Ok(g) = serde_json::from_value::<GuestView>(result.clone()) {
            let host = page_host_columns(&g);
            let text = guest_view_text(
                &g,
                &HostColumns {
                    names: ["USED host", "LMTD host", "STEAL host"],
                    values: &host,
                    reset: &g.host_reset,
                },
            );
            return if text.is_empty() {
                "the guest has published nothing\n".to_string()
            } else {
                text
            };
        }
    }
    let mut lines = Vec::new();
    flatten("", result, &mut lines);
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

/// Appends `prefix: value` lines for every leaf of `v` (object keys and array indexes joined
/// with `.`).
fn flatten(prefix: &str, v: &Value, lines: &mut Vec<String>) {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, child) in map {
                flatten(&join(k), child, lines);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, child) in items.iter().enumerate() {
                flatten(&join(&i.to_string()), child, lines);
            }
        }
        _ => {
            let value = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if prefix.is_empty() {
                lines.push(value);
            } else {
                lines.push(format!("{prefix}: {value}"));
            }
        }
    }
}

/// Milliseconds with 3 decimals.
fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / NS_PER_MS)
}

/// `stats` as text: the VM line, then one row per vCPU. IDLE is idle + halted, so that
/// USED + STEAL + IDLE + LMTD + PAUSED adds up to WALL (docs/accounting.md).
pub(crate) fn stats_table(stats: &Stats) -> String {
    let vm = &stats.vm;
    let mut s = format!(
        "vm {}  pid {}  state {}  level {}  vcpus {}  uptime {} ms  host threads {} ms\n",
        vm.name,
        vm.pid,
        vm.state,
        vm.level,
        vm.vcpus,
        ms(vm.uptime_ns),
        ms(vm.host_threads_ns)
    );
    let header = [
        "VCPU",
        "TID",
        "STATE",
        "WALL_MS",
        "USED_MS",
        "GUEST_MS",
        "VMM_MS",
        "STEAL_MS",
        "IDLE_MS",
        "LMTD_MS",
        "PAUSED_MS",
        "EXITS",
    ];
    let rows: Vec<Vec<String>> = stats
        .vcpus
        .iter()
        .map(|v| {
            vec![
                v.id.to_string(),
                v.host_tid.to_string(),
                v.state.to_string(),
                ms(v.wall_ns),
                ms(v.used_ns),
                ms(v.guest_ns),
                ms(v.vmm_ns),
                ms(v.steal_ns),
                ms(v.idle_ns.saturating_add(v.halted_ns)),
                ms(v.limited_ns),
                ms(v.paused_ns),
                v.total_exits().to_string(),
            ]
        })
        .collect();
    let widths: Vec<usize> = header
        .iter()
        .enumerate()
        .map(|(i, h)| rows.iter().map(|r| r[i].len()).fold(h.len(), usize::max))
        .collect();
    let line = |cells: &[String]| {
        let mut l = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            // The state is a word: left-aligned; the rest are numbers.
            if i == 2 {
                l.push_str(&format!("{c:<w$}"));
            } else {
                l.push_str(&format!("{c:>w$}"));
            }
        }
        l.trim_end().to_string()
    };
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    s.push_str(&line(&header));
    s.push('\n');
    for r in &rows {
        s.push_str(&line(r));
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{stats, vcpu, FakeServer};
    use ppa_vmm_api::{ErrorKind, EventKind, HistogramFormat, Level, Response};

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_commands_and_values() {
        assert_eq!(parse_command("stats", &[]).unwrap(), Command::Stats {});
        assert_eq!(
            parse_command("vcpu", &args(&["vcpu=0"])).unwrap(),
            Command::Vcpu { vcpu: 0 }
        );
        assert_eq!(
            parse_command("set-level", &args(&["level=full"])).unwrap(),
            Command::SetLevel { level: Level::Full }
        );
        assert_eq!(
            parse_command("histogram", &args(&["name=guest_run", "format=text"])).unwrap(),
            Command::Histogram {
                name: "guest_run".into(),
                vcpu: None,
                format: HistogramFormat::Text
            }
        );
        assert_eq!(
            parse_command(
                "set-thresholds",
                &args(&["guest_run_ns=5000", "steal_window_ns=null"])
            )
            .unwrap(),
            Command::SetThresholds {
                exit_handling_ns: None,
                guest_run_ns: Some(5000),
                wakeup_latency_ns: None,
                steal_window_ns: None
            }
        );
    }

    #[test]
    fn subscribe_takes_json_or_comma_lists() {
        let both = Command::Subscribe {
            events: vec![EventKind::VcpuExit, EventKind::Threshold],
        };
        assert_eq!(
            parse_command("subscribe", &args(&[r#"events=["vcpu-exit","threshold"]"#])).unwrap(),
            both
        );
        assert_eq!(
            parse_command("subscribe", &args(&["events=vcpu-exit,threshold"])).unwrap(),
            both
        );
        assert_eq!(
            parse_command("subscribe", &args(&["events=vm-exit"])).unwrap(),
            Command::Subscribe {
                events: vec![EventKind::VmExit]
            }
        );
        assert_eq!(
            parse_command("subscribe", &[]).unwrap(),
            Command::Subscribe { events: vec![] }
        );
        assert!(parse_command("subscribe", &args(&["events=vcpu-exit,bogus"])).is_err());
    }

    fn refused(cmd: &str, a: &[&str]) -> ErrorBody {
        match parse_command(cmd, &args(a)) {
            Err(CtlError::Refused(body)) => body,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn refuses_an_unknown_command_with_the_list() {
        let e = parse_command("frobnicate", &args(&["x=1"])).unwrap_err();
        assert!(matches!(e, CtlError::UnknownCommand(_)), "{e:?}");
        let msg = e.to_string();
        assert!(msg.starts_with("unknown command `frobnicate`"), "{msg}");
        assert!(
            msg.contains("version, stats,") && msg.contains("set-limit, groups, guest,"),
            "{msg}"
        );
        assert!(msg.contains("ppa-vmm ctl --help"), "{msg}");
    }

    #[test]
    fn refuses_what_the_server_would() {
        let e = refused("vcpu", &["vcpu=abc"]);
        assert_eq!(e.kind, ErrorKind::BadRequest);
        assert!(e.message.contains("invalid type"), "{e:?}");
        let e = refused("vcpu", &["vcpu=-1"]);
        assert_eq!(e.kind, ErrorKind::BadRequest);
        let e = refused("stats", &["foo=1"]);
        assert!(e.message.contains("unknown field `foo`"), "{e:?}");
        let e = refused("vcpu", &[]);
        assert!(e.message.contains("missing field `vcpu`"), "{e:?}");
        let e = refused("set-level", &["level=max"]);
        assert_eq!(e.kind, ErrorKind::BadRequest);
        // The message is the server's, word for word.
        let line = r#"{"cmd":"vcpu","vcpu":"abc"}"#;
        let server = parse_request(line.as_bytes()).unwrap_err().1;
        assert_eq!(refused("vcpu", &["vcpu=abc"]), server);
    }

    #[test]
    fn refuses_malformed_arguments() {
        assert!(matches!(
            parse_command("vcpu", &args(&["vcpu"])),
            Err(CtlError::NotKeyValue(_))
        ));
        assert!(matches!(
            parse_command("vcpu", &args(&["=1"])),
            Err(CtlError::EmptyKey(_))
        ));
        assert!(matches!(
            parse_command("stats", &args(&["cmd=vcpu"])),
            Err(CtlError::ReservedKey(_))
        ));
        assert!(matches!(
            parse_command("vcpu", &args(&["vcpu=0", "vcpu=1"])),
            Err(CtlError::DuplicateKey(_))
        ));
    }

    #[test]
    fn text_forms() {
        let raw = to_text("metrics", &Value::String("a 1\nb 2".into()));
        assert_eq!(raw, "a 1\nb 2\n");
        let flat = to_text(
            "version",
            &serde_json::json!({"version": "0.1.0", "api": 1, "x": {"y": [true, null]}}),
        );
        assert_eq!(flat, "api: 1\nversion: 0.1.0\nx.y.0: true\nx.y.1: null\n");
        let s = stats(&[vcpu(0, 1_000_000_000, 250_000_000, &[("io_out", 7)])], 1);
        let table = to_text("stats", &serde_json::to_value(&s).unwrap());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[0].starts_with("vm test"), "{table}");
        assert!(lines[1].contains("USED_MS") && lines[1].contains("EXITS"));
        assert!(lines[2].contains("1000.000") && lines[2].contains("250.000"));
        assert!(lines[2].ends_with(" 7"), "{table}");
    }

    fn opts(sock: &std::path::Path, command: &str, a: &[&str], text: bool) -> CtlOptions {
        CtlOptions {
            api_sock: sock.to_path_buf(),
            command: command.into(),
            args: args(a),
            text,
        }
    }

    #[test]
    fn run_prints_results_and_errors() {
        let server = FakeServer::start(|req, _| {
            vec![Response::ok(req.id, serde_json::json!({"version": "x"})).to_line()]
        });
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_to(
            opts(server.path(), "version", &[], true),
            &mut out,
            &mut err,
        );
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
        assert_eq!(String::from_utf8_lossy(&out), "version: x\n");

        let server = FakeServer::start(|req, _| {
            let body = ErrorBody::new(ErrorKind::NoSuchVcpu, "the VM has no vCPU 9 (it has 1)");
            vec![Response::err(req.id, body).to_line()]
        });
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_to(
            opts(server.path(), "vcpu", &["vcpu=9"], false),
            &mut out,
            &mut err,
        );
        assert_eq!(code, 1);
        assert_eq!(
            String::from_utf8_lossy(&err),
            "ppa-vmm ctl: no-such-vcpu: the VM has no vCPU 9 (it has 1)\n"
        );

        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_to(
            opts(server.path(), "vcpu", &["vcpu=x"], false),
            &mut out,
            &mut err,
        );
        assert_eq!(code, 2);
        assert!(String::from_utf8_lossy(&err).starts_with("ppa-vmm ctl: bad arguments"));

        let missing = server.path().with_file_name("none.sock");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_to(opts(&missing, "stats", &[], false), &mut out, &mut err);
        assert_eq!(code, 2);
        let msg = String::from_utf8_lossy(&err);
        assert!(msg.contains("there is no control socket at") && msg.contains("--api-sock"));
    }

    #[test]
    fn subscribe_streams_until_close() {
        let server = FakeServer::start(|req, _| {
            vec![
                Response::ok(req.id, serde_json::json!({"events": ["vm-exit"]})).to_line(),
                "{\"event\":\"vm-exit\",\"uptime_ns\":5,\"end\":\"completed\"}\n".to_string(),
            ]
        });
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let o = opts(server.path(), "subscribe", &["events=vm-exit"], false);
        let code = run_to(o, &mut out, &mut err);
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
        assert_eq!(
            String::from_utf8_lossy(&out),
            "{\"events\":[\"vm-exit\"]}\n{\"event\":\"vm-exit\",\"uptime_ns\":5,\"end\":\"completed\"}\n"
        );
    }
}
