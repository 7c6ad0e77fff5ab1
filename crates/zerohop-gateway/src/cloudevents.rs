//! CloudEvents over HTTP (CloudEvents 1.0, HTTP protocol binding).
//!
//! - **Binary mode** needs nothing of the gateway: the attributes are `ce-*` headers, which
//!   reach a function that lists them (`headers: [ce-type, ce-source]`), and a function answers
//!   with an event by adding `ce-*` response headers.
//! - **Structured mode** (`Content-Type: application/cloudevents+json`): [`unwrap`] turns the
//!   JSON event into what binary mode would have carried: the data is the body (the one copy
//!   into the slot is of the data alone), the attributes `ce-*` headers and `datacontenttype`
//!   the `Content-Type`, so a function cannot tell the two modes apart. If it answers with
//!   `ce-*` response headers, [`wrap`] answers in structured mode too.
//! - **Batch mode** (`application/cloudevents-batch+json`) is refused with 415.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, StatusCode};
use serde_json::{Map, Value};

use crate::{ErrorSource, GatewayError};

/// The media type of a structured event.
pub(crate) const STRUCTURED: &str = "application/cloudevents+json";
const BATCH: &str = "application/cloudevents-batch+json";

/// How a request's `Content-Type` asks to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Not a structured event (plain, or binary mode).
    Plain,
    /// A structured event, to unwrap.
    Structured,
}

/// The mode `headers` ask for; a batch is refused.
pub(crate) fn mode(headers: &HeaderMap) -> Result<Mode, GatewayError> {
    let Some(t) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return Ok(Mode::Plain);
    };
    let essence = t.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case(STRUCTURED) {
        Ok(Mode::Structured)
    } else if essence.eq_ignore_ascii_case(BATCH) {
        Err(bad(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "CloudEvents batch mode is not supported; send one event per request",
        ))
    } else {
        Ok(Mode::Plain)
    }
}

/// A structured event's data, with its attributes written into `headers` as binary mode
/// carries them (`ce-NAME`, and `Content-Type` from `datacontenttype`).
pub(crate) fn unwrap(body: &[u8], headers: &mut HeaderMap) -> Result<Bytes, GatewayError> {
    let invalid = |why: String| {
        bad(
            StatusCode::BAD_REQUEST,
            format!("invalid CloudEvent: {why}"),
        )
    };
    let event: Map<String, Value> =
        serde_json::from_slice(body).map_err(|e| invalid(format!("not a JSON object: {e}")))?;
    match event.get("specversion").and_then(Value::as_str) {
        Some("1.0") => {}
        Some(v) => return Err(invalid(format!("specversion {v}; only 1.0 is supported"))),
        None => return Err(invalid("no specversion".into())),
    }
    for required in ["id", "source", "type"] {
        match event.get(required) {
            Some(Value::String(s)) if !s.is_empty() => {}
            _ => return Err(invalid(format!("`{required}` must be a non-empty string"))),
        }
    }
    let content_type = event.get("datacontenttype").and_then(Value::as_str);
    let data = match (event.get("data"), event.get("data_base64")) {
        (Some(_), Some(_)) => return Err(invalid("both `data` and `data_base64`".into())),
        (None, None) => Bytes::new(),
        (None, Some(Value::String(b))) => Bytes::from(
            STANDARD
                .decode(b)
                .map_err(|e| invalid(format!("data_base64: {e}")))?,
        ),
        (None, Some(_)) => return Err(invalid("data_base64 must be a string".into())),
        (Some(d), None) => match d {
            // Text data of a non-JSON type travels as the string's bytes; JSON as JSON.
            Value::String(s) if !content_type.is_none_or(is_json) => Bytes::from(s.clone()),
            other => Bytes::from(other.to_string()),
        },
    };
    headers.remove(CONTENT_TYPE);
    let content_type = match content_type {
        Some(t) => Some(t),
        None if event.contains_key("data") => Some("application/json"),
        None => None,
    };
    if let Some(t) = content_type {
        let v = HeaderValue::from_str(t).map_err(|_| invalid("datacontenttype".into()))?;
        headers.insert(CONTENT_TYPE, v);
    }
    for (name, value) in &event {
        if matches!(name.as_str(), "data" | "data_base64" | "datacontenttype") {
            continue;
        }
        let valid_name = !name.is_empty()
            && name.len() <= 20
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !valid_name {
            return Err(invalid(format!(
                "attribute name `{}` is not 1 to 20 lower-case letters and digits",
                name.chars().take(40).collect::<String>()
            )));
        }
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Bool(_) | Value::Number(_) => value.to_string(),
            _ => {
                return Err(invalid(format!(
                    "attribute `{name}` is not a string, number or boolean"
                )))
            }
        };
        let header = HeaderName::from_bytes(format!("ce-{name}").as_bytes())
            .map_err(|_| invalid(format!("attribute `{name}`")))?;
        let v = HeaderValue::from_str(&text)
            .map_err(|_| invalid(format!("attribute `{name}` holds a control character")))?;
        headers.insert(header, v);
    }
    Ok(data)
}

