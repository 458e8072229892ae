//! Reading a request line: [`parse_request`], and the request's `id` as the client wrote it
//! ([`RequestId`]).
//!
//! Data flow: the line is checked for length, then read as JSON text without building values:
//! a pass over every object of the line refuses a key that appears twice in one object (with
//! serde_json's maps the last one would win, so `{"cmd":"version","cmd":"shutdown"}` would
//! smuggle a `shutdown` past a proxy that read the first), and the top-level members are kept
//! as their raw text. `id` stays raw, so the response echoes it byte for byte (a number keeps
//! every digit, `1.0` stays `1.0`); `cmd` is looked up in [`COMMANDS`]; the other members
//! become the [`Command`]'s arguments, checked by its serde derive (unknown ones refused).

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::{
    clip, clip_middle, Command, ErrorBody, ErrorKind, COMMANDS, LATER_COMMANDS, MAX_REQUEST_BYTES,
};

/// A request's `id`: any JSON value, kept as the exact text the client sent (`null` when the
/// request had none or could not be read), so that the response echoes it unchanged.
#[derive(Clone)]
pub struct RequestId(Box<RawValue>);

impl RequestId {
    /// The `null` id.
    pub fn null() -> Self {
        RequestId(raw("null"))
    }

    /// The id to echo for `text` as a request wrote it: the same bytes, less any line break
    /// between its tokens (a response is one line; JSON allows a raw CR or LF only as
    /// whitespace between tokens, never inside a string, so dropping them keeps the value and
    /// every other byte).
    fn echoed(text: &RawValue) -> Self {
        let t = text.get();
        if t.contains(['\n', '\r']) {
            RequestId(raw(&t.replace(['\n', '\r'], "")))
        } else {
            RequestId(text.to_owned())
        }
    }

    /// The id's JSON text, exactly as the client wrote it.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Whether the id is `null`.
    pub fn is_null(&self) -> bool {
        self.get() == "null"
    }

    /// The id as a JSON value (numbers beyond f64 lose digits: compare [`RequestId::get`]
    /// where that matters).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.get()).unwrap_or(Value::Null)
    }
}

/// A raw value from JSON text known to be valid.
fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_string()).unwrap_or_else(|_| raw("null"))
}

impl Default for RequestId {
    fn default() -> Self {
        RequestId::null()
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

/// Two ids are equal when their JSON text is.
impl PartialEq for RequestId {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for RequestId {}

/// An id equals a JSON value when it reads as that value.
impl PartialEq<Value> for RequestId {
    fn eq(&self, other: &Value) -> bool {
        self.to_value() == *other
    }
}

impl From<Value> for RequestId {
    fn from(v: Value) -> Self {
        RequestId(raw(&v.to_string()))
    }
}

impl From<u64> for RequestId {
    fn from(n: u64) -> Self {
        RequestId(raw(&n.to_string()))
    }
}

impl Serialize for RequestId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// Any JSON value: the schema says so.
impl schemars::JsonSchema for RequestId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RequestId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Any JSON value the client chose; the response echoes its exact text (null when the request had none or could not be read)."
        })
    }
}

impl<'de> Deserialize<'de> for RequestId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(d).map(RequestId)
    }
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The client's id, echoed in the response (null when absent).
    pub id: RequestId,
    /// What to do.
    pub command: Command,
}

impl Request {
    /// The request as one JSON line (without the newline): `id` first, as its exact text.
    pub fn to_line(&self) -> String {
        let cmd = serde_json::to_string(&self.command).unwrap_or_else(|_| "{}".into());
        // A command serialises as an object with at least its `cmd` member.
        let rest = cmd.strip_prefix('{').unwrap_or("}");
        format!("{{\"id\":{},{rest}", self.id.get())
    }
}

/// Accepts any JSON value, refusing a key that appears twice in one of its objects; the first
/// such key is left in the cell.
#[derive(Clone, Copy)]
struct NoDuplicateKeys<'c>(&'c RefCell<Option<String>>);

impl<'de> DeserializeSeed<'de> for NoDuplicateKeys<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NoDuplicateKeys<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            map.next_value_seed(self)?;
            if !seen.insert(key.clone()) {
                *self.0.borrow_mut() = Some(key);
                return Err(de::Error::custom("a key appears twice in one object"));
            }
        }
        Ok(())
    }
}

/// The top-level members of an object, in order, each as its raw text.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Members<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'a>, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    out.push((key, map.next_value::<&'a RawValue>()?));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

fn bad_json(message: impl Into<String>) -> (RequestId, ErrorBody) {
    (
        RequestId::null(),
        ErrorBody::new(ErrorKind::BadJson, message),
    )
}

/// Parses one request line (without its newline). On failure returns the request's id when
/// it could be read (else null), and the error to answer with.
pub fn parse_request(line: &[u8]) -> Result<Request, (RequestId, ErrorBody)> {
    match bare_command(line) {
        Some(command) => Ok(Request {
            id: RequestId::null(),
            command,
        }),
        None => parse_general(line),
    }
}

