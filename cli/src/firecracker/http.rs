//! The HTTP/1.1 of Firecracker's API socket: one request per connection, read whole (a head
//! of at most [`MAX_HEAD`] bytes, then a body of `Content-Length` bytes up to the payload
//! limit), one response out, then the connection closes. Firecracker's own server keeps
//! connections alive; clients reconnect after `Connection: close`, so nothing they see
//! differs.
//!
//! Data flow: the server ([`super::server`]) appends what a connection sends to its buffer and
//! asks [`parse`] whether a whole request is there yet; a [`Request`] goes to the API
//! ([`super::api`]), whose [`Response`] [`Response::to_bytes`] writes back. A malformed
//! request is an [`HttpError`], answered 400 with its sentence as the `fault_message`.

use thiserror::Error;

/// Longest request head (request line and headers).
pub const MAX_HEAD: usize = 8 << 10;
/// Firecracker's default limit on a request body (`--http-api-max-payload-size`).
pub const DEFAULT_MAX_PAYLOAD: usize = 51_200;

/// Why a request could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HttpError {
    /// The head is over [`MAX_HEAD`].
    #[error("The request head is over {MAX_HEAD} bytes.")]
    HeadTooLong,
    /// Not `METHOD TARGET HTTP/1.x`.
    #[error("The request line is not an HTTP/1.x request line.")]
    RequestLine,
    /// A header line without a colon, or a bad Content-Length.
    #[error("The request has a malformed header: {0}.")]
    Header(String),
    /// Chunked bodies are not read.
    #[error("Chunked request bodies are not supported; send a Content-Length.")]
    Chunked,
    /// The body is over the limit.
    #[error(
        "Request payload with size {size} is larger than the limit of {limit} allowed by server."
    )]
    TooLarge {
        /// Content-Length.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The method is not one the API knows.
    #[error("Invalid request method {0}.")]
    Method(String),
}

/// The methods of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET.
    Get,
    /// PUT.
    Put,
    /// PATCH.
    Patch,
}

impl Method {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
        }
    }
}

/// A whole request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Its method.
    pub method: Method,
    /// Its path, without a query.
    pub path: String,
    /// Its body (empty when there is none).
    pub body: Vec<u8>,
}

/// What a connection's bytes hold so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Not a whole request yet.
    Incomplete,
    /// A whole request.
    Done(Request),
}

/// The end of the head (just past its empty line), if it is there.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Reads one request from the start of `buf`, whose body may be at most `max_payload` bytes.
pub fn parse(buf: &[u8], max_payload: usize) -> Result<Parsed, HttpError> {
    let Some(end) = head_end(buf) else {
        return if buf.len() > MAX_HEAD {
            Err(HttpError::HeadTooLong)
        } else {
            Ok(Parsed::Incomplete)
        };
    };
    if end > MAX_HEAD {
        return Err(HttpError::HeadTooLong);
    }
    let head = std::str::from_utf8(&buf[..end - 4]).map_err(|_| HttpError::RequestLine)?;
    let mut lines = head.split("\r\n");
    let mut words = lines.next().unwrap_or_default().split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(HttpError::RequestLine);
    };
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0") || !target.starts_with('/') {
        return Err(HttpError::RequestLine);
    }
    let method = match method {
        "GET" => Method::Get,
        "PUT" => Method::Put,
        "PATCH" => Method::Patch,
        m => return Err(HttpError::Method(m.chars().take(16).collect())),
    };
    let mut length = 0usize;
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| HttpError::Header(line.chars().take(64).collect()))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value
                .parse()
                .map_err(|_| HttpError::Header(format!("Content-Length {value:?}")))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::Chunked);
        }
    }
    if length > max_payload {
        return Err(HttpError::TooLarge {
            size: length,
            limit: max_payload,
        });
    }
    if buf.len() < end + length {
        return Ok(Parsed::Incomplete);
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    Ok(Parsed::Done(Request {
        method,
        path: path.to_string(),
        body: buf[end..end + length].to_vec(),
    }))
}

/// A response: a status and, unless it is 204, a JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// 200, 204 or 400.
    pub status: u16,
    /// The JSON body (empty for 204).
    pub body: String,
}

impl Response {
    /// 204 No Content.
    pub fn no_content() -> Response {
        Response {
            status: 204,
            body: String::new(),
        }
    }

    /// 200 with `value` as its JSON body.
    pub fn ok<T: serde::Serialize>(value: &T) -> Response {
        Response {
            status: 200,
            body: serde_json::to_string(value).unwrap_or_default(),
        }
    }

    /// 400 with `{"fault_message": message}`.
    pub fn fault(message: impl Into<String>) -> Response {
        Response {
            status: 400,
            body: serde_json::to_string(&super::model::Fault {
                fault_message: message.into(),
            })
            .unwrap_or_default(),
        }
    }

    /// The whole response on the wire, closing the connection.
    pub fn to_bytes(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            204 => "No Content",
            _ => "Bad Request",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nServer: PPA-VMM Firecracker API\r\nConnection: close\r\n",
            self.status
        );
        if self.status != 204 {
            out.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                self.body.len()
            ));
        }
        out.push_str("\r\n");
        out.push_str(&self.body);
        out.into_bytes()
    }
}
