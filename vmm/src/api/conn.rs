//! The buffers of one client connection: request lines in, responses and events out.
//!
//! Data flow: the server appends whatever a non-blocking read returned to a [`LineBuffer`]
//! and takes complete lines from it; a line that grows past the limit without a newline is
//! reported once as too long and then skipped up to its newline, so a client cannot make the
//! server hold more than the limit. Responses and events go into an [`OutQueue`] that the
//! server drains as the socket accepts bytes. Events are dropped (and counted, and the
//! client told how many before the next one it gets) when the queue already holds more than
//! the event limit, so a client that does not read never makes the VMM wait or grow. Both
//! buffers give back memory beyond 16 KiB when they empty, so a connection that once held a
//! large answer does not keep its memory.

/// Request bytes kept while no newline has arrived.
#[derive(Debug, Default)]
pub struct LineBuffer {
    buf: Vec<u8>,
    /// Bytes of `buf` already taken as lines.
    start: usize,
    /// Prefix of `buf` known to have no newline after `start`.
    scanned: usize,
    discarding: bool,
}

/// What [`LineBuffer::next_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// A complete line, without its newline (nor a `\r` before it).
    Line(Vec<u8>),
    /// The line in progress is over the limit; the rest of it will be skipped.
    TooLong(usize),
    /// No complete line yet.
    Pending,
}

/// Capacity a buffer keeps when it empties; a larger one is given back.
const KEEP_CAPACITY: usize = 16 << 10;

impl LineBuffer {
    /// Appends bytes read from the socket.
    pub fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Whether the held bytes contain `pattern`.
    pub fn contains(&self, pattern: &[u8]) -> bool {
        self.buf[self.start..]
            .windows(pattern.len())
            .any(|w| w == pattern)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a complete line is waiting.
    pub fn has_line(&self) -> bool {
        self.buf[self.scanned.max(self.start)..].contains(&b'\n')
    }

    /// Whether a line has begun and its newline has not arrived (the tail of a line refused
    /// as too long included).
    pub fn partial(&self) -> bool {
        (self.discarding || !self.is_empty()) && !self.has_line()
    }

    /// The next line, with lines longer than `limit` refused.
    pub fn next_line(&mut self, limit: usize) -> Next {
        let from = self.scanned.max(self.start);
        match self.buf[from..].iter().position(|&b| b == b'\n') {
            Some(i) => {
                let end = from + i;
                let mut line = self.buf[self.start..end].to_vec();
                self.start = end + 1;
                self.scanned = self.start;
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if std::mem::take(&mut self.discarding) {
                    // The tail of a line already refused as too long.
                    return self.next_line(limit);
                }
                Next::Line(line)
            }
            None if self.len() > limit && !self.discarding => {
                let n = self.len();
                self.clear();
                self.discarding = true;
                Next::TooLong(n)
            }
            None => {
                if self.discarding || self.is_empty() {
                    self.clear();
                }
                self.scanned = self.buf.len();
                Next::Pending
            }
        }
    }

    fn clear(&mut self) {
        self.buf.clear();
        if self.buf.capacity() > KEEP_CAPACITY {
            self.buf = Vec::new();
        }
        self.start = 0;
        self.scanned = 0;
    }
}

/// Bytes waiting to be written to the client.
#[derive(Debug, Default)]
pub struct OutQueue {
    buf: Vec<u8>,
    pos: usize,
    dropped: u64,
    dropped_total: u64,
}

impl OutQueue {
    /// Bytes not yet written.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Number of bytes not yet written.
    pub fn len(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Whether everything was written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks `n` bytes as written.
    pub fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.buf.len());
        if self.pos == self.buf.len() {
            self.buf.clear();
            if self.buf.capacity() > KEEP_CAPACITY {
                // A large answer went out: give its memory back.
                self.buf = Vec::new();
            }
            self.pos = 0;
        } else if self.pos > 64 * 1024 && self.pos * 2 > self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }

    /// Queues a response line (always: the client asked for it, and the server answers no
    /// more of a client's requests while its queue is over `CLIENT_OUT_PAUSE`).
    pub fn push_response(&mut self, line: &str) {
        self.push_bytes(line.as_bytes());
    }