/// The command of a line that is exactly `{"cmd":"NAME"}` (around it only ASCII whitespace)
/// for a read-only command without arguments, the way a monitor polls: `stats` a thousand
/// times a second costs the guests the `api` thread's CPU (docs/design.md), and the general
/// parse's three passes, maps and allocations were about a quarter of that thread's samples.
/// Any other spelling (an `id`, spaces inside, escapes) takes the general path, which gives
/// the same result for these lines (tested).
pub(crate) fn bare_command(line: &[u8]) -> Option<Command> {
    let name = line
        .trim_ascii()
        .strip_prefix(b"{\"cmd\":\"")?
        .strip_suffix(b"\"}")?;
    Some(match name {
        b"stats" => Command::Stats {},
        b"version" => Command::Version {},
        b"threads" => Command::Threads {},
        b"groups" => Command::Groups {},
        b"guest" => Command::Guest {},
        b"metrics" => Command::Metrics {},
        _ => return None,
    })
}

/// [`parse_request`] for every line: syntax, repeated keys, the id, the command and its
/// arguments.
pub(crate) fn parse_general(line: &[u8]) -> Result<Request, (RequestId, ErrorBody)> {
    let (text, nested) = checked_json(line)?;
    let Members(members) = serde_json::from_str::<Members>(text).map_err(|e| {
        bad_json(format!(
            "the request is not valid JSON: {}",
            clip_middle(&e.to_string())
        ))
    })?;
    let id = match members.iter().filter(|(k, _)| k == "id").count() {
        1 => members
            .iter()
            .find(|(k, _)| k == "id")
            .map(|(_, v)| RequestId::echoed(v))
            .unwrap_or_default(),
        _ => RequestId::null(),
    };
    let mut seen = HashSet::new();
    if let Some((key, _)) = members.iter().find(|(k, _)| !seen.insert(k.as_str())) {
        return Err((
            id,
            ErrorBody::new(
                ErrorKind::BadRequest,
                format!(
                    "the request gives `{}` more than once; each member may appear once",
                    clip(key)
                ),
            ),
        ));
    }
    if let Some(key) = nested {
        return Err((
            id,
            ErrorBody::new(
                ErrorKind::BadRequest,
                format!(
                    "an object inside the request gives `{}` more than once; each key may appear once",
                    clip(&key)
                ),
            ),
        ));
    }
    command_of(&members)
        .map_err(|e| (id.clone(), e))
        .map(|command| Request { id, command })
}

/// The line as text once its length, encoding and JSON syntax are checked, with the first key
/// repeated inside a nested object, if any (the request's own members are checked later, once
/// the id is known).
fn checked_json(line: &[u8]) -> Result<(&str, Option<String>), (RequestId, ErrorBody)> {
    if line.len() > MAX_REQUEST_BYTES {
        return Err((
            RequestId::null(),
            ErrorBody::new(
                ErrorKind::TooLong,
                format!(
                    "the request is {} bytes long; the limit is {MAX_REQUEST_BYTES}",
                    line.len()
                ),
            ),
        ));
    }
    let text = std::str::from_utf8(line).map_err(|e| {
        bad_json(format!(
            "the request is not valid JSON: it is not UTF-8 (byte {} is not)",
            e.valid_up_to() + 1
        ))
    })?;
    // One pass checks the syntax and every object's keys; the cell tells a repeated key
    // apart from bad JSON.
    let repeated = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let checked = NoDuplicateKeys(&repeated)
        .deserialize(&mut de)
        .and_then(|()| de.end());
    let nested = match (checked, repeated.into_inner()) {
        (_, Some(key)) => Some(key),
        (Err(e), None) => {
            return Err(bad_json(format!(
                "the request is not valid JSON: {}",
                clip_middle(&e.to_string())
            )))
        }
        (Ok(()), None) => None,
    };
    if !text.trim_start().starts_with('{') {
        return Err(bad_json("the request is not a JSON object"));
    }
    Ok((text, nested))
}

/// The command the request's members name, with its arguments.
fn command_of(members: &[(String, &RawValue)]) -> Result<Command, ErrorBody> {
    let mut args = serde_json::Map::new();
    let mut cmd = None;
    for (key, raw) in members {
        match key.as_str() {
            "id" => {}
            "cmd" => cmd = Some(serde_json::from_str::<Value>(raw.get()).unwrap_or_default()),
            _ => {
                let v = serde_json::from_str(raw.get()).unwrap_or_default();
                args.insert(key.clone(), v);
            }
        }
    }
    let cmd = match cmd {
        Some(Value::String(s)) => s,
        Some(_) => {
            return Err(ErrorBody::new(
                ErrorKind::UnknownCommand,
                "`cmd` must be a string",
            ))
        }
        None => {
            return Err(ErrorBody::new(
                ErrorKind::UnknownCommand,
                "the request has no `cmd`",
            ))
        }
    };
    if !COMMANDS.contains(&cmd.as_str()) {
        let known = COMMANDS.join(", ");
        let message = if LATER_COMMANDS.contains(&cmd.as_str()) {
            format!(
                "the command `{}` is not available in this version (it has: {known})",
                clip(&cmd)
            )
        } else {
            format!("unknown command `{}` (known: {known})", clip(&cmd))
        };
        return Err(ErrorBody::new(ErrorKind::UnknownCommand, message));
    }
    args.insert("cmd".into(), Value::String(cmd.clone()));
    serde_json::from_value::<Command>(Value::Object(args)).map_err(|e| {
        ErrorBody::new(
            ErrorKind::BadRequest,
            format!("bad arguments for `{cmd}`: {}", clip_middle(&e.to_string())),
        )
    })
}