/// The answer to a structured request: when the functions answered with `ce-*` headers, one
/// structured event (those attributes, the `Content-Type` as `datacontenttype`, the body as
/// `data`, or `data_base64` when it is neither JSON nor text); otherwise the answer as it is.
/// Returns the new body and headers, or `None` to leave the answer alone.
pub(crate) fn wrap(
    body: &[u8],
    headers: &[(HeaderName, HeaderValue)],
    route_type: Option<&HeaderValue>,
) -> Option<(Bytes, Vec<(HeaderName, HeaderValue)>)> {
    if !headers.iter().any(|(n, _)| n.as_str().starts_with("ce-")) {
        return None;
    }
    let mut event = Map::new();
    event.insert("specversion".into(), Value::String("1.0".into()));
    let mut rest = Vec::new();
    let mut content_type = route_type.and_then(|v| v.to_str().ok()).map(str::to_owned);
    for (name, value) in headers {
        if let Some(attr) = name.as_str().strip_prefix("ce-") {
            if let Ok(v) = value.to_str() {
                event.insert(attr.to_owned(), Value::String(v.to_owned()));
            }
        } else if *name == CONTENT_TYPE {
            content_type = value.to_str().ok().map(str::to_owned);
        } else {
            rest.push((name.clone(), value.clone()));
        }
    }
    let json = content_type.as_deref().is_none_or(is_json);
    match (json, std::str::from_utf8(body)) {
        (true, _) if body.is_empty() => {}
        (true, _) => match serde_json::from_slice::<Value>(body) {
            Ok(v) => {
                event.insert("data".into(), v);
            }
            Err(_) => {
                event.insert("data_base64".into(), Value::String(STANDARD.encode(body)));
            }
        },
        (false, Ok(text))
            if content_type
                .as_deref()
                .is_some_and(|t| t.starts_with("text/")) =>
        {
            event.insert("data".into(), Value::String(text.to_owned()));
        }
        _ => {
            event.insert("data_base64".into(), Value::String(STANDARD.encode(body)));
        }
    }
    if let Some(t) = content_type {
        event.insert("datacontenttype".into(), Value::String(t));
    }
    rest.push((
        CONTENT_TYPE,
        HeaderValue::from_static("application/cloudevents+json; charset=utf-8"),
    ));
    Some((Bytes::from(Value::Object(event).to_string()), rest))
}

/// A JSON media type: `application/json` or `*/*+json`.
fn is_json(t: &str) -> bool {
    let essence = t
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

fn bad(status: StatusCode, message: impl Into<String>) -> GatewayError {
    GatewayError::new(status, ErrorSource::Gateway, message)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn unwrapped(event: Value) -> Result<(Bytes, HeaderMap), GatewayError> {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(STRUCTURED));
        let body = unwrap(event.to_string().as_bytes(), &mut h)?;
        Ok((body, h))
    }

    #[test]
    fn a_structured_event_becomes_what_binary_mode_carries() {
        let (body, h) = unwrapped(json!({"specversion": "1.0", "id": "1", "source": "/s",
            "type": "order.created", "subject": "o-7", "count": 3,
            "datacontenttype": "application/json", "data": {"order": 7}}))
        .unwrap();
        assert_eq!(&body[..], br#"{"order":7}"#);
        assert_eq!(h["ce-type"], "order.created");
        assert_eq!(h["ce-id"], "1");
        assert_eq!(h["ce-count"], "3");
        assert_eq!(h[CONTENT_TYPE], "application/json");
        let (body, h) = unwrapped(json!({"specversion": "1.0", "id": "1", "source": "/s",
            "type": "t", "datacontenttype": "text/plain", "data": "hello"}))
        .unwrap();
        assert_eq!(
            (&body[..], &h[CONTENT_TYPE]),
            (&b"hello"[..], &HeaderValue::from_static("text/plain"))
        );
        let (body, h) = unwrapped(json!({"specversion": "1.0", "id": "1", "source": "/s",
            "type": "t", "data_base64": "AAEC"}))
        .unwrap();
        assert_eq!(&body[..], &[0, 1, 2]);
        assert!(h.get(CONTENT_TYPE).is_none());
    }

    #[test]
    fn events_missing_what_the_spec_requires_are_400() {
        for (event, why) in [
            (
                json!({"id": "1", "source": "/s", "type": "t"}),
                "no specversion",
            ),
            (
                json!({"specversion": "0.3", "id": "1", "source": "/s", "type": "t"}),
                "only 1.0",
            ),
            (
                json!({"specversion": "1.0", "source": "/s", "type": "t"}),
                "`id`",
            ),
            (
                json!({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "data": 1, "data_base64": "AA=="}),
                "both",
            ),
            (
                json!({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "Bad-Name": "x"}),
                "attribute name",
            ),
            (
                json!({"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "x": "a\nb"}),
                "control character",
            ),
            (json!([1]), "not a JSON object"),
        ] {
            let e = unwrapped(event).err().unwrap();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.message.contains(why), "{}", e.message);
        }
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(BATCH));
        assert_eq!(
            mode(&h).err().unwrap().status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
    }

    #[test]
    fn an_answer_with_ce_headers_is_wrapped_into_one_event() {
        let h = |n: &'static str, v: &'static str| {
            (HeaderName::from_static(n), HeaderValue::from_static(v))
        };
        let (body, headers) = wrap(
            br#"{"ok":true}"#,
            &[
                h("ce-type", "order.done"),
                h("ce-id", "9"),
                h("ce-source", "/shop"),
                h("x-other", "1"),
            ],
            Some(&HeaderValue::from_static("application/json")),
        )
        .unwrap();
        let event: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            event,
            json!({"specversion": "1.0", "type": "order.done", "id": "9", "source": "/shop",
                "datacontenttype": "application/json", "data": {"ok": true}})
        );
        assert_eq!(headers[0].0, "x-other");
        assert_eq!(headers[1].1, "application/cloudevents+json; charset=utf-8");
        let (body, _) = wrap(
            &[0xff, 0],
            &[
                h("ce-type", "bin"),
                h("content-type", "application/octet-stream"),
            ],
            None,
        )
        .unwrap();
        let event: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(event["data_base64"], "/wA=");
        assert!(
            wrap(b"x", &[h("x-a", "1")], None).is_none(),
            "no ce-* headers: left alone"
        );
    }
}