    /// Queues the rest of a response the socket did not take at once.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Queues an event line unless more than `limit` bytes are already waiting; then the
    /// event is dropped and counted. Before the next event that fits, a `dropped` event says
    /// how many were lost. Returns whether the event was queued.
    pub fn push_event(&mut self, line: &str, limit: usize) -> bool {
        if self.len() > limit {
            self.dropped += 1;
            self.dropped_total += 1;
            return false;
        }
        if self.dropped > 0 {
            let note = ppa_vmm_api::Event::Dropped {
                count: std::mem::take(&mut self.dropped),
            };
            self.buf.extend_from_slice(note.to_line().as_bytes());
        }
        self.buf.extend_from_slice(line.as_bytes());
        true
    }

    /// Events dropped over the connection's life.
    #[cfg(test)]
    pub fn dropped_total(&self) -> u64 {
        self.dropped_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(b: &mut LineBuffer, limit: usize) -> Vec<Next> {
        let mut out = Vec::new();
        loop {
            match b.next_line(limit) {
                Next::Pending => return out,
                n => out.push(n),
            }
        }
    }

    #[test]
    fn splits_lines_across_reads() {
        let mut b = LineBuffer::default();
        b.push(b"{\"cmd\":");
        assert_eq!(lines(&mut b, 100), vec![]);
        b.push(b"\"stats\"}\r\n{\"cmd\":\"version\"}\n{\"par");
        assert_eq!(
            lines(&mut b, 100),
            vec![
                Next::Line(b"{\"cmd\":\"stats\"}".to_vec()),
                Next::Line(b"{\"cmd\":\"version\"}".to_vec())
            ]
        );
        assert_eq!(b.len(), 5);
        b.push(b"tial\"}\n");
        assert_eq!(
            lines(&mut b, 100),
            vec![Next::Line(b"{\"partial\"}".to_vec())]
        );
        assert!(b.is_empty());
    }

    #[test]
    fn refuses_a_long_line_once_and_skips_its_tail() {
        let mut b = LineBuffer::default();
        b.push(&[b'x'; 60]);
        assert_eq!(lines(&mut b, 50), vec![Next::TooLong(60)]);
        // More of the same line: skipped without holding it.
        b.push(&[b'y'; 500]);
        assert_eq!(lines(&mut b, 50), vec![]);
        assert!(b.is_empty(), "the tail is not kept");
        b.push(b"yyy\nok\n");
        assert_eq!(lines(&mut b, 50), vec![Next::Line(b"ok".to_vec())]);
        // A long line that arrives whole with its newline is returned for the parser to
        // refuse by length.
        b.push(&[b'z'; 80]);
        b.push(b"\n");
        assert_eq!(lines(&mut b, 50), vec![Next::Line(vec![b'z'; 80])]);
    }

    #[test]
    fn drops_events_past_the_limit_and_says_so() {
        let mut q = OutQueue::default();
        q.push_response("r1\n");
        assert!(q.push_event("e1\n", 5));
        assert!(!q.push_event("e2\n", 5));
        assert!(!q.push_event("e3\n", 5));
        assert_eq!(q.pending(), b"r1\ne1\n");
        q.consume(6);
        assert!(q.is_empty());
        assert!(q.push_event("e4\n", 5));
        let text = String::from_utf8(q.pending().to_vec()).unwrap();
        assert_eq!(text, "{\"event\":\"dropped\",\"count\":2}\ne4\n");
        assert_eq!(q.dropped_total(), 2);
        // Responses are never dropped.
        q.push_response("r2\n");
        assert!(String::from_utf8(q.pending().to_vec())
            .unwrap()
            .ends_with("r2\n"));
    }

    #[test]
    fn partial_writes_keep_order() {
        let mut q = OutQueue::default();
        q.push_response("abcdef\n");
        q.consume(3);
        q.push_response("gh\n");
        assert_eq!(q.pending(), b"def\ngh\n");
        q.consume(100);
        assert!(q.is_empty());
    }
}
