//! `ppa-vmm ctl`: one request to the control socket, its result printed.
//!
//! Data flow: [`CtlOptions`] is the subcommand's arguments as clap parses them (its help lists
//! [`crate::commands::COMMANDS`]). [`parse_command`] refuses a command not in that table, turns
//! `COMMAND KEY=VALUE...` into a JSON object and validates it with
//! [`ppa_vmm_api::parse_request`], so a bad request is refused here with the message the server
//! would give; [`run`] sends it with a [`Client`] and prints the result as pretty JSON or, with
//! `text`, readably (raw strings, tables for `stats`, `groups` and `set-limit`, `key: value`
//! lines for the rest). After `subscribe` it copies every event line to stdout until the VMM
//! closes the connection; it also subscribes to `vm-exit` (shown only when asked for) so that
//! it can tell the VM's end (exit 0) from a VMM that was killed ([`crate::EXIT_VMM_LOST`]).

use std::io::{self, Write};
use std::path::PathBuf;

use ppa_vmm_api::{
    parse_request, Command, ErrorBody, EventKind, GroupStats, GuestView, HistogramFormat, Stats,
};
use serde_json::{Map, Value};
use thiserror::Error;

use crate::commands;
use crate::guest_view::{guest_view_text, page_host_columns, HostColumns};
use crate::{describe, kind_name, Client, EXIT_VMM_LOST, VMM_LOST};

/// Prefix of every message on stderr.
const PREFIX: &str = "ppa-vmm ctl";

/// Nanoseconds per millisecond.
const NS_PER_MS: f64 = 1e6;

/// Why the command line does not make a request.
#[derive(Debug, Error)]
pub enum CtlError {
    /// A command name the VMM does not know.
    #[error(
        "unknown command `{q}` (the commands are {names}; `{PREFIX} --help` describes them)",
        q = ppa_vmm_api::clip(.0),
        names = commands::names()
    )]
    UnknownCommand(String),
    /// An argument without `=`.
    #[error("the argument `{q}` is not of the form KEY=VALUE", q = ppa_vmm_api::clip(.0))]
    NotKeyValue(String),
    /// An argument with an empty key.
    #[error("the argument `{q}` has no key before `=`", q = ppa_vmm_api::clip(.0))]
    EmptyKey(String),
    /// A key the protocol reserves (`cmd`, `id`).
    #[error("`{q}` cannot be given as an argument: it is part of every request", q = ppa_vmm_api::clip(.0))]
    ReservedKey(String),
    /// The same key twice.
    #[error("the argument `{q}` is given more than once", q = ppa_vmm_api::clip(.0))]
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

