//! Bounding what a message repeats of its input: a name, a spec or a value that was refused
//! is quoted in the error that refuses it, and a quote of a 50 MB config value must not make
//! a 50 MB message (issue 28). Every error that quotes input (the VMM's config, limits and
//! workloads, the protocol's refusals, `ctl`) quotes it through [`clip`].
//!
//! Data flow: the error's `Display` calls [`clip`] on the quoted text; the messages that are
//! made elsewhere and may quote input whole (serde_json's) are cut with [`clip_middle`], which
//! keeps both ends (what was wrong, and where).

use std::borrow::Cow;

/// Bytes of quoted input a message keeps.
pub const QUOTE_MAX: usize = 200;

/// Bytes of a whole message [`clip_middle`] keeps.
pub const MESSAGE_MAX: usize = 1000;

/// The largest char boundary of `s` at or below `at`.
fn floor_boundary(s: &str, at: usize) -> usize {
    (0..=at.min(s.len()))
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0)
}

/// The smallest char boundary of `s` at or above `at`.
fn ceil_boundary(s: &str, at: usize) -> usize {
    (at.min(s.len())..=s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len())
}

/// `s` as a message quotes it: whole up to [`QUOTE_MAX`] bytes, else its first bytes (cut at a
/// character boundary), `…` and how long it was.
pub fn clip(s: &str) -> Cow<'_, str> {
    if s.len() <= QUOTE_MAX {
        return Cow::Borrowed(s);
    }
    let cut = floor_boundary(s, QUOTE_MAX);
    Cow::Owned(format!("{}… ({} bytes)", &s[..cut], s.len()))
}

/// A whole message cut to about [`MESSAGE_MAX`] bytes: its start and its end, with `… (N
/// bytes cut) …` between, so that what was wrong and where (`at line 1 column 9`) both stay.
pub fn clip_middle(s: &str) -> Cow<'_, str> {
    if s.len() <= MESSAGE_MAX {
        return Cow::Borrowed(s);
    }
    let head = floor_boundary(s, MESSAGE_MAX * 3 / 4);
    let tail = ceil_boundary(s, s.len() - MESSAGE_MAX / 4);
    Cow::Owned(format!(
        "{}… ({} bytes cut) …{}",
        &s[..head],
        tail - head,
        &s[tail..]
    ))
}

/// The error and each of its causes, joined into one line; each is cut to about
/// [`MESSAGE_MAX`] bytes (a message that quotes its input whole stays bounded).
pub fn describe(e: &dyn std::error::Error) -> String {
    let mut s = clip_middle(&e.to_string()).into_owned();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&clip_middle(&c.to_string()));
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_whole() {
        assert!(matches!(clip("busy:ms=5"), Cow::Borrowed("busy:ms=5")));
        let edge = "x".repeat(QUOTE_MAX);
        assert_eq!(clip(&edge), edge.as_str());
        assert!(matches!(clip_middle("short"), Cow::Borrowed("short")));
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let long = "é".repeat(1_000_000);
        let c = clip(&long);
        assert!(c.len() < QUOTE_MAX + 40, "{}", c.len());
        assert!(c.ends_with("… (2000000 bytes)"), "{c}");
        assert!(c.starts_with("éé"));
        let message = format!("start {long} at line 1 column 9");
        let m = clip_middle(&message);
        assert!(m.len() < MESSAGE_MAX + 60, "{}", m.len());
        assert!(m.starts_with("start éé"), "{m}");
        assert!(m.ends_with("é at line 1 column 9"), "{m}");
        assert!(m.contains(" bytes cut) …"), "{m}");
    }
}
