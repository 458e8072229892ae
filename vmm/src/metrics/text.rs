//! The text exposition format 0.0.4: metric families collected sample by sample, then written
//! once each (`# HELP`, `# TYPE`, samples), with label escaping and exact decimal seconds.
//!
//! Data flow: [`Families::new`] declares every family of a rendering in output order (from a
//! table of [`Decl`]s); the collectors [`Families::add`] samples (or whole histograms with
//! [`Families::add_histogram`]) in any order, each written at once into its family's text;
//! [`Families::render`] joins the families that got a sample. Nothing here knows what a VM is.

use std::collections::HashMap;
use std::fmt::{self, Display, Write as _};

use super::buckets::Buckets;

/// The metric type of a family (the `# TYPE` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (restarts at a `reset` or a process restart); the name ends in `_total`.
    Counter,
    /// Any value.
    Gauge,
    /// `_bucket{le=...}` (cumulative), `_sum` and `_count` samples.
    Histogram,
}

impl Kind {
    /// The word of the `# TYPE` line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One family's declaration: name, type and `# HELP` text.
#[derive(Debug, Clone, Copy)]
pub struct Decl {
    /// Family name (for a counter, with `_total`).
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its `# HELP` text.
    pub help: &'static str,
}

/// One metric family while it is being collected: its sample lines, written as they come.
struct Family {
    decl: Decl,
    body: String,
}

/// The families of one rendering, in output order.
pub struct Families {
    list: Vec<Family>,
    index: HashMap<&'static str, usize>,
}

impl Families {
    /// Every family of `decls`, in that order, without samples.
    pub fn new(decls: &[Decl]) -> Families {
        let mut f = Families {
            list: Vec::with_capacity(decls.len()),
            index: HashMap::with_capacity(decls.len()),
        };
        for d in decls {
            debug_assert!(
                (d.kind == Kind::Counter) == d.name.ends_with("_total"),
                "{} and its type disagree",
                d.name
            );
            let old = f.index.insert(d.name, f.list.len());
            debug_assert!(old.is_none(), "{} declared twice", d.name);
            f.list.push(Family {
                decl: *d,
                body: String::new(),
            });
        }
        f
    }

    /// The declared family `name` of type `kind`. A sample of an undeclared family is a bug
    /// the unit tests catch (every family of the table gets a sample there); in a running VMM
    /// it is left out rather than taking the process down.
    fn family(&mut self, name: &str, kind: Kind) -> Option<&mut Family> {
        let family = self.index.get(name).map(|&i| &mut self.list[i]);
        debug_assert!(
            family.as_ref().is_some_and(|f| f.decl.kind == kind),
            "metric family {name} is not declared as a {}",
            kind.name()
        );
        family.filter(|f| f.decl.kind == kind)
    }

    /// Adds a sample to the declared counter or gauge `name`. `labels` are (name, raw value)
    /// pairs.
    pub fn add(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        let kind = if name.ends_with("_total") {
            Kind::Counter
        } else {
            Kind::Gauge
        };
        if let Some(family) = self.family(name, kind) {
            sample(&mut family.body, name, "", labels, None, value);
        }
    }

    /// Adds one histogram (its buckets, `_sum` and `_count`) to the declared histogram family
    /// `name`, with `labels` on every sample (and `le` last on the buckets).
    pub fn add_histogram(&mut self, name: &str, labels: &[(&str, &str)], b: &Buckets) {
        let Some(family) = self.family(name, Kind::Histogram) else {
            return;
        };
        let body = &mut family.body;
        for (le, count) in b.cumulative() {
            let le = match le {
                Some(ns) => Seconds(ns).to_string(),
                None => "+Inf".to_string(),
            };
            sample(body, name, "_bucket", labels, Some(&le), count);
        }
        sample(body, name, "_sum", labels, None, Seconds(b.sum_ns));
        sample(body, name, "_count", labels, None, b.count);
    }

    /// The exposition text: each family with samples, once.
    pub fn render(&self) -> String {
        let size = self.list.iter().map(|f| f.body.len() + 200).sum();
        let mut out = String::with_capacity(size);
        for f in self.list.iter().filter(|f| !f.body.is_empty()) {
            let name = f.decl.name;
            // Writing to a String cannot fail.
            let _ = writeln!(out, "# HELP {name} {}", escape_help(f.decl.help));
            let _ = writeln!(out, "# TYPE {name} {}", f.decl.kind.name());
            out.push_str(&f.body);
        }
        out
    }
}

/// Appends the line `NAME SUFFIX {labels,le} value`.
fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[(&str, &str)],
    le: Option<&str>,
    value: impl Display,
) {
    out.push_str(name);
    out.push_str(suffix);
    write_labels(out, labels, le);
    // Writing to a String cannot fail.
    let _ = writeln!(out, " {value}");
}

/// Appends `{name="value",...}` with each value escaped, and `le="..."` last when given.
fn write_labels(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    out.push('{');
    let le = le.map(|v| ("le", v));
    for (i, (name, value)) in labels.iter().chain(le.as_ref()).enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        push_escaped(out, value);
        out.push('"');
    }
    out.push('}');
}

/// `{name="value",...}` with each value escaped, and `le="..."` last when given.
#[cfg(test)]
pub fn label_set(labels: &[(&str, &str)], le: Option<&str>) -> String {
    let mut s = String::new();
    write_labels(&mut s, labels, le);
    s
}

/// Appends a label value escaped: backslash, double quote and line feed, as the format
/// requires.
fn push_escaped(out: &mut String, v: &str) {
    if !v.contains(['\\', '"', '\n']) {
        out.push_str(v);
        return;
    }
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Escapes a label value: backslash, double quote and line feed, as the format requires.
#[cfg(test)]
pub fn escape_label_value(v: &str) -> String {
    let mut s = String::new();
    push_escaped(&mut s, v);
    s
}

/// Escapes `# HELP` text: backslash and line feed (a double quote stays as it is there).
pub fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Nanoseconds shown as exact decimal seconds: `1_500_000_000` → `1.5`, `0` → `0`.
#[derive(Debug, Clone, Copy)]
pub struct Seconds(pub u64);

impl Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / 1_000_000_000;
        let mut frac = self.0 % 1_000_000_000;
        if frac == 0 {
            return write!(f, "{whole}");
        }
        // Nine digits with the trailing zeros dropped.
        let mut width = 9;
        while frac % 10 == 0 {
            frac /= 10;
            width -= 1;
        }
        write!(f, "{whole}.{frac:0width$}")
    }
}

/// Signed nanoseconds shown as exact decimal seconds.
#[derive(Debug, Clone, Copy)]
pub struct SignedSeconds(pub i64);

impl Display for SignedSeconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 < 0 {
            f.write_str("-")?;
        }
        Seconds(self.0.unsigned_abs()).fmt(f)
    }
}

/// `Seconds(ns)` as text.
#[cfg(test)]
pub fn seconds(ns: u64) -> String {
    Seconds(ns).to_string()
}

/// `SignedSeconds(ns)` as text.
#[cfg(test)]
pub fn seconds_signed(ns: i64) -> String {
    SignedSeconds(ns).to_string()
}