/// One argument value: JSON when it parses, else a string (a comma list for `events`). The
/// value of a key that only takes text ([`commands::TEXT_ARGS`]) is that text, so that
/// `limit=150` reaches the server as the limit `150` and is refused as `run --cpu-limit 150`
/// is, not as a number where a string was expected.
fn parse_value(cmd: &str, key: &str, raw: &str) -> Value {
    if let Ok(v) = serde_json::from_str::<Value>(raw) {
        if commands::TEXT_ARGS.contains(&key) && (v.is_number() || v.is_boolean()) {
            return Value::String(raw.to_string());
        }
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
/// connection error, 3 when a `subscribe` stream ended without the VM ending (the VMM was
/// killed). Messages go to stderr, results to stdout.
pub fn run(opts: CtlOptions) -> i32 {
    run_to(opts, &mut io::stdout().lock(), &mut io::stderr().lock())
}

/// [`run`] with its streams given (for tests).
pub(crate) fn run_to(opts: CtlOptions, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let mut command = match parse_command(&opts.command, &opts.args) {
        Ok(c) => c,
        Err(e) => return fail(err, 2, &describe(&e)),
    };
    // One switch gives a histogram's text form: `--text` asks for it (unless `format` is
    // given), and `format=text` prints it as text without `--text`.
    let mut raw_text = false;
    if let Command::Histogram { format, .. } = &mut command {
        if opts.text && !opts.args.iter().any(|a| a.starts_with("format=")) {
            *format = HistogramFormat::Text;
        }
        raw_text = *format == HistogramFormat::Text;
    }
    let subscribe = matches!(command, Command::Subscribe { .. });
    // The vm-exit event tells the VM's end from a lost VMM: ask for it too, show it only when
    // it was asked for.
    let mut hide_vm_exit = false;
    if let Command::Subscribe { events, .. } = &mut command {
        if !events.is_empty() && !events.contains(&EventKind::VmExit) {
            events.push(EventKind::VmExit);
            hide_vm_exit = true;
        }
    }
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
    let mut result = response.result.unwrap_or(Value::Null);
    if hide_vm_exit {
        if let Some(Value::Array(kinds)) = result.get_mut("events") {
            kinds.retain(|k| k != "vm-exit");
        }
    }
    let text = if subscribe && !opts.text {
        // One line, so that stdout stays JSON Lines with the events that follow.
        format!("{result}\n")
    } else if opts.text || (raw_text && result.is_string()) {
        to_text(&opts.command, &result)
    } else {
        let pretty = serde_json::to_string_pretty(&result).unwrap_or_else(|_| result.to_string());
        format!("{pretty}\n")
    };
    if let Err(e) = write_flush(out, &text) {
        return write_failed(err, &e);
    }
    if subscribe {
        return stream_events(&mut client, hide_vm_exit, out, err);
    }
    0
}

/// Copies event lines to `out` (the vm-exit event only unless `hide_vm_exit`) until the VMM
/// closes the connection: 0 when the VM ended first, [`EXIT_VMM_LOST`] when it did not.
fn stream_events(
    client: &mut Client,
    hide_vm_exit: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    if let Err(e) = client.set_read_timeout(None) {
        return fail(err, 2, &describe(&e));
    }
    loop {
        match client.next_line() {
            Ok(Some(line)) => {
                let was_end = client.vm_end().is_some();
                if hide_vm_exit && was_end && line.contains("\"vm-exit\"") {
                    continue;
                }
                if let Err(e) = write_flush(out, &format!("{line}\n")) {
                    return write_failed(err, &e);
                }
            }
            Ok(None) => break,
            Err(e) if e.is_closed() => break,
            Err(e) => return fail(err, 2, &describe(&e)),
        }
    }
    match client.vm_end() {
        Some(_) => 0,
        None => fail(err, EXIT_VMM_LOST, VMM_LOST),
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
            let mut t = stats_table(&stats);
            t.push_str(&crate::devices::devices_text(&stats.devices));
            return t;
        }
    }
    if command == "device" {
        if let Ok(d) = serde_json::from_value::<ppa_vmm_api::DeviceStats>(result.clone()) {
            return crate::devices::devices_text(std::slice::from_ref(&d));
        }
    }
    if command == "groups" || command == "set-limit" {
        if let Ok(groups) = serde_json::from_value::<Vec<GroupStats>>(result.clone()) {
            return groups_table(&groups);
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
/// with `.`). A histogram's `slots` list is one line with its length (the JSON form has them).
fn flatten(prefix: &str, v: &Value, lines: &mut Vec<String>) {
    if let (Some("slots"), Value::Array(slots)) = (prefix.rsplit('.').next(), v) {
        lines.push(format!(
            "{prefix}: {} non-empty (listed in the JSON form)",
            slots.len()
        ));
        return;
    }
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

/// Microseconds with 1 decimal.
fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

/// `groups` (and the result of `set-limit`) as text: one line per limit with what it did, and
/// its overshoot histogram summarised (count, mean, p50, p99, max) rather than slot by slot.
pub(crate) fn groups_table(groups: &[GroupStats]) -> String {
    if groups.is_empty() {
        return "no CPU limits\n".to_string();
    }
    let header = [
        "GROUP",
        "VCPUS",
        "LIMIT",
        "BACKEND",
        "PERIODS",
        "THROTTLED",
        "USED_MS",
        "USED%",
        "STOPS",
        "STOPS_MS",
        "LMTD_MS",
        "OVERSHOOTS",
        "MEAN_US",
        "P50_US",
        "P99_US",
        "MAX_US",
    ];
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            let over = &g.overshoot;
            let pct = g
                .used_percent()
                .map_or("-".to_string(), |p| format!("{p:.2}"));
            let vcpus: Vec<String> = g.vcpus.iter().map(usize::to_string).collect();
            vec![
                g.name.clone(),
                vcpus.join(","),
                g.limit.clone(),
                g.backend.to_string(),
                g.periods.to_string(),
                g.throttled_periods.to_string(),
                ms(g.used_ns),
                pct,
                g.stops.count.to_string(),
                ms(g.stops.total_ns()),
                ms(g.limited_ns),
                over.count.to_string(),
                us(over.avg),
                us(over.p50),
                us(over.p99),
                us(g.overshoot_max_ns.max(over.max)),
            ]
        })
        .collect();
    let widths: Vec<usize> = header
        .iter()
        .enumerate()
        .map(|(i, h)| rows.iter().map(|r| r[i].len()).fold(h.len(), usize::max))
        .collect();
    let line = |cells: Vec<String>| {
        let mut l = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            // Name, members, limit and backend are words: left-aligned.
            if i < 4 {
                l.push_str(&format!("{c:<w$}"));
            } else {
                l.push_str(&format!("{c:>w$}"));
            }
        }
        l.trim_end().to_string() + "\n"
    };
    let mut s = line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        s.push_str(&line(r));
    }
    s.push_str(
        "USED is what the limit charged: the members' CPU less their STOPS' cost, STOPS_MS, which \
         the VMM pays outside the quota (their CPU from each stop to the next guest entry, and \
         the KVM round trips they forced, an estimate); USED% is of one CPU over the completed \
         periods; OVERSHOOTS counts the periods whose use passed the quota, MEAN/P50/P99/MAX \
         are of how far (used - quota).\n",
    );
    for g in groups {
        if let Some(line) = g.kicks.stages.as_ref().map(|st| st.summary()) {
            s.push_str(&format!("stop stages of {}: {line}\n", g.name));
        }
    }
    s
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
        "BLKD_MS",
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
                ms(v.blocked_ns),
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
mod tests;
